// `hp verify`: the one entry point for its three checks, so that the CLI only binds flags and
// prints.
//
//   MODEL.onnx --inputs DIR --expected DIR: run the model on one rank and compare every output with
//     the expected tensors (verify_model).
//   RECIPE.toml: the recipe's static checks (hp/recipe/verify.h: keys, model file, cluster and
//   ranks),
//     the tensor flows between its [[groups]] (group_flow.h), then, unless static_only, the sharded
//     job against the unsharded model (verify_run.h), over mpirun or in one process (`simulate`).
// The recipe is read once: the static checks and the Job (job.h) are made from the same document.
// A failed recipe step and a mismatch are not errors of verify() itself: the report carries them,
// so that `--json` can describe them and the CLI picks the exit code (3 bad input, 6 mismatch,
// ...).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/job/launch.h"
#include "hp/job/verify_run.h"
#include "hp/recipe/verify.h"

namespace hp::job {

/// Options of `hp verify MODEL.onnx --inputs DIR --expected DIR`.
struct ModelVerifyOptions {
  std::filesystem::path model;
  std::filesystem::path inputs;
  std::filesystem::path expected;
  double rtol = 1e-4;
  double atol = 1e-5;
  std::string backend;  ///< empty: best available
  int threads = 0;
  std::vector<std::filesystem::path> plugin_paths;
};

struct ModelVerifyReport {
  std::vector<exec::OutputCheck> outputs;
  exec::ExecStats stats;
  std::string backend;
  bool ok() const;
  /// One line per output (name, max abs/rel error, verdict) and a closing line.
  std::string format() const;
};

/// Runs the model and compares every output with expected/output_K.pb. A mismatch is not an error
/// here: the report says which outputs are out of tolerance (the CLI exits with the mismatch code).
Expected<ModelVerifyReport> verify_model(const ModelVerifyOptions& options);

struct VerifyOptions {
  std::filesystem::path target;    ///< RECIPE.toml or MODEL.onnx (the extension decides)
  std::filesystem::path inputs;    ///< input_K.pb tensors (MODEL: required; RECIPE: else generated)
  std::filesystem::path expected;  ///< MODEL only: output_K.pb tensors to compare with
  double rtol = 1e-4, atol = 1e-5;
  std::string backend;  ///< empty: the best available
  int threads = 0;
  std::vector<std::filesystem::path> plugin_paths;
  std::vector<std::filesystem::path>
      preset_dirs;           ///< where the recipe's cluster preset is looked up
  bool static_only = false;  ///< RECIPE: no sharded run
  /// RECIPE: the sharded run's own settings (simulate, seed, shard_dir, timeout, root, run_dir);
  /// its inputs, tolerances, backend, threads and plugin paths are taken from the fields above.
  RecipeRunOptions run;
};

struct VerifyReport {
  bool model_mode = false;
  ModelVerifyReport model;  ///< MODEL
  // RECIPE:
  std::filesystem::path recipe;
  std::optional<recipe::VerifyReport> checks;  ///< the static checks, when they passed
  std::optional<RecipeRunReport> run;          ///< the sharded run (or why it was skipped)
  std::optional<Error> failure;                ///< the first step that failed, if any

  /// No failure and every output within tolerance.
  bool ok() const;
  /// What `hp verify` prints on stdout (the failure itself is the caller's to print).
  std::string text() const;
  /// RECIPE --json: one object, the static checks' fields plus "run" (hp-verify(1)).
  std::string json() const;
  /// The exit-6 error of a mismatch, naming the target.
  Error mismatch() const;
};

/// Errors: usage (options that do not fit the target), and for MODEL.onnx everything verify_model
/// reports; a RECIPE's step failures are in VerifyReport::failure.
Expected<VerifyReport> verify(const VerifyOptions& options);

}  // namespace hp::job
