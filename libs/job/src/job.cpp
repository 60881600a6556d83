// load_job and its parts (job.h): the recipe read once, the job kind decided once, the schedule
// lowered and checked once, the cluster resolved once, the manifest read once.
#include "hp/job/job.h"

#include <fmt/core.h>

#include "hp/job/group_flow.h"
#include "hp/job/sharded.h"
#include "hp/recipe/presets.h"

namespace hp::job {
namespace fs = std::filesystem;

const char* job_kind_name(JobKind k) {
  switch (k) {
    case JobKind::sharded_model: return "sharded model";
    case JobKind::module_groups: return "module groups";
    case JobKind::flow_groups: return "flow groups";
  }
  return "?";
}

JobKind job_kind_of(const recipe::Recipe& r) {
  if (r.groups.empty()) return JobKind::sharded_model;
  return has_flows(r) ? JobKind::flow_groups : JobKind::module_groups;
}

Expected<CheckedSchedule> recipe_schedule(const recipe::Parallel& p, const std::string& where) {
  const auto kind = p.schedule == recipe::Schedule::gpipe         ? ScheduleKind::gpipe
                    : p.schedule == recipe::Schedule::interleaved ? ScheduleKind::interleaved
                                                                  : ScheduleKind::one_f_one_b;
  // hp shard cuts the batch into micro-batches only for a pipeline (shard.cpp
  // bind_micro_batch_dims).
  const int m = p.pp > 1 ? static_cast<int>(p.micro_batches) : 1;
  const int v = kind == ScheduleKind::interleaved ? static_cast<int>(p.virtual_stages) : 1;
  HP_ASSIGN_OR_RETURN(auto compute, make_schedule(kind, static_cast<int>(p.pp), m, v, false));
  CheckedSchedule s;
  s.lowered = lower_send_recv(compute);
  s.check = check_schedule(s.lowered);
  if (!s.check.ok)
    return Error(Errc::bad_input, "the pipeline schedule deadlocks: " + s.check.problem, where);
  return s;
}

fs::path Job::model_path() const { return base_dir / recipe.model; }

fs::path Job::module_path(const recipe::Group& g) const {
  return fs::path(g.module).is_absolute() ? fs::path(g.module) : base_dir / g.module;
}

std::vector<recipe::Group> Job::groups() const {
  if (!recipe.groups.empty()) return recipe.groups;
  recipe::Group g;
  g.name = "main";
  g.module = recipe.model;
  for (std::int64_t k = 0; k < recipe.ranks(); ++k) g.ranks.push_back(k);
  return {g};
}

Expected<Job> make_job(recipe::RecipeDocument doc, const fs::path& recipe_path,
                       const std::vector<fs::path>& preset_dirs) {
  if (!doc.problems.empty()) return collect_errors(Errc::bad_input, doc.problems);
  Job job;
  job.recipe_path = recipe_path;
  job.base_dir = fs::absolute(recipe_path).lexically_normal().parent_path();
  job.recipe = std::move(doc.recipe);
  job.where = std::move(doc.where);
  job.kind = job_kind_of(job.recipe);
  HP_ASSIGN_OR_RETURN(job.schedule,
                      recipe_schedule(job.recipe.parallel, job.where.at("parallel.schedule")));
  if (preset_dirs.empty()) {
    job.cluster_problem = "the cluster was not looked up (no preset directories)";
  } else {
    auto cluster = recipe::cluster_for(job.recipe, job.base_dir, preset_dirs);
    if (cluster)
      job.cluster = std::move(*cluster);
    else
      job.cluster_problem = cluster.error().what.message;
  }
  return job;
}

Expected<Job> load_job(const fs::path& recipe_path, const std::vector<fs::path>& preset_dirs) {
  HP_ASSIGN_OR_RETURN(auto doc, recipe::read_recipe(recipe_path));
  return make_job(std::move(doc), recipe_path, preset_dirs);
}

Status attach_manifest(Job& job, const fs::path& shard_dir) {
  const fs::path file = shard_dir / "manifest.toml";
  HP_ASSIGN_OR_RETURN(auto m, shard::read_manifest(file));
  const auto& p = job.recipe.parallel;
  const auto& s = job.schedule.lowered;
  std::vector<Diagnostic> problems;
  auto differ = [&](const char* what, std::int64_t have, std::int64_t want) {
    if (have != want)
      problems.push_back(
          {file.string(),
           fmt::format("the partitions are for {} {}; the recipe has {}", have, what, want),
           "shard the recipe again (hp shard), or drop --shard-dir"});
  };
  // parse_manifest checked the manifest against itself; here it must be the recipe's partitions.
  differ("ranks", rank_count(m), job.recipe.ranks());
  differ("data-parallel ranks", m.dp, p.dp);
  differ("tensor-parallel ranks", m.tp, p.tp);
  differ("pipeline stages", m.pp, p.pp);
  differ("micro-batches", m.micro_batches, s.micro_batches);
  differ("model chunks per rank", m.virtual_stages, s.chunks);
  if (!problems.empty()) return collect_errors(Errc::bad_input, std::move(problems));
  job.manifest = std::move(m);
  job.shard_dir = shard_dir;
  return {};
}

}  // namespace hp::job
