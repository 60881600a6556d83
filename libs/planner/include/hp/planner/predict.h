// Pricing one configuration with the planner's cost model, without searching: planner::predict
// takes a configuration given in full (degrees, ZeRO level, micro-batching, schedule, sequence
// parallelism, placement and optionally the stage layout with per-block recomputation) and costs it
// exactly as `hp plan` costs each of its candidates. candidate_of() reads such a configuration from
// a recipe or a plan, and load_profile() loads and profiles a model once for any number of
// predictions.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/graph.h"
#include "hp/model/summary.h"
#include "hp/planner/cost.h"
#include "hp/planner/planner.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/recipe.h"

namespace hp::planner {

/// What to profile: a model file at its symbolic dims, for a sequence length and dtype.
struct ProfileRequest {
  std::filesystem::path model;
  model::DimBindings
      dims;  ///< symbolic input dims; "batch" is bound to 1, "seq" to the planned length
  std::int64_t seq = 0;        ///< planned sequence length; 0 = dims["seq"]
  std::string dtype = "bf16";  ///< planned dtype: activation and boundary bytes are counted in it
  bool require_data = false;   ///< fail when external weight files are absent
};

/// A model profiled for planning, with what libs/model had to say about it.
struct LoadedProfile {
  ModelProfile profile;
  model::ModelSummary summary;        ///< what the profile was made from (graph, layering, cuts)
  std::vector<std::string> warnings;  ///< unbound dims, absent weight files, tied copies, ...
};

/// Loads the model once, summarises it at batch 1 and the planned sequence and profiles its blocks.
/// A model that cannot be read is reported before a missing sequence length (Errc::usage).
Expected<LoadedProfile> load_profile(const ProfileRequest& request);

/// Pipeline rank k's blocks and recomputation, given rather than chosen by level 2.
struct StageLayout {
  std::vector<std::int64_t> blocks;          ///< indices into ModelProfile::blocks, in model order
  std::vector<recipe::Recompute> recompute;  ///< per block, parallel to blocks; empty = none
};

/// One configuration to price: what level 1 of the search chooses (Config) and, optionally, what
/// level 2 chooses.
struct Candidate {
  Config config;
  /// One entry per pipeline rank; an interleaved rank lists the blocks of its virtual_stages chunks
  /// in model order. Empty: level 2 assigns the blocks and picks recomputation
  /// (config.forced_recompute when set), as hp plan does for each candidate.
  std::vector<StageLayout> stages;
};

/// How the configuration runs. The global batch is the configuration's own:
/// dp x micro_batch_size x micro_batches sequences per step.
struct PredictOptions {
  bool train = true;  ///< false: inference (forward passes; no gradients or optimizer states)
  std::string dtype = "bf16";      ///< compute dtype; must be the one the profile was made in
  std::string optimizer = "adam";  ///< adam | adamw | sgd | none: the states training keeps
};

/// Prices `candidate` for `profile` on `cluster`: the plan hp plan would report for it (stages with
/// their costs and memory, the predicted step, the links each axis uses). Memory does not make it
/// fail: stages[k].feasible and predicted.peak_memory tell whether it fits (without a given layout,
/// when level 2 finds none that fits, the blocks are split evenly). A configuration the cost model
/// cannot price is Errc::bad_input located at the recipe key it corresponds to ("parallel.pp",
/// "stages", ...): degrees not in range or not multiplying to the cluster's ranks, more pipeline
/// stages than blocks, tp not dividing the attention heads, expert parallelism the model or dp does
/// not allow, virtual stages without the interleaved schedule, a layout that does not hold every
/// block exactly once, or a dtype other than the profile's.
Expected<Plan> predict(const Candidate& candidate, const recipe::Cluster& cluster,
                       const ModelProfile& profile, const PredictOptions& options = {});

/// The configuration and stage layout a plan chose: predict(candidate_of(p), ...) reprices p.
Candidate candidate_of(const Plan& plan);

/// The configuration a recipe states: its [parallel] degrees, ZeRO level, micro-batches, schedule,
/// virtual stages, sequence and expert parallelism; the placement its [[stages]] ranks imply (the
/// first axis order that reproduces them, as hp plan -o writes them; tp<dp<pp when none does or no
/// ranks are listed); and its [[stages]] layout (stage j on pipeline rank j mod pp) with each
/// layer's recompute policy. When [model] dims bind "batch", the micro-batch size is what a run
/// feeds: batch / (dp x micro_batches). HSDP: [parallel] shard_group (0 = the whole DP group).
/// Errors are Errc::bad_input located at the recipe key.
Expected<Candidate> candidate_of(const recipe::Recipe& recipe);

/// predict() of a recipe: its model (a path relative to `base_dir`, the recipe's directory)
/// profiled once at its [model] dims in options.dtype, and its candidate_of() configuration on
/// `cluster` (the cluster the recipe runs on: recipe::cluster_for). A recipe that binds no "seq" is
/// bad_input.
Expected<Plan> predict_recipe(const recipe::Recipe& recipe, const std::filesystem::path& base_dir,
                              const recipe::Cluster& cluster, const PredictOptions& options = {});

}  // namespace hp::planner
