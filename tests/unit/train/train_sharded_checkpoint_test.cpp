// Sharded checkpoints (libs/train/src/sharded_checkpoint.cpp): run lists, two "ranks" writing
// column and row blocks of a matrix and ZeRO-style flat shards of them, read back at other layouts
// (whole, the other split, a flat range), and every way a damaged checkpoint is refused: a
// flipped byte, a truncated or missing rank file, a missing slice, a malformed list or state, a
// whole shape that differs. The previous checkpoint survives a rank that fails to write.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <filesystem>
#include <fstream>

#include "hp/core/fs.h"
#include "hp/plugin/hp_plugin.h"
#include "hp/train/sharded_checkpoint.h"

namespace fs = std::filesystem;
using namespace hp;
using train::Extent;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("hp_sharded_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// The values v[i] = i of a tensor's elements at `runs`, as one rank holds them.
exec::HostTensor values(const std::vector<Extent>& runs, float scale = 1) {
  exec::HostTensor t;
  t.dtype = HP_F32;
  std::int64_t n = 0;
  for (const auto& r : runs) n += r.count;
  t.dims = {n};
  t.data.resize(static_cast<std::size_t>(n) * sizeof(float));
  std::int64_t k = 0;
  for (const auto& r : runs)
    for (std::int64_t i = 0; i < r.count; ++i) t.as<float>()[k++] = scale * float(r.begin + i);
  return t;
}

/// Rows [r0, r1) x columns [c0, c1) of a rows x cols matrix, as runs.
std::vector<Extent> block(std::int64_t cols, std::int64_t r0, std::int64_t r1, std::int64_t c0,
                          std::int64_t c1) {
  std::vector<Extent> out;
  for (std::int64_t r = r0; r < r1; ++r) out.push_back({r * cols + c0, c1 - c0});
  return train::sub_runs(out, 0, (r1 - r0) * (c1 - c0));  // merged where contiguous
}

/// Two ranks: a 4 x 6 weight split by columns, its exp_avg split as ZeRO flat shards of those
/// column blocks (rank 0 holds the first 5 elements of its block), and a bias (with its exp_avg)
/// rank 0 holds whole.
void write_two_ranks(const fs::path& dir, std::vector<exec::HostTensor>& keep) {
  REQUIRE(train::begin_sharded(dir, false));
  keep.clear();
  keep.reserve(10);  // the shards point into it
  const std::vector<std::int64_t> shape = {4, 6};
  for (int rank = 0; rank < 2; ++rank) {
    const auto cols = block(6, 0, 4, rank * 3, rank * 3 + 3);
    std::vector<train::Shard> shards;
    keep.push_back(values(cols));
    shards.push_back({"w", "param", shape, cols, &keep.back()});
    const auto zero = rank == 0 ? train::sub_runs(cols, 0, 5) : train::sub_runs(cols, 5, 7);
    const auto other = rank == 0 ? train::sub_runs(block(6, 0, 4, 3, 6), 0, 5)
                                 : train::sub_runs(block(6, 0, 4, 0, 3), 5, 7);
    keep.push_back(values(zero, 0.5f));
    shards.push_back({"w", "exp_avg", shape, zero, &keep.back()});
    keep.push_back(values(other, 0.5f));
    shards.push_back({"w", "exp_avg", shape, other, &keep.back()});
    if (rank == 0) {
      keep.push_back(values({{0, 6}}));
      shards.push_back({"b", "param", {6}, {{0, 6}}, &keep.back()});
      keep.push_back(values({{0, 6}}, 0.5f));
      shards.push_back({"b", "exp_avg", {6}, {{0, 6}}, &keep.back()});
    }
    REQUIRE(train::write_shards(dir, rank, shards));
  }
  train::ShardedState s;
  s.step = 7;
  s.optimizer_step = 7;
  s.data_position = 9;
  s.seed = 3;
  s.optimizer = "adamw";
  s.ranks = 2;
  REQUIRE(train::commit_sharded(dir, s));
}

void check_values(const exec::HostTensor& t, const std::vector<Extent>& runs, float scale = 1) {
  const auto want = values(runs, scale);
  REQUIRE(t.numel() == want.numel());
  for (std::int64_t i = 0; i < t.numel(); ++i) CHECK(t.as<float>()[i] == want.as<float>()[i]);
}

}  // namespace

TEST_CASE("sub_runs takes a flat range of a run list, merging what touches", "[train]") {
  const std::vector<Extent> runs = {{0, 3}, {6, 3}, {12, 3}};
  CHECK(train::sub_runs(runs, 2, 3) == std::vector<Extent>{{2, 1}, {6, 2}});
  CHECK(train::sub_runs(runs, 0, 9) == runs);
  CHECK(train::sub_runs({{0, 3}, {3, 3}}, 1, 4) == std::vector<Extent>{{1, 4}});
  CHECK(train::sub_runs(runs, 9, 0).empty());
}

TEST_CASE("a sharded checkpoint reads back at any layout", "[train]") {
  const fs::path dir = temp_dir("layouts") / "ckpt";
  std::vector<exec::HostTensor> keep;
  write_two_ranks(dir, keep);
  REQUIRE(train::is_sharded_checkpoint(dir));
  auto ck = train::ShardedCheckpoint::open(dir);
  INFO((ck ? std::string() : ck.error().str()));
  REQUIRE(ck);
  CHECK(ck->state().step == 7);
  CHECK(ck->state().data_position == 9);
  CHECK(ck->state().ranks == 2);
  CHECK(ck->has("w", "exp_avg"));
  CHECK_FALSE(ck->has("w", "exp_avg_sq"));
  const std::vector<std::int64_t> shape = {4, 6};
  SECTION("whole, as one rank reads it") {
    auto w = ck->read("w", "param", shape, {{0, 24}}, shape);
    REQUIRE(w);
    CHECK(w->dims == shape);
    check_values(*w, {{0, 24}});
    auto m = ck->read("w", "exp_avg", shape, {{0, 24}}, shape);
    REQUIRE(m);
    check_values(*m, {{0, 24}}, 0.5f);
  }
  SECTION("split the other way (rows), and a flat shard of a row block") {
    const auto rows = block(6, 2, 4, 0, 6);
    auto w = ck->read("w", "param", shape, rows, {2, 6});
    REQUIRE(w);
    check_values(*w, rows);
    const auto flat = train::sub_runs(rows, 3, 4);
    auto m = ck->read("w", "exp_avg", shape, flat, {4});
    REQUIRE(m);
    check_values(*m, flat, 0.5f);
  }
  SECTION("every tensor whole, as a one-rank checkpoint (and load_checkpoint) holds them") {
    for (auto c : {ck->whole(), train::load_checkpoint(dir)}) {
      INFO((c ? std::string() : c.error().str()));
      REQUIRE(c);
      CHECK(c->step == 7);
      CHECK(c->data_position == 9);
      CHECK(c->optimizer == "adamw");
      REQUIRE(c->params.size() == 2);
      CHECK(c->params[0].name == "w");
      CHECK(c->params[0].dims == shape);
      check_values(c->params[0], {{0, 24}});
      CHECK(c->params[1].name == "b");
      REQUIRE(c->state.exp_avg.size() == 2);
      check_values(c->state.exp_avg[0], {{0, 24}}, 0.5f);
      CHECK(c->state.exp_avg_sq.empty());
    }
  }
  SECTION("a shape that differs is refused with the tensor named") {
    auto w = ck->read("w", "param", {6, 4}, {{0, 24}}, {6, 4});
    REQUIRE_FALSE(w);
    CHECK(w.error().message().find("tensor 'w'") != std::string::npos);
    CHECK_FALSE(ck->read("nothing", "param", {1}, {{0, 1}}, {1}));
  }
  fs::remove_all(dir.parent_path());
}

TEST_CASE("a damaged sharded checkpoint is refused with the tensor named", "[train]") {
  const fs::path dir = temp_dir("damaged") / "ckpt";
  std::vector<exec::HostTensor> keep;
  const std::vector<std::int64_t> shape = {4, 6};
  auto reopen = [&] { return train::ShardedCheckpoint::open(dir); };
  SECTION("a flipped byte") {
    write_two_ranks(dir, keep);
    {
      std::fstream f(dir / "rank-00001.bin", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(5);
      f.put('\x7f');
    }
    auto ck = reopen();
    REQUIRE(ck);
    auto w = ck->read("w", "param", shape, {{0, 24}}, shape);
    REQUIRE_FALSE(w);
    CHECK(w.error().code == Errc::bad_input);
    CHECK(w.error().message().find("tensor 'w' (param)") != std::string::npos);
    CHECK(w.error().message().find("corrupt") != std::string::npos);
    // Rank 0's pieces are intact: a layout that reads only them still resumes.
    CHECK(ck->read("w", "param", shape, block(6, 0, 4, 0, 3), {4, 3}));
  }
  SECTION("a truncated rank file") {
    write_two_ranks(dir, keep);
    fs::resize_file(dir / "rank-00000.bin", 10);
    auto ck = reopen();
    REQUIRE(ck);
    auto w = ck->read("w", "param", shape, {{0, 24}}, shape);
    REQUIRE_FALSE(w);
    CHECK(w.error().message().find("truncated") != std::string::npos);
  }
  SECTION("a rank that never wrote: its slice is missing") {
    write_two_ranks(dir, keep);
    auto state = read_file(dir / "state.json");
    REQUIRE(state);
    std::string s = *state;
    s.replace(s.find("\"ranks\": 2"), 10, "\"ranks\": 1");
    REQUIRE(write_file_atomic(dir / "state.json", s));
    auto ck = reopen();
    REQUIRE(ck);
    auto w = ck->read("w", "param", shape, {{0, 24}}, shape);
    REQUIRE_FALSE(w);
    CHECK(w.error().message().find("12 of the 24 elements") != std::string::npos);
    CHECK(w.error().message().find("incomplete") != std::string::npos);
  }
  SECTION("a rank's list missing or malformed, a malformed state") {
    write_two_ranks(dir, keep);
    fs::remove(dir / "rank-00001.json");
    auto a = reopen();
    REQUIRE_FALSE(a);
    CHECK(a.error().where().find("rank-00001.json") != std::string::npos);
    REQUIRE(write_file_atomic(dir / "rank-00001.json", "{\"pieces\": [{\"tensor\": 1}]}"));
    CHECK_FALSE(reopen());
    REQUIRE(write_file_atomic(dir / "state.json", "{\"format\": \"hp-sharded-checkpoint\"}"));
    auto c = reopen();
    REQUIRE_FALSE(c);
    CHECK(c.error().where().find("state.json") != std::string::npos);
  }
  fs::remove_all(dir.parent_path());
}

TEST_CASE("a failed write leaves the previous sharded checkpoint in place", "[train]") {
  const fs::path dir = temp_dir("abandon") / "ckpt";
  std::vector<exec::HostTensor> keep;
  write_two_ranks(dir, keep);
  REQUIRE(train::begin_sharded(dir, false));
  // A piece whose data disagrees with its runs: the rank's write fails, the lead abandons.
  exec::HostTensor short_one = values({{0, 2}});
  auto st = train::write_shards(dir, 0, {{"w", "param", {4, 6}, {{0, 24}}, &short_one}});
  REQUIRE_FALSE(st);
  train::abandon_sharded(dir);
  CHECK_FALSE(fs::exists(train::sharded_temp_dir(dir)));
  auto ck = train::ShardedCheckpoint::open(dir);
  REQUIRE(ck);
  CHECK(ck->state().step == 7);
  CHECK(ck->read("w", "param", {4, 6}, {{0, 24}}, {4, 6}));
  fs::remove_all(dir.parent_path());
}
