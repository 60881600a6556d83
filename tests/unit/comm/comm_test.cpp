// The comm layer's tensor logic on the in-process transport: every hp-domain op (packed and
// unpacked axes), non-ascending group orders, f32 and i64, the zero-copy run_into form and its plan
// cache, attribute errors, and that a failing rank makes its peers fail instead of hanging.
// Expected values are computed here from each rank's input formula.
#include <fmt/core.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <thread>

#include "hp/comm/comm.h"

using namespace hp::exec;
using namespace hp::comm;
using hp::Status;

namespace {

// Rank r's input: a [rows, cols] f32 tensor with x[i][j] = 100 r + 10 i + j.
HostTensor input(int r, std::int64_t rows, std::int64_t cols) {
  HostTensor t;
  t.dtype = HP_F32;
  t.dims = {rows, cols};
  t.data.resize(static_cast<std::size_t>(rows * cols * 4));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      t.as<float>()[i * cols + j] = static_cast<float>(100 * r + 10 * i + j);
  return t;
}

float at(const HostTensor& t, std::int64_t i, std::int64_t j) {
  return t.as<float>()[i * t.dims[1] + j];
}
float x_at(int r, std::int64_t i, std::int64_t j) {
  return static_cast<float>(100 * r + 10 * i + j);
}

CommNode node(std::string op, std::vector<std::pair<std::string, std::string>> attrs) {
  return CommNode{"n", std::move(op), {"x"}, {"y"}, std::move(attrs)};
}

// Runs `n` on the ranks in `members` (out of `ranks`) with input(r, rows, cols); returns each
// output.
std::vector<HostTensor> run_on(int ranks, const std::vector<int>& members, const CommNode& n,
                               std::int64_t rows, std::int64_t cols, Status* failure = nullptr) {
  std::vector<HostTensor> outs(static_cast<std::size_t>(ranks));
  Status s = run_in_process(
      ranks,
      [&](int r, Transport& t) -> Status {
        if (std::find(members.begin(), members.end(), r) == members.end()) return {};
        TransportCommOps ops(t);
        HostTensor x = input(r, rows, cols);
        std::vector<HostTensor> y(1);
        HP_TRY(ops.run(n, {&x}, y));
        outs[static_cast<std::size_t>(r)] = std::move(y[0]);
        return {};
      },
      10);
  if (failure)
    *failure = s;
  else
    REQUIRE(s.ok());
  return outs;
}

}  // namespace

TEST_CASE("comm: AllReduce sum, max, avg and prod over a non-ascending sub-group", "[comm]") {
  for (std::string op : {"sum", "max", "avg", "prod"}) {
    auto outs = run_on(4, {3, 1}, node("AllReduce", {{"group", "3,1"}, {"op", op}}), 2, 3);
    for (int r : {1, 3}) {
      const auto& y = outs[static_cast<std::size_t>(r)];
      REQUIRE(y.dims == std::vector<std::int64_t>{2, 3});
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) {
          const float a = x_at(1, i, j), b = x_at(3, i, j);
          const float want = op == "sum"   ? a + b
                             : op == "max" ? std::max(a, b)
                             : op == "avg" ? (a + b) / 2
                                           : a * b;
          CHECK(at(y, i, j) == Approx(want));
        }
    }
  }
}

TEST_CASE("comm: AllReduce of i64 tensors", "[comm]") {
  std::vector<std::int64_t> got;
  Status s = run_in_process(3, [&](int r, Transport& t) -> Status {
    TransportCommOps ops(t);
    HostTensor x;
    x.dtype = HP_I64;
    x.dims = {2};
    x.data.resize(16);
    x.as<std::int64_t>()[0] = (std::int64_t{1} << 40) + r;
    x.as<std::int64_t>()[1] = -r;
    std::vector<HostTensor> y(1);
    HP_TRY(ops.run(node("AllReduce", {{"group", "0,1,2"}}), {&x}, y));
    if (r == 2) got.assign(y[0].as<std::int64_t>(), y[0].as<std::int64_t>() + 2);
    return {};
  });
  REQUIRE(s.ok());
  CHECK(got == std::vector<std::int64_t>{3 * (std::int64_t{1} << 40) + 3, -3});
}

TEST_CASE("comm: AllGather concatenates in group order along the axis", "[comm]") {
  for (int axis : {0, 1, -1}) {
    auto outs =
        run_on(3, {0, 1, 2},
               node("AllGather", {{"group", "2,0,1"}, {"axis", std::to_string(axis)}}), 2, 2);
    const std::vector<int> order{2, 0, 1};
    for (int r = 0; r < 3; ++r) {
      const auto& y = outs[static_cast<std::size_t>(r)];
      if (axis == 0) {
        REQUIRE(y.dims == std::vector<std::int64_t>{6, 2});
        for (int k = 0; k < 3; ++k)
          for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j) CHECK(at(y, 2 * k + i, j) == x_at(order[k], i, j));
      } else {
        REQUIRE(y.dims == std::vector<std::int64_t>{2, 6});
        for (int k = 0; k < 3; ++k)
          for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j) CHECK(at(y, i, 2 * k + j) == x_at(order[k], i, j));
      }
    }
  }
}

TEST_CASE("comm: ReduceScatter gives member i the reduced chunk i", "[comm]") {
  auto outs =
      run_on(4, {0, 1, 2, 3},
             node("ReduceScatter", {{"group", "1,3,0,2"}, {"axis", "1"}, {"op", "sum"}}), 2, 8);
  const std::vector<int> order{1, 3, 0, 2};
  for (int pos = 0; pos < 4; ++pos) {
    const auto& y = outs[static_cast<std::size_t>(order[static_cast<std::size_t>(pos)])];
    REQUIRE(y.dims == std::vector<std::int64_t>{2, 2});
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        float want = 0;
        for (int r = 0; r < 4; ++r) want += x_at(r, i, 2 * pos + j);
        CHECK(at(y, i, j) == want);
      }
  }
}

TEST_CASE("comm: AllToAll splits, exchanges and concatenates in group order", "[comm]") {
  // x is [4, 2] on each of 2 members; split rows into 2 chunks, concatenate along columns.
  auto outs =
      run_on(3, {0, 2},
             node("AllToAll", {{"group", "2,0"}, {"split_axis", "0"}, {"concat_axis", "1"}}), 4, 2);
  const std::vector<int> order{2, 0};
  for (int pos = 0; pos < 2; ++pos) {
    const auto& y = outs[static_cast<std::size_t>(order[static_cast<std::size_t>(pos)])];
    REQUIRE(y.dims == std::vector<std::int64_t>{2, 4});
    for (int k = 0; k < 2; ++k)  // block k came from member k: its row chunk `pos`
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
          CHECK(at(y, i, 2 * k + j) == x_at(order[static_cast<std::size_t>(k)], 2 * pos + i, j));
  }
}

TEST_CASE("comm: ReduceScatter and AllToAll along the outermost axis send the tensor as it lies",
          "[comm]") {
  // Axis 0 needs no packing (the chunks are contiguous already); the results must equal the packed
  // path's.
  auto rs = run_on(2, {0, 1},
                   node("ReduceScatter", {{"group", "1,0"}, {"axis", "0"}, {"op", "avg"}}), 4, 3);
  for (int pos = 0; pos < 2; ++pos) {
    const auto& y = rs[static_cast<std::size_t>(pos == 0 ? 1 : 0)];
    REQUIRE(y.dims == std::vector<std::int64_t>{2, 3});
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        CHECK(at(y, i, j) == (x_at(0, 2 * pos + i, j) + x_at(1, 2 * pos + i, j)) / 2);
  }
  // Split columns (packed), concatenate rows (received blocks are the result).
  auto a2a =
      run_on(2, {0, 1},
             node("AllToAll", {{"group", "0,1"}, {"split_axis", "1"}, {"concat_axis", "0"}}), 2, 4);
  for (int r = 0; r < 2; ++r) {
    const auto& y = a2a[static_cast<std::size_t>(r)];
    REQUIRE(y.dims == std::vector<std::int64_t>{4, 2});
    for (int k = 0; k < 2; ++k)  // rows 2k..2k+1 came from member k: its column chunk r
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) CHECK(at(y, 2 * k + i, j) == x_at(k, i, 2 * r + j));
  }
}

TEST_CASE(
    "comm: run_into reads in place, writes into the caller's memory, and reparses a changed node",
    "[comm]") {
  std::vector<std::vector<float>> got(2);
  Status s = run_in_process(2, [&](int r, Transport& t) -> Status {
    TransportCommOps ops(t);
    HostTensor x = input(r, 1, 3);
    const std::vector<CommTensor> in{CommTensor{x.dtype, x.dims, x.data.data(), x.data.size()}};
    std::vector<float> out(3, -1.0f);
    int calls = 0;
    const CommAlloc alloc = [&](std::size_t k, int dtype, std::span<const std::int64_t> dims,
                                int reuse) -> hp::Expected<void*> {
      CHECK(reuse == -1);  // nothing donated
      ++calls;
      CHECK(k == 0);
      CHECK(dtype == HP_F32);
      CHECK(std::vector<std::int64_t>(dims.begin(), dims.end()) == std::vector<std::int64_t>{1, 3});
      return static_cast<void*>(out.data());
    };
    CommNode n = node("AllReduce", {{"group", "0,1"}, {"op", "sum"}});
    HP_TRY(ops.run_into(n, in, alloc));
    got[static_cast<std::size_t>(r)].push_back(out[2]);
    // Same node object, other reduction: the cached plan must not be reused.
    n.attrs[1].second = "max";
    HP_TRY(ops.run_into(n, in, alloc));
    got[static_cast<std::size_t>(r)].push_back(out[2]);
    CHECK(calls == 2);
    CHECK(x.as<float>()[2] == x_at(r, 0, 2));  // the input is read, never written
    return {};
  });
  REQUIRE(s.ok());
  for (int r = 0; r < 2; ++r)
    CHECK(got[static_cast<std::size_t>(r)] ==
          std::vector<float>{x_at(0, 0, 2) + x_at(1, 0, 2), x_at(1, 0, 2)});
}

TEST_CASE("comm: CollectivePermute moves along pairs and zero-fills ranks without a source",
          "[comm]") {
  auto outs = run_on(3, {0, 1, 2}, node("CollectivePermute", {{"pairs", "0,1,1,2"}}), 1, 2);
  CHECK(at(outs[0], 0, 0) == 0);
  CHECK(at(outs[0], 0, 1) == 0);
  CHECK(at(outs[1], 0, 1) == x_at(0, 0, 1));
  CHECK(at(outs[2], 0, 1) == x_at(1, 0, 1));
}

TEST_CASE("comm: Send/Recv with micro-batch tags do not cross", "[comm]") {
  std::vector<float> got;
  Status s = run_in_process(2, [&](int r, Transport& t) -> Status {
    TransportCommOps ops(t);
    if (r == 0) {
      for (int mb : {0, 1}) {
        ops.set_micro_batch(mb);
        HostTensor x = input(mb + 5, 1, 3);
        std::vector<HostTensor> none;
        HP_TRY(
            ops.run(CommNode{"s", "Send", {"x"}, {}, {{"peer", "1"}, {"tag", "7"}}}, {&x}, none));
      }
      return {};
    }
    for (int mb : {1, 0}) {  // receive in the other order: tags keep them apart
      ops.set_micro_batch(mb);
      std::vector<HostTensor> y(1);
      HP_TRY(ops.run(CommNode{"r",
                              "Recv",
                              {},
                              {"y"},
                              {{"peer", "0"}, {"tag", "7"}, {"dtype", "1"}, {"shape", "1,3"}}},
                     {}, y));
      REQUIRE(y[0].dims == std::vector<std::int64_t>{1, 3});
      got.push_back(at(y[0], 0, 2));
    }
    return {};
  });
  REQUIRE(s.ok());
  CHECK(got == std::vector<float>{x_at(6, 0, 2), x_at(5, 0, 2)});
}

TEST_CASE("comm: two threads of each rank run collectives on different groups at once", "[comm]") {
  // As a training rank does: its reduction thread over the data-parallel column {c, c + 2} while
  // its compute thread runs the tensor-parallel row {2 q, 2 q + 1}'s collectives.
  constexpr int kRounds = 200;
  Status s = run_in_process(4, [&](int r, Transport& t) -> Status {
    const std::vector<int> row{r / 2 * 2, r / 2 * 2 + 1}, column{r % 2, r % 2 + 2};
    Status side;
    std::thread reducer([&] {
      for (int k = 0; k < kRounds && side.ok(); ++k) {
        float x[64], y[64];
        for (int i = 0; i < 64; ++i) x[i] = static_cast<float>(r * 1000 + k + i);
        side = t.allreduce(column, x, y, 64, HP_F32, ReduceOp::sum);
        const float want = static_cast<float>((r % 2) * 1000 * 2 + 2000 + 2 * (k + 5));
        if (side.ok() && y[5] != want)
          side = hp::Error(hp::Errc::internal, fmt::format("column sum {} != {}", y[5], want));
      }
    });
    Status main;
    for (int k = 0; k < kRounds && main.ok(); ++k) {
      double x[2] = {static_cast<double>(r), static_cast<double>(k)}, y[4] = {};
      main = t.allgather(row, x, y, sizeof x);
      if (main.ok() && (y[0] != row[0] || y[2] != row[1] || y[3] != k))
        main = hp::Error(hp::Errc::internal, "row gather out of order");
    }
    reducer.join();
    HP_TRY(main);
    return side;
  });
  REQUIRE(s.ok());
}

TEST_CASE("comm: two threads of each rank run collectives on one group on their own channels",
          "[comm]") {
  // As an expert-parallel rank does where ep = dp: its reduction thread all-reduces over the very
  // ranks whose all-gathers its compute thread runs. Rank 1's reducer starts late, so the two
  // threads' calls interleave differently on the two ranks: only the channels keep them apart.
  constexpr int kRounds = 100;
  Status s = run_in_process(2, [&](int r, Transport& t) -> Status {
    const std::vector<int> both{0, 1};
    Status side;
    std::thread reducer([&] {
      set_channel(1);
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (int k = 0; k < kRounds && side.ok(); ++k) {
        float x[64], y[64];
        for (int i = 0; i < 64; ++i) x[i] = static_cast<float>(r + k);
        side = t.allreduce(both, x, y, 64, HP_F32, ReduceOp::sum);
        if (side.ok() && y[7] != static_cast<float>(1 + 2 * k))
          side = hp::Error(hp::Errc::internal, fmt::format("sum {} in round {}", y[7], k));
      }
    });
    Status main;
    for (int k = 0; k < kRounds && main.ok(); ++k) {
      double x[2] = {static_cast<double>(r), static_cast<double>(k)}, y[4] = {};
      main = t.allgather(both, x, y, sizeof x);
      if (main.ok() && (y[0] != 0 || y[2] != 1 || y[3] != k))
        main = hp::Error(hp::Errc::internal, "gather out of order");
    }
    reducer.join();
    if (channel() != 0)  // the reducer's channel is its own thread's
      return hp::Error(hp::Errc::internal, "a thread's channel leaked into another's");
    HP_TRY(main);
    return side;
  });
  INFO((s ? std::string() : s.error().str()));
  REQUIRE(s.ok());
  const ScopedChannel scoped(3);
  CHECK(channel() == 3);
}

TEST_CASE("comm: malformed attributes are bad input naming the node", "[comm]") {
  Status f;
  run_on(2, {0, 1}, node("AllGather", {{"group", "0,x"}}), 2, 2, &f);
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().code == hp::Errc::bad_input);
  CHECK(f.error().where() == "node 'n' (hp.AllGather)");
  run_on(2, {0, 1}, node("ReduceScatter", {{"group", "0,1"}, {"axis", "1"}}), 2, 3, &f);
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().message().find("not divisible by the group size 2") != std::string::npos);
  run_on(2, {0, 1}, node("AllReduce", {{"group", "0,1"}, {"op", "mean"}}), 2, 3, &f);
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().message().find("unknown reduction 'mean'") != std::string::npos);
  run_on(2, {0}, node("AllReduce", {{"group", "1"}}), 2, 3, &f);
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().message().find("not in its group") != std::string::npos);
}

TEST_CASE("comm: a rank that fails makes its blocked peers fail, not hang", "[comm]") {
  Status s = run_in_process(
      3,
      [&](int r, Transport& t) -> Status {
        if (r == 1) return hp::Error(hp::Errc::runtime, "kernel exploded");
        TransportCommOps ops(t);
        HostTensor x = input(r, 1, 1);
        std::vector<HostTensor> y(1);
        return ops.run(node("AllReduce", {{"group", "0,1,2"}}), {&x}, y);
      },
      30);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message() == "rank 1: kernel exploded");
  Status d = run_in_process(
      2,
      [&](int r, Transport& t) -> Status {
        std::vector<unsigned char> b(4);
        return t.recv(1 - r, 0, b.data(), 4);  // both receive: a deadlock, ended by the timeout
      },
      0.2);
  REQUIRE_FALSE(d.ok());
  CHECK(d.error().message().find("deadlock?") != std::string::npos);
}
