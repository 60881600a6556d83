// The Job: what `hp launch RECIPE.toml` and `hp verify RECIPE.toml` derive from a recipe, derived
// once per process and passed down as a value.
//
// Before the Job existed, every layer re-derived what it needed from a recipe *path*: the launcher
// read the recipe, then the flow checks and the partitioner read it again, the manifest was read
// four times, "what kind of job is this" was decided from `groups.empty()` / `has_flows()` in eight
// places, and the recipe's schedule was turned into a runtime schedule three times (once through
// the string "1f1b"). Now the launcher and each worker call load_job() once and hand the Job on:
//   - the recipe as parsed (with its key locations, for located errors) and its directory, against
//     which the model, the group modules and a cluster file are resolved;
//   - the job kind (job_kind_of is the only place that decides it);
//   - the pipeline schedule of the recipe's [parallel] section, lowered with SEND/RECV actions and
//     checked for deadlocks by simulation (schedule.h);
//   - the cluster at the recipe's node count, when preset directories were given (the launcher's
//     prediction of the step time needs it; workers do not);
//   - for a sharded model, the manifest of the partitions the ranks run, once it is known (the
//     launcher writes or links the partitions first: attach_manifest).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/job/schedule.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/recipe.h"
#include "hp/recipe/source_map.h"
#include "hp/shard/manifest.h"

namespace hp::job {

enum class JobKind {
  sharded_model,  ///< no [[groups]]: the recipe's model, partitioned by hp shard over dp*tp*pp
                  ///< ranks
  module_groups,  ///< [[groups]], each rank running its group's own module; no tensors between
                  ///< groups
  flow_groups,    ///< [[groups]] that exchange tensors by name (group_flow.h)
};

/// "sharded model", "module groups", "flow groups".
const char* job_kind_name(JobKind k);

/// The one place that decides what kind of job a recipe describes.
JobKind job_kind_of(const recipe::Recipe& r);

/// The pipeline schedule a recipe's [parallel] section asks for: gpipe / 1f1b / interleaved over pp
/// ranks, micro_batches when pp > 1 (one micro-batch otherwise, as hp shard partitions it) and
/// virtual_stages chunks when interleaved; lowered with SEND/RECV (lower_send_recv) and simulated
/// (check_schedule). Errors: usage from make_schedule for impossible degrees, bad_input naming the
/// recipe when the schedule deadlocks (the check's problem text says where).
struct CheckedSchedule {
  PipelineSchedule lowered;
  ScheduleCheck check;
};
Expected<CheckedSchedule> recipe_schedule(const recipe::Parallel& p, const std::string& where = {});

struct Job {
  std::filesystem::path recipe_path;  ///< as given on the command line
  std::filesystem::path base_dir;     ///< the recipe's directory, absolute
  recipe::Recipe recipe;
  recipe::SourceMap where;  ///< key -> "file:line:col", for located errors
  JobKind kind = JobKind::sharded_model;
  CheckedSchedule schedule;  ///< recipe_schedule(recipe.parallel)
  /// The cluster at the recipe's node count (recipe::cluster_for); empty when no preset directories
  /// were given or it did not resolve (cluster_problem says why).
  std::optional<recipe::Cluster> cluster;
  std::string cluster_problem;
  /// Sharded model: the manifest of the partitions the ranks run (attach_manifest), and where.
  std::optional<shard::Manifest> manifest;
  std::filesystem::path shard_dir;

  /// base_dir / recipe.model.
  std::filesystem::path model_path() const;
  /// A group's module: absolute as written, else relative to the recipe.
  std::filesystem::path module_path(const recipe::Group& g) const;
  /// The groups the job starts: the recipe's [[groups]], or for a sharded model one implicit group
  /// "main" of dp*tp*pp ranks running the recipe's model.
  std::vector<recipe::Group> groups() const;
  /// Micro-batches a sharded model's ranks run per step (1 without a pipeline).
  int micro_batches() const { return schedule.lowered.micro_batches; }
};

/// Reads and validates the recipe (every problem in one bad_input error), decides its kind, builds
/// and checks its schedule and, with `preset_dirs`, resolves its cluster.
Expected<Job> load_job(const std::filesystem::path& recipe_path,
                       const std::vector<std::filesystem::path>& preset_dirs = {});

/// The same from a recipe already read (`doc` must have no problems).
Expected<Job> make_job(recipe::RecipeDocument doc, const std::filesystem::path& recipe_path,
                       const std::vector<std::filesystem::path>& preset_dirs = {});

/// Reads `shard_dir`/manifest.toml into the job, checking that the partitions are for this job:
/// the recipe's rank count, pipeline degree, micro-batches and model chunks. bad_input otherwise,
/// naming the manifest.
Status attach_manifest(Job& job, const std::filesystem::path& shard_dir);

}  // namespace hp::job
