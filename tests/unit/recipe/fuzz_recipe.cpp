// Mutation driver for the recipe parser and its validation (libFuzzer is not used: the toolchain
// here is gcc). Seeds: the full test recipe (fixtures.h) and any recipe files named on the command
// line. Each case is parsed (parse_recipe validates too); a recipe that passes is also checked on a
// cluster of a random size and written back, and what it writes must parse and validate again.
// Exit 0 with "cases N, crashes 0"; a crash leaves the case in --crash-file and kills the process
// (tests/bench/fuzz/fuzz_recipe.sh counts it). Usage: hp_fuzz_recipe [--seconds S] [--seed N]
// [--crash-file F] [seed.toml...]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "../../support/fuzz_mutate.h"
#include "fixtures.h"
#include "hp/recipe/recipe.h"

int main(int argc, char** argv) {
  using namespace hp::recipe;
  auto args = hp::fuzz::parse_args(argc, argv);
  hp::fuzz::install_crash_handler(args.crash_file);
  std::vector<std::string> seeds{format_recipe(hp::recipe::test::full_recipe())};
  if (!hp::fuzz::read_seeds(args.seeds, seeds)) return 2;
  std::mt19937_64 rng(args.seed);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(args.seconds);
  long cases = 0, valid = 0, rejected = 0, unstable = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (int batch = 0; batch < 64; ++batch, ++cases) {
      std::string text = hp::fuzz::mutate(seeds[rng() % seeds.size()], rng);
      hp::fuzz::remember(text);
      RecipeDocument doc = parse_recipe(text, "fuzz.toml");
      if (!doc.problems.empty()) {
        ++rejected;
        for (const auto& d : doc.problems)
          if (d.message.empty()) {
            std::fprintf(stderr, "a problem without a message at %s\n", d.where.c_str());
            return 1;
          }
        continue;
      }
      ++valid;
      const std::int64_t ranks = static_cast<std::int64_t>(rng() % 64);
      (void)validate_recipe_on_cluster(doc.recipe, doc.where, ranks, "fuzz");
      // What hp writes from a valid recipe must read back valid (hp plan -o, plan --fix).
      RecipeDocument again = parse_recipe(format_recipe(doc.recipe), "again.toml");
      if (!again.problems.empty()) {
        ++unstable;
        std::fprintf(stderr, "a valid recipe wrote an invalid one: %s\n",
                     again.problems.front().message.c_str());
      }
    }
  }
  std::printf("recipe fuzz: cases %ld (valid %ld, rejected %ld), unstable %ld, crashes 0\n", cases,
              valid, rejected, unstable);
  return unstable == 0 ? 0 : 1;
}
