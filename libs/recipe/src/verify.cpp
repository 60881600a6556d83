// The static half of `hp verify`. It answers "would hp accept this recipe?" without running
// anything: the recipe parses and validates on its own, its cluster (preset or file) parses and
// validates, the degrees fit that cluster at the recipe's node count, and the model file exists.
// All of it is collected, then reported at once, so a recipe with five mistakes needs one run to
// fix.
//
// The numeric half (the sharded job against the unsharded model) is hp::job::verify_recipe_run
// (hp/job/verify_run.h), which the CLI calls once these checks pass.
#include "hp/recipe/verify.h"

#include <system_error>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "hp/recipe/presets.h"

namespace hp::recipe {

namespace fs = std::filesystem;

namespace {

// Resolves, loads and scales the recipe's cluster into `rep.cluster`, appending what goes wrong.
// Returns false when there is no usable cluster.
bool check_cluster(const RecipeDocument& doc, const VerifyOptions& opts, VerifyReport& rep,
                   std::vector<Diagnostic>& problems) {
  const Recipe& r = doc.recipe;
  auto path = find_cluster(r.cluster, opts.recipe.parent_path(), opts.preset_dirs);
  if (!path) {
    Diagnostic d = path.error().what;
    d.where = doc.where.at("recipe.cluster");
    problems.push_back(std::move(d));
    return false;
  }
  rep.cluster_path = *path;
  auto cluster = load_cluster(*path);
  if (!cluster) {
    for (auto& d : cluster.error().all()) problems.push_back(d);
    return false;
  }
  if (r.nodes < 1 || r.nodes > (std::int64_t{1} << 20)) return false;  // reported with the recipe
  auto scaled = scale_cluster(*cluster, r.nodes);
  if (!scaled) {
    Diagnostic d = scaled.error().what;
    d.where = doc.where.at("recipe.nodes");
    problems.push_back(std::move(d));
    return false;
  }
  rep.cluster = std::move(*scaled);
  return true;
}

}  // namespace

Expected<VerifyReport> check_recipe(const VerifyOptions& opts) {
  HP_ASSIGN_OR_RETURN(auto doc, read_recipe(opts.recipe));
  return check_recipe(doc, opts);
}

Expected<VerifyReport> check_recipe(const RecipeDocument& read, const VerifyOptions& opts) {
  const RecipeDocument* doc = &read;
  std::vector<Diagnostic> problems = doc->problems;
  const bool recipe_ok = problems.empty();
  VerifyReport rep;
  rep.recipe = doc->recipe;
  rep.recipe_path = opts.recipe;
  const Recipe& r = rep.recipe;
  if (!doc->syntax_ok) return collect_errors(Errc::bad_input, std::move(problems));

  // The model file: only its existence is a static fact (loading it is the model library's job).
  std::error_code ec;
  if (!r.model.empty()) {
    rep.model_path =
        fs::path(r.model).is_absolute() ? fs::path(r.model) : opts.recipe.parent_path() / r.model;
    if (!fs::is_regular_file(rep.model_path, ec))
      problems.push_back(
          Diagnostic{doc->where.at("recipe.model"),
                     fmt::format("model file '{}' not found", rep.model_path.string()),
                     "'recipe.model' is relative to the recipe file"});
  }
  // The cluster, and the recipe's ranks on it. Rank arithmetic on a recipe that is itself broken
  // would only repeat its errors, so that part needs a clean recipe.
  if (!r.cluster.empty() && check_cluster(*doc, opts, rep, problems) && recipe_ok) {
    const auto* device = rep.cluster.rank_device_type();
    auto more = validate_recipe_on_cluster(r, doc->where, rep.cluster.ranks(), rep.cluster.name,
                                           device && device->kind == DeviceKind::cpu);
    problems.insert(problems.end(), more.begin(), more.end());
  }
  if (!problems.empty()) return collect_errors(Errc::bad_input, std::move(problems));
  return rep;
}

Status check_recipe_before_use(const fs::path& recipe, const std::vector<fs::path>& preset_dirs) {
  if (preset_dirs.empty()) return {};
  VerifyOptions checks;
  checks.recipe = recipe;
  checks.preset_dirs = preset_dirs;
  HP_TRY(check_recipe(checks));
  return {};
}

std::string format_verify_summary(const VerifyReport& rep) {
  const Recipe& r = rep.recipe;
  const Cluster& c = rep.cluster;
  const Parallel& p = r.parallel;
  std::string s = fmt::format("{}: ok\n", rep.recipe_path.string());
  s += fmt::format("  recipe   '{}', version {}\n", r.name, r.version);
  s += fmt::format("  model    {}\n", r.model);
  s += fmt::format("  cluster  {} ({} node(s) x {} {} = {} ranks)\n", c.name, c.nodes,
                   c.ranks_per_node(), c.rank_device, c.ranks());
  s += fmt::format(
      "  degrees  dp={} tp={} pp={} -> {} ranks; {} micro-batch(es) of {}, schedule {}\n", p.dp,
      p.tp, p.pp, r.ranks(), p.micro_batches, p.micro_batch_size, schedule_name(p.schedule));
  if (!r.stages.empty() || !r.layouts.empty() || !r.groups.empty())
    s += fmt::format("  explicit {} stage(s), {} layout(s), {} group(s)\n", r.stages.size(),
                     r.layouts.size(), r.groups.size());
  return s;
}

std::string format_verify_json(const fs::path& recipe, const Expected<VerifyReport>& result) {
  nlohmann::ordered_json j;
  j["ok"] = result.ok();
  j["recipe"] = recipe.string();
  j["errors"] = nlohmann::json::array();
  if (!result.ok()) {
    j["code"] = errc_name(result.error().code);
    for (const auto& d : result.error().all())
      j["errors"].push_back({{"where", d.where}, {"message", d.message}, {"hint", d.hint}});
    return j.dump();
  }
  const VerifyReport& rep = *result;
  j["version"] = rep.recipe.version;
  j["name"] = rep.recipe.name;
  j["model"] = rep.model_path.string();
  j["cluster"] = rep.cluster.name;
  j["nodes"] = rep.cluster.nodes;
  j["ranks"] = rep.recipe.ranks();
  j["degrees"] = {{"dp", rep.recipe.parallel.dp},
                  {"tp", rep.recipe.parallel.tp},
                  {"pp", rep.recipe.parallel.pp}};
  return j.dump();
}

}  // namespace hp::recipe
