// `hp verify RECIPE.toml`: the static checks of a recipe (its own keys, its cluster, its model
// file). The numeric comparison of the sharded job against the unsharded model is in libs/job
// (hp/job/verify_run.h). apps/hp/cmd_verify.cpp binds flags into VerifyOptions and calls
// check_recipe(), then the runtime.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hp/core/error.h"
#include "hp/core/expected.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/recipe.h"

namespace hp::recipe {

struct VerifyOptions {
  std::filesystem::path recipe;
  // The comparison's settings, bound from the command line here and passed on to the runtime's
  // checks (check_recipe itself does not use them).
  double rtol = 1e-4;
  double atol = 1e-5;
  std::string backend = "cpu";
  std::vector<std::filesystem::path> preset_dirs;  ///< where cluster presets are looked up
};

/// What the static checks found out; printed as the OK summary.
struct VerifyReport {
  Recipe recipe;
  Cluster cluster;  ///< scaled to recipe.nodes
  std::filesystem::path recipe_path;
  std::filesystem::path model_path;  ///< resolved against the recipe's directory
  std::filesystem::path cluster_path;
};

/// Runs every static check and collects every problem into one bad_input Error.
Expected<VerifyReport> check_recipe(const VerifyOptions& opts);
/// The same for a recipe already read (opts.recipe names it in messages).
Expected<VerifyReport> check_recipe(const RecipeDocument& doc, const VerifyOptions& opts);
/// What every command acting on a recipe (shard, launch, offload-profile) runs before it writes,
/// starts or prices anything: check_recipe on the file, with its cluster looked up in
/// `preset_dirs`. Nothing when `preset_dirs` is empty (a library caller without presets).
Status check_recipe_before_use(const std::filesystem::path& recipe,
                               const std::vector<std::filesystem::path>& preset_dirs);

/// The short human summary of a passing report (several lines, each ending in '\n').
std::string format_verify_summary(const VerifyReport& r);

/// One JSON object: {"ok": bool, "recipe": path, "errors": [{"where","message","hint"}], ...} plus,
/// when ok, "version", "model", "cluster", "nodes", "ranks" and "degrees".
std::string format_verify_json(const std::filesystem::path& recipe,
                               const Expected<VerifyReport>& result);

}  // namespace hp::recipe
