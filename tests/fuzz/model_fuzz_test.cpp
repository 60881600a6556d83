// The mutation fuzzer of the ONNX loader and `hp plan --summary`, bounded for CTest: seeded
// mutations of every test model (tests/fuzz/model_mutator.cpp) each must load and summarise to an
// error value or a summary, in-process, without a crash or an escaping exception. The budget and
// seed come from HP_FUZZ_SECONDS (default 20) and HP_FUZZ_SEED (default 1), which
// tests/bench/fuzz/fuzz_model.sh raises for an hour-long run; the case being run is the scratch
// file, so a crash leaves its input behind.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "model_mutator.h"

namespace {

long env_long(const char* name, long dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : dflt;
}

}  // namespace

TEST_CASE("fuzz: mutated models load and summarise to a value, never a crash", "[fuzz]") {
  namespace fs = std::filesystem;
  const auto seeds = hp::fuzz::seed_models(HP_SOURCE_DIR);
  REQUIRE(seeds.size() >= 5);
  const long seconds = env_long("HP_FUZZ_SECONDS", 20);
  const auto seed = static_cast<std::uint64_t>(env_long("HP_FUZZ_SEED", 1));
  const char* dir = std::getenv("HP_FUZZ_DIR");
  const fs::path scratch = fs::path(dir && *dir ? dir : fs::temp_directory_path().string()) /
                           ("hp-fuzz-model-" + std::to_string(seed) + ".onnx");
  std::mt19937_64 rng(seed);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  long cases = 0, summarised = 0;
  while (std::chrono::steady_clock::now() < until) {
    const std::string& base = seeds[cases % static_cast<long>(seeds.size())];
    const std::string bytes = hp::fuzz::mutate_model(base, rng);
    int r = -1;
    REQUIRE_NOTHROW(r = hp::fuzz::run_model_case(bytes, scratch, rng));
    summarised += r;
    ++cases;
  }
  std::error_code ec;
  fs::remove(scratch, ec);
  std::printf("fuzz model: seed %llu, %ld cases in %ld s, %ld summarised, %ld refused, 0 crashes\n",
              static_cast<unsigned long long>(seed), cases, seconds, summarised,
              cases - summarised);
  // The mutations must reach past the parser: some cases succeed, some are refused.
  CHECK(cases > 0);
  if (cases >= 50) {
    CHECK(summarised > 0);
    CHECK(summarised < cases);
  }
}
