// Token-stream batches: next-token labels, reproducibility from (seed, position) alone, uniform
// coverage of the windows, uint16/uint32 little-endian files, and every malformed file and option
// the loader rejects.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "hp/train/data.h"

namespace fs = std::filesystem;
using namespace hp;
using namespace hp::train;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("hp_train_data_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// Writes ids little-endian with `bytes` per token.
fs::path write_tokens(const fs::path& p, const std::vector<std::uint32_t>& ids, int bytes) {
  std::string s;
  for (std::uint32_t id : ids)
    for (int b = 0; b < bytes; ++b) s.push_back(static_cast<char>((id >> (8 * b)) & 0xff));
  std::ofstream(p, std::ios::binary) << s;
  return p;
}

std::vector<std::int64_t> ids(const exec::HostTensor& t) {
  const auto* p = t.as<std::int64_t>();
  return std::vector<std::int64_t>(p, p + t.numel());
}

}  // namespace

TEST_CASE("token batches are windows with next-token labels, fixed by seed and position",
          "[train][data]") {
  fs::path d = temp_dir("batches");
  std::vector<std::uint32_t> v(1000);
  for (std::uint32_t i = 0; i < v.size(); ++i) v[i] = i;  // token i at position i: starts visible
  auto s = TokenStream::open(write_tokens(d / "t.bin", v, 2), 2, 16);
  REQUIRE(s.ok());
  CHECK(s->tokens() == 1000);
  auto a = token_batch(*s, 4, 16, 42, 7, 1000, "idx", "labels");
  REQUIRE(a.ok());
  REQUIRE(a->size() == 2);
  CHECK((*a)[0].name == "idx");
  CHECK((*a)[1].name == "labels");
  CHECK((*a)[0].dims == std::vector<std::int64_t>{4, 16});
  CHECK((*a)[1].dims == std::vector<std::int64_t>{4, 16});
  const auto x = ids((*a)[0]), y = ids((*a)[1]);
  for (int b = 0; b < 4; ++b) {
    const std::int64_t start = x[static_cast<std::size_t>(b * 16)];
    CHECK(start + 16 < 1000);  // the last label is inside the file
    for (int j = 0; j < 16; ++j) {
      CHECK(x[static_cast<std::size_t>(b * 16 + j)] == start + j);
      CHECK(y[static_cast<std::size_t>(b * 16 + j)] == start + j + 1);
    }
  }
  // Same (seed, position): the same batch, also from a second mapping of the file.
  auto s2 = TokenStream::open(d / "t.bin", 2, 16);
  REQUIRE(s2.ok());
  auto again = token_batch(*s2, 4, 16, 42, 7, 1000, "idx", "labels");
  REQUIRE(again.ok());
  CHECK(ids((*again)[0]) == x);
  CHECK(ids((*again)[1]) == y);
  // Another position or seed: another batch.
  CHECK(ids((*token_batch(*s, 4, 16, 42, 8, 1000, "idx", "labels"))[0]) != x);
  CHECK(ids((*token_batch(*s, 4, 16, 43, 7, 1000, "idx", "labels"))[0]) != x);
  // The starts are pinned (computed independently from data.cpp's description of splitmix64): a
  // change of generator would silently change the data every existing run resumes with.
  CHECK(std::vector<std::int64_t>{x[0], x[16], x[32], x[48]} ==
        std::vector<std::int64_t>{207, 434, 626, 325});
  fs::remove_all(d);
}

TEST_CASE("window starts cover the file uniformly", "[train][data]") {
  fs::path d = temp_dir("uniform");
  std::vector<std::uint32_t> v(20);
  for (std::uint32_t i = 0; i < v.size(); ++i) v[i] = i;
  auto s = TokenStream::open(write_tokens(d / "t.bin", v, 4), 4, 4);
  REQUIRE(s.ok());
  // 16 possible starts (0..15, the label of start 15 + 3 is token 19); 16000 draws.
  std::vector<int> count(16, 0);
  for (std::int64_t pos = 0; pos < 1000; ++pos) {
    auto b = token_batch(*s, 16, 4, 5, pos, 0, "x", "y");
    REQUIRE(b.ok());
    for (int k = 0; k < 16; ++k) {
      const std::int64_t start = (*b)[0].as<std::int64_t>()[k * 4];
      REQUIRE(start >= 0);
      REQUIRE(start < 16);
      ++count[static_cast<std::size_t>(start)];
    }
  }
  // Expected 1000 each; a binomial standard deviation is ~31, so 850..1150 fails only for a biased
  // or broken generator.
  for (int c : count) {
    CHECK(c > 850);
    CHECK(c < 1150);
  }
  fs::remove_all(d);
}

TEST_CASE("uint32 tokens are read little-endian, and ids are checked against the vocabulary",
          "[train][data]") {
  fs::path d = temp_dir("u32");
  auto s = TokenStream::open(write_tokens(d / "t.bin", {70000, 1, 0x01020304, 5}, 4), 4, 3);
  REQUIRE(s.ok());
  CHECK(s->at(0) == 70000);
  CHECK(s->at(2) == 0x01020304);
  auto b = token_batch(*s, 1, 3, 0, 0, 0, "x", "y");  // one possible window
  REQUIRE(b.ok());
  CHECK(ids((*b)[0]) == std::vector<std::int64_t>{70000, 1, 0x01020304});
  CHECK(ids((*b)[1]) == std::vector<std::int64_t>{1, 0x01020304, 5});
  auto bad = token_batch(*s, 1, 3, 0, 0, 50257, "x", "y");
  REQUIRE(!bad.ok());
  CHECK(bad.error().code == Errc::bad_input);
  CHECK(bad.error().message() ==
        "token 70000 at position 0 is not below the vocabulary size 50257");
  // uint16: 0x0201 from bytes 01 02.
  auto s16 = TokenStream::open(write_tokens(d / "t16.bin", {0x0201, 7}, 2), 2, 1);
  REQUIRE(s16.ok());
  CHECK(s16->at(0) == 0x0201);
  CHECK(s16->at(1) == 7);
  fs::remove_all(d);
}

TEST_CASE("malformed token files and options are bad input naming the file", "[train][data]") {
  fs::path d = temp_dir("bad");
  auto expect_bad = [&](const fs::path& p, int bytes, std::int64_t seq, const std::string& needle) {
    auto s = TokenStream::open(p, bytes, seq);
    REQUIRE(!s.ok());
    INFO(s.error().str());
    CHECK(s.error().code == Errc::bad_input);
    CHECK(s.error().where() == p.string());
    CHECK(s.error().message().find(needle) != std::string::npos);
  };
  expect_bad(d / "missing.bin", 2, 4, "cannot open");
  expect_bad(d, 2, 4, "not a regular file");
  std::ofstream(d / "empty.bin", std::ios::binary).flush();
  expect_bad(d / "empty.bin", 2, 4, "empty");
  std::ofstream(d / "odd.bin", std::ios::binary) << "abcde";
  expect_bad(d / "odd.bin", 2, 1, "5 bytes, not a whole number of 2-byte tokens");
  expect_bad(d / "odd.bin", 4, 1, "not a whole number of 4-byte tokens");
  write_tokens(d / "short.bin", {1, 2, 3, 4}, 2);
  expect_bad(d / "short.bin", 2, 4, "4 tokens, too few for one sequence of 4");
  expect_bad(d / "short.bin", 3, 1, "token size 3");
  expect_bad(d / "short.bin", 2, 0, "not positive");

  auto s = TokenStream::open(d / "short.bin", 2, 3);
  REQUIRE(s.ok());
  CHECK(!token_batch(*s, 0, 3, 0, 0, 0, "x", "y").ok());
  CHECK(!token_batch(*s, 1, 3, 0, -1, 0, "x", "y").ok());
  auto longer = token_batch(*s, 1, 4, 0, 0, 0, "x", "y");  // seq longer than the stream allows
  REQUIRE(!longer.ok());
  CHECK(longer.error().message().find("too few") != std::string::npos);
  fs::remove_all(d);
}
