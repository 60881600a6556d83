#include <catch2/catch.hpp>

#include <string>

#include <filesystem>
#include <fstream>
#include <set>

#include "hp/core/exit_code.h"
#include "hp/core/expected.h"
#include "hp/core/fs.h"
#include "hp/core/units.h"

namespace fs = std::filesystem;

TEST_CASE("core: every error code maps to a distinct documented exit code", "[core]") {
  using hp::Errc;
  std::set<int> seen;
  for (Errc c : {Errc::usage, Errc::bad_input, Errc::infeasible, Errc::runtime, Errc::mismatch,
                 Errc::unavailable, Errc::not_implemented, Errc::internal})
    seen.insert(static_cast<int>(hp::exit_code_for(c)));
  CHECK(seen.size() == 8);
  CHECK(seen.count(0) == 0);
  CHECK(static_cast<int>(hp::exit_code_for(Errc::mismatch)) == 6);
}

TEST_CASE("core: collect_errors keeps every diagnostic in order", "[core]") {
  auto e =
      hp::collect_errors(hp::Errc::bad_input, {{"a:1:1", "first", ""}, {"a:2:1", "second", "h"}});
  REQUIRE(e.all().size() == 2);
  CHECK(e.str() == "a:1:1: first");
  CHECK(e.more[0].hint == "h");
}

namespace {
hp::Expected<int> half(int x) {
  if (x % 2) return hp::Error(hp::Errc::bad_input, "odd");
  return x / 2;
}
hp::Expected<int> quarter(int x) {
  auto h = half(x);
  HP_TRY(h);
  return half(*h);
}
hp::Expected<int> eighth(int x) {
  HP_ASSIGN_OR_RETURN(int q, quarter(x));  // declares q
  int e = -1;
  HP_ASSIGN_OR_RETURN(e, half(q));  // assigns an existing variable; two uses on one line apart
  return e;
}
hp::Expected<std::string> moved_out(bool fail) {
  auto make = [&]() -> hp::Expected<std::string> {
    if (fail) return hp::Error(hp::Errc::usage, "no string");
    return std::string(64, 'x');
  };
  HP_ASSIGN_OR_RETURN(auto s, make());
  return s;
}
}  // namespace

TEST_CASE("core: HP_ASSIGN_OR_RETURN declares or assigns the value, or returns the error",
          "[core]") {
  CHECK(*eighth(16) == 2);
  CHECK(eighth(12).error().message() == "odd");  // 12 -> 3 is odd at the third halving
  CHECK(eighth(6).error().message() == "odd");   // 6 -> 3 fails inside quarter
  CHECK(moved_out(false)->size() == 64);
  CHECK(moved_out(true).error().code == hp::Errc::usage);
}

TEST_CASE("core: HP_TRY propagates the first error", "[core]") {
  CHECK(*quarter(8) == 2);
  CHECK_FALSE(quarter(6).ok());
  CHECK(quarter(6).error().message() == "odd");
}

TEST_CASE("core: byte parsing accepts units and rejects junk", "[core]") {
  CHECK(*hp::parse_bytes("64GiB") == 64.0 * (1ull << 30));
  CHECK(*hp::parse_bytes("80 GB") == 80e9);
  CHECK(*hp::parse_bytes("1.5e9") == 1.5e9);
  CHECK(*hp::parse_bytes("1e3 KiB") == 1e3 * 1024);
  CHECK_FALSE(hp::parse_bytes("").has_value());
  CHECK_FALSE(hp::parse_bytes("GB").has_value());
  CHECK_FALSE(hp::parse_bytes("12 parsecs").has_value());
  CHECK_FALSE(hp::parse_bytes("-4GB").has_value());
  CHECK(hp::format_bytes(1536) == "1.50 KiB");
  CHECK(hp::format_seconds(0.0021) == "2.10 ms");
}

TEST_CASE("core: axis ticks step by 1, 2 or 5 x 10^k with labels in the step's unit", "[core]") {
  CHECK(hp::nice_step(0.3) == Approx(0.5));
  CHECK(hp::nice_step(1.0) == Approx(1.0));
  CHECK(hp::nice_step(1.2) == Approx(2.0));
  CHECK(hp::nice_step(700) == Approx(1000));
  CHECK(hp::format_tick_seconds(1.5, 0.5) == "1.5 s");
  CHECK(hp::format_tick_seconds(0.02, 0.01) == "20 ms");
  CHECK(hp::format_tick_seconds(0.00025, 0.00005) == "250 us");
}

TEST_CASE("core: atomic write replaces the file and leaves no temp behind", "[core]") {
  fs::path dir = fs::temp_directory_path() / "hp_core_test_atomic";
  fs::remove_all(dir);
  fs::create_directories(dir);
  REQUIRE(hp::write_file_atomic(dir / "x.txt", "one").ok());
  REQUIRE(hp::write_file_atomic(dir / "x.txt", "two").ok());
  CHECK(*hp::read_file(dir / "x.txt") == "two");
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
  auto bad = hp::write_file_atomic(dir / "missing" / "x.txt", "z");
  CHECK_FALSE(bad.ok());
  CHECK(bad.error().code == hp::Errc::bad_input);
  CHECK_FALSE(hp::read_file(dir / "nope").ok());
  fs::remove_all(dir);
}

TEST_CASE("core: parse_seconds is the one duration rule (recipes and --latency-budget)", "[core]") {
  const std::pair<const char*, double> good[] = {{"2us", 2e-6},
                                                 {"2 us", 2e-6},
                                                 {" 1.5 ms ", 1.5e-3},
                                                 {"500ns", 5e-7},
                                                 {"0", 0},
                                                 {"0s", 0},
                                                 {"0ns", 0},
                                                 {"3e-6", 3e-6},
                                                 {"1e3ns", 1e-6},
                                                 {"1.5E2 ms", 0.15},
                                                 {".5s", 0.5},
                                                 {"+50ms", 0.05},
                                                 {"50", 50},
                                                 {"0.2 s", 0.2},
                                                 {"800us", 8e-4},
                                                 {"2\xC2\xB5s", 2e-6},
                                                 {"2\xCE\xBCs", 2e-6},
                                                 {"7\tms", 7e-3}};
  for (auto [text, want] : good) {
    INFO("'" << text << "'");
    auto v = hp::parse_seconds(text);
    REQUIRE(v.has_value());
    CHECK(*v == Approx(want).margin(1e-18));
  }
  for (const char* bad :
       {"",      " ",      "s",     "ms",      "-1us", "-0",    "+-1s", "--1s",   "1 5ms",
        "5 min", "5MS",    "5 S",   "5sec",    "inf",  "nan",   "infs", "1e400s", "0x10",
        "1e",    "1.2.3s", "1,5ms", "five ms", "1s2",  "1 s s", "ms5",  "+",      "."}) {
    INFO("'" << bad << "'");
    CHECK_FALSE(hp::parse_seconds(bad).has_value());
  }
}
