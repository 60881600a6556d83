// The key tables of schema_doc.h match what the writers emit, in both directions.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "fixtures.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/presets.h"
#include "hp/recipe/schema_doc.h"

using namespace hp::recipe;

namespace {

// Keys written as "key = value" at the start of a line, plus keys inside inline tables we know of.
std::set<std::string> written_keys(const std::string& text) {
  std::set<std::string> keys;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    std::size_t eq = line.find(" = ");
    if (line.empty() || line[0] == '#' || line[0] == '[' || eq == std::string::npos) continue;
    keys.insert(line.substr(0, eq));
  }
  return keys;
}

std::set<std::string> documented(std::span<const KeyDoc> docs) {
  std::set<std::string> keys;
  for (const auto& k : docs) keys.insert(std::string(k.key));
  return keys;
}

}  // namespace

TEST_CASE("schema: recipe keys written == recipe keys documented", "[recipe]") {
  CHECK(written_keys(format_recipe(test::full_recipe())) == documented(recipe_keys()));
}

TEST_CASE("schema: cluster keys written == cluster keys documented", "[recipe]") {
  auto c = load_cluster_ref("gh200", {}, preset_dirs({}, HP_SOURCE_DIR));
  REQUIRE(c.ok());
  // The optional measured rate is written only when set (hp devices --measure sets it).
  c->device_types[0].sustained_flops.fp32 = 1e12;
  CHECK(written_keys(format_cluster(*c)) == documented(cluster_keys()));
}

TEST_CASE("schema: the key table renders as Markdown", "[recipe]") {
  std::string t = format_key_table(recipe_keys());
  CHECK(t.rfind("| Section | Key |", 0) == 0);
  CHECK(t.find("| [parallel] | dp | integer >= 1 | yes | data-parallel degree |") !=
        std::string::npos);
  CHECK(t.find("gpipe\\|1f1b\\|interleaved") != std::string::npos);
}
