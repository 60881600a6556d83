// hp launch and hp verify MODEL.onnx: run a model on one rank without a recipe (an implicit
// single-device recipe) and compare outputs. hp launch RECIPE.toml: one MPMD job over Open MPI
// (launcher.h) whose ranks run `hp launch RECIPE.toml --worker` (worker.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/compare.h"
#include "hp/exec/executor.h"

namespace hp::job {

struct LaunchOptions {
  std::filesystem::path target;   ///< RECIPE.toml or MODEL.onnx
  std::filesystem::path inputs;   ///< input_K.pb directory
  std::filesystem::path outputs;  ///< where output_K.pb are written
  bool force = false;   ///< --outputs may replace a directory that is not hp's own earlier output
  std::string backend;  ///< cpu|cuda|ascend; empty: best available
  int threads = 0;      ///< 0: the cores available
  /// --dtype, MODEL.onnx only: "bf16" runs float32 MatMul/Gemm/Conv in bfloat16 with float32
  /// accumulation (the cpu plugin's compute=bf16); "" or "f32": float32.
  std::string dtype;
  /// MODEL.onnx: print where the last run's time went per op type (and "profile" in --json).
  /// With --trace FILE, a model run writes each node of its last run as a Chrome trace event.
  bool profile = false;
  bool dry_run = false;
  std::filesystem::path hostfile;
  double timeout_s = 0;
  std::vector<std::filesystem::path> plugin_paths;  ///< --plugin-path entries
  // RECIPE.toml only:
  std::filesystem::path run_dir;  ///< logs and rank outputs; empty: hp-runs/<recipe>-<time>
  /// A recipe without [[groups]]: run these `hp shard` partitions (linked as RUN/shard) instead of
  /// sharding the model afresh. Their manifest must be for the recipe's ranks.
  std::filesystem::path shard_dir;
  /// A recipe without [[groups]]: run the whole schedule this many times and report the median step
  /// (benchmarks: the first step pays for first-run work). A recipe with [train]: the optimizer
  /// steps, instead of [train].steps. 0 = not given (one run; [train].steps).
  int steps = 0;
  /// Where cluster presets are looked up for the plan's predicted step (hp/recipe/presets.h).
  std::vector<std::filesystem::path> preset_dirs;
  std::string launcher = "mpirun";  ///< mpirun or slurm
  bool allow_run_as_root = false;
  bool worker = false;  ///< this process is a rank (hidden: started by mpirun)
  /// A training recipe of several ranks: run them as threads of this process (in-process
  /// transport) instead of an mpirun job.
  bool simulate = false;
  // A recipe with a [train] table (train_run.h): the data is exactly one of `inputs` (one batch,
  // the inputs and the labels as .pb files) and `data`. The zero values mean "not given", so that
  // these options are refused where nothing trains rather than silently ignored.
  std::filesystem::path data;     ///< token stream (uint16 or uint32 ids)
  int token_bytes = 0;            ///< 2 or 4; 0 = 2
  std::int64_t seed = -1;         ///< data order; -1 = [train].seed
  std::filesystem::path metrics;  ///< JSON lines, one per step
  std::filesystem::path trace;    ///< Chrome trace of every rank's step (hp/train/trace.h)
  /// A pipeline job's last step, measured above predicted, as SVG (train_run.h write_timeline).
  std::filesystem::path timeline;
  std::filesystem::path save_model;  ///< the trained model (.onnx)
  std::filesystem::path checkpoint_dir;
  std::int64_t checkpoint_every = 0;  ///< steps between checkpoints; 0 = only at the end
  std::filesystem::path resume_dir;   ///< a checkpoint directory to continue from
  int log_every = 0;                  ///< a progress line every k steps; 0 = every step
  /// Extra mpirun (or srun) options, split as a shell would (launcher.h split_words).
  std::string mpi_args;
  /// torchrun's --nproc-per-node for a recipe: on one host it must equal the recipe's rank count;
  /// with --hostfile, mpirun places that many ranks per node (--npernode). 0 = not given.
  int nproc_per_node = 0;
  /// Print the launch command and where each rank's log goes (to the sink's stderr) before
  /// starting.
  bool verbose = false;
  /// Console lines of the ranks ("[group:rank] ..."); err for their stderr. Unset: dropped.
  std::function<void(bool err, const std::string& line)> sink;
};

struct LaunchReport {
  std::string summary;
  /// The same results as one JSON object (hp launch --json): "mode" (model, recipe, dry-run,
  /// train), then per mode the step times, outputs (name, dtype, shape, min, max, mean, first
  /// values), run directory. Empty where a mode has none (a rank).
  std::string json;
  exec::ExecStats stats;
};

/// MODEL.onnx: reads --inputs, runs, writes --outputs atomically. Errors: usage (missing
/// --inputs/--outputs), bad_input (model, inputs, unsupported ops), unavailable (the requested
/// backend), runtime (a kernel failed).
/// RECIPE.toml with a [train] table: trains on one rank (train_run.h); a recipe of several ranks is
/// Errc::not_implemented, the training options anywhere else Errc::usage.
/// RECIPE.toml: plans the MPMD job; --dry-run returns the command and app file as the summary; else
/// runs it (launcher.h) and, with --outputs, gathers each group's outputs from the lowest rank of
/// the group that wrote any (filtered by the group's `outputs` names when given, except for a
/// scheduler group, whose outputs are the results it collected: group_flow.h; a name already taken
/// from an earlier group is skipped), groups in recipe order. A failed rank's Error carries the
/// rank's own hp exit code where it had one, else Errc::runtime; timeouts are Errc::runtime. With
/// `worker`, runs this process as one rank (worker.h); the caller must mpi_abort() on error.
Expected<LaunchReport> launch(const LaunchOptions& options);

struct Job;  // job.h
/// launch() of a RECIPE.toml whose Job the caller already built (hp verify's MPI run): the recipe
/// is not read again; the job gets the manifest of the partitions the ranks run.
Expected<LaunchReport> launch_job(Job& job, const LaunchOptions& options);

}  // namespace hp::job
