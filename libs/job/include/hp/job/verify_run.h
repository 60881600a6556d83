// `hp verify RECIPE.toml`, past the recipe's own static checks (hp/recipe/verify.h): that the
// sharded job computes what the unsharded model computes.
//
//   1. static: the recipe partitions (hp shard's checks: layouts fit the mesh and the shapes,
//   stages
//      cover the blocks, ranks cover the mesh), and the recipe's pipeline schedule simulates
//      without deadlock (schedule.h check_schedule);
//   2. inputs: --inputs DIR, or generated from the model's inputs at the recipe's dims (seeded:
//      floats uniform in [-1, 1), integers in [0, n) where n is the smallest table a Gather indexes
//      with them — token ids stay in the vocabulary — else {0, 1});
//   3. the unsharded model on one rank (the cpu plugin unless --backend), and the sharded job: all
//      ranks in this process on threads (`simulate`), or a real MPI job through hp launch;
//   4. every output compared (max abs / rel error; rtol/atol as in compare_tensors).
// A mismatch is not an error: the report says which outputs differ (the CLI exits with code 6).
// Recipes with [[groups]] (MPMD modules), models without weights and model files that do not load
// (planning-only recipes) get the static checks only, and the report says why.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/compare.h"
#include "hp/exec/tensor.h"

namespace hp::job {

struct Job;  // job.h

struct RecipeRunOptions {
  std::filesystem::path inputs;     ///< empty: generated
  std::filesystem::path shard_dir;  ///< run these partitions instead of sharding afresh
  double rtol = 1e-4, atol = 1e-5;
  bool simulate = false;  ///< in-process ranks instead of mpirun
  std::uint64_t seed = 1;
  std::string backend;  ///< of the unsharded run and, with simulate, of the ranks
  int threads = 0;
  double timeout_s = 0;  ///< the MPI job's --timeout
  bool allow_run_as_root = false;
  std::filesystem::path run_dir;  ///< the MPI job's run directory (default: a temporary one)
  std::vector<std::filesystem::path> plugin_paths;
  // A training recipe (verify_train.cpp): the data (one of them) and the steps compared.
  std::filesystem::path data;  ///< token stream (hp launch --data)
  int steps = 0;               ///< 0 = 3
};

struct RecipeRunReport {
  bool ran = false;  ///< false: static checks only (`skipped` says why)
  std::string skipped;
  int ranks = 0;
  std::string how;  ///< "simulated in one process" / "mpirun, 8 ranks"
  bool generated_inputs = false;
  std::vector<exec::OutputCheck> outputs;
  double unsharded_s = 0, sharded_s = 0;
  std::string timing;    ///< the sharded job's step line
  std::string schedule;  ///< "1f1b, p=2, m=4: no deadlock, bubble 0.20"
  /// A training recipe: `outputs` are the per-step losses ("loss, step K") then the final weights,
  /// and `layout` says how the ranks trained ("dp=2, optimizer_shard 2").
  bool training = false;
  std::string layout;
  /// A failed MPI job's temporary directory, kept (not removed) so that its logs can be read.
  std::filesystem::path kept_dir;
  bool ok() const;
  std::string format() const;
};

/// Steps 2-4 above for `job` (its schedule already checked by load_job). The manifest of the
/// partitions run is attached to the job. A recipe with [train]: verify_training_run.
Expected<RecipeRunReport> verify_recipe_run(Job& job, const RecipeRunOptions& o);

/// A training recipe: `steps` steps of its job (mpirun, or threads with `simulate`) against the
/// same steps on one rank from the same weights and data (--inputs or --data). A step's loss agrees
/// within rtol (relative); a trained weight agrees when ||w_job - w_one|| <= 1% of
/// ||w_one - w_initial|| (the update it got), or within atol everywhere when it did not move.
/// Errc::usage without data.
Expected<RecipeRunReport> verify_training_run(const Job& job, const RecipeRunOptions& o);

/// `static_json` (hp::recipe::format_verify_json's object) with "run": {ran, skipped | how, ranks,
/// outputs: [{name, max_abs, max_rel, bad, problem, ok}], unsharded_s, sharded_s, schedule} or
/// "run": {"error": ...} added, and "ok" false when the run failed or mismatched.
std::string add_run_json(const std::string& static_json, const Expected<RecipeRunReport>& run);

/// Inputs for the model's graph inputs at the given shapes (see 2. above); `bounds` per input:
/// the exclusive upper bound of integer values (0: the default {0, 1}).
std::vector<exec::HostTensor> generate_inputs(const std::vector<exec::GraphIO>& inputs,
                                              const std::vector<std::int64_t>& bounds,
                                              std::uint64_t seed);

}  // namespace hp::job
