// check_recipe(): the static checks behind `hp verify`.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "fixtures.h"
#include "hp/recipe/presets.h"
#include "hp/recipe/verify.h"

using namespace hp::recipe;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("hp_verify_test_" + std::to_string(::getpid()));
    fs::create_directories(path / "models");
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
  }
};

VerifyOptions options(const fs::path& recipe) {
  VerifyOptions o;
  o.recipe = recipe;
  o.preset_dirs = preset_dirs({}, HP_SOURCE_DIR);
  return o;
}

const char* kRecipe = R"([recipe]
version = 1
name = "t"
model = "models/m.onnx"
cluster = "dgx-h100"
nodes = 2
[parallel]
dp = 2
tp = 8
pp = 1
)";

}  // namespace

TEST_CASE("verify: a valid recipe passes and is summarised", "[recipe]") {
  TempDir d;
  d.write("models/m.onnx", "x");
  d.write("r.toml", kRecipe);
  auto rep = check_recipe(options(d.path / "r.toml"));
  REQUIRE(rep.ok());
  CHECK(rep->cluster.nodes == 2);
  CHECK(rep->cluster.ranks() == 16);
  std::string s = format_verify_summary(*rep);
  CHECK(s.find("dp=2 tp=8 pp=1 -> 16 ranks") != std::string::npos);
  CHECK(s.find("dgx-h100 (2 node(s) x 8 h100-sxm5 = 16 ranks)") != std::string::npos);
  std::string j = format_verify_json(d.path / "r.toml", rep);
  CHECK(j.find("\"ok\":true") != std::string::npos);
  CHECK(j.find("\"ranks\":16") != std::string::npos);
}

TEST_CASE("verify: missing model, rank mismatch and cluster errors are collected", "[recipe]") {
  TempDir d;
  std::string text = kRecipe;
  text.replace(text.find("nodes = 2"), 9, "nodes = 3");
  d.write("r.toml", text);
  auto rep = check_recipe(options(d.path / "r.toml"));
  REQUIRE(!rep.ok());
  CHECK(rep.error().code == hp::Errc::bad_input);
  auto all = rep.error().all();
  INFO(test::dump(all));
  CHECK(test::has(all, "r.toml:4:9", "model file"));
  CHECK(
      test::has(all, "r.toml:7:1", "= 16 ranks but cluster 'dgx-h100' has 24 ranks on 3 node(s)"));
  std::string j = format_verify_json(d.path / "r.toml", rep);
  CHECK(j.find("\"ok\":false") != std::string::npos);
  CHECK(j.find("\"where\":") != std::string::npos);
}

TEST_CASE("verify: an unknown preset and a broken cluster file are reported", "[recipe]") {
  TempDir d;
  d.write("models/m.onnx", "x");
  std::string text = kRecipe;
  text.replace(text.find("\"dgx-h100\""), 10, "\"dgx-h10\"");
  d.write("r.toml", text);
  auto rep = check_recipe(options(d.path / "r.toml"));
  REQUIRE(!rep.ok());
  CHECK(rep.error().what.message == "unknown cluster preset 'dgx-h10'");
  CHECK(rep.error().what.where.find("r.toml:5:11") != std::string::npos);

  text = kRecipe;
  text.replace(text.find("\"dgx-h100\""), 10, "\"c.toml\"");
  d.write("r.toml", text);
  d.write("c.toml", "[cluster]\nversion = 1\nname = 5\n");
  rep = check_recipe(options(d.path / "r.toml"));
  REQUIRE(!rep.ok());
  auto all = rep.error().all();
  INFO(test::dump(all));
  CHECK(test::has(all, "c.toml:3:8", "'cluster.name' must be a string, got an integer"));
}

TEST_CASE("verify: the quick-start recipe passes its static checks", "[recipe]") {
  fs::path quick = fs::path(HP_SOURCE_DIR) / "recipes" / "quickstart.toml";
  auto doc = read_recipe(quick);
  REQUIRE(doc.ok());
  INFO(test::dump(doc->problems));
  CHECK(doc->problems.empty());
  CHECK(doc->recipe.cluster == "local-cpu");
  CHECK(doc->recipe.ranks() == 1);
  // The model file arrives with the model library; check it fully once it is there.
  if (fs::exists(fs::path(HP_SOURCE_DIR) / "recipes" / "models" / "tiny-gpt2.onnx")) {
    auto rep = check_recipe(options(quick));
    INFO((rep.ok() ? std::string() : rep.error().str()));
    CHECK(rep.ok());
  }
}
