// Sharded runs: the partitions `hp shard` wrote (manifest.toml + rank<R>.onnx, hp/shard/manifest.h)
// executed on their ranks — over MPI by `hp launch RECIPE.toml` (worker.h), or all ranks in one
// process on threads with the in-process transport (`hp verify RECIPE.toml --simulate`).
//
// Data flow of one run, for the recipe's global inputs (the unsharded model's inputs, batch B):
//   1. micro-batches: an input whose manifest shape has B / m rows on axis 0 (m = manifest
//      micro_batches) is cut into m consecutive blocks of rows; an input whose shape is the whole
//      tensor is given to every micro-batch as is; any other shape is a bad_input error naming it.
//   2. each rank takes its slice of each micro-batch input by the input's layout (slice_of on the
//      stage mesh at the rank's (dp, tp) position), for the inputs its partition declares;
//   3. the rank runs its stage's action list of the pipeline schedule (schedule.h; GPipe or 1F1B;
//      one forward per micro-batch when pp = 1); hp.Send / hp.Recv nodes of the partition carry the
//      SEND/RECV actions with tags offset per micro-batch (comm.h);
//   4. a rank that holds graph outputs (the last stage) returns its local pieces, micro-batches
//      concatenated along axis 0; assemble_outputs() puts every rank's piece at its slice of each
//      micro-batch's global output (the first holder of a replicated slice wins) and concatenates
//      the micro-batches, giving the unsharded model's outputs.
// Interleaved schedules: a rank holds one partition per model chunk (manifest virtual_stages) and
// runs the chunk of each action's virtual stage; a chunk may send to a later chunk of its own rank.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "hp/comm/comm.h"
#include "hp/core/expected.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/job/schedule.h"
#include "hp/recipe/recipe.h"
#include "hp/shard/manifest.h"

namespace hp::job {

struct ShardedRunOptions {
  std::filesystem::path shard_dir;  ///< holds manifest.toml and the rank files
  /// The pipeline schedule, lowered and checked (Job::schedule); it must match the manifest's pp,
  /// micro-batches and model chunks.
  PipelineSchedule schedule;
  std::string backend;  ///< empty: best available
  int threads = 0;      ///< per rank
  int steps = 1;        ///< run the whole schedule this many times (benchmarks)
  /// The recipe, for its [offload] section: each rank's executor then follows the offload schedule
  /// of its stage under the stage's device budget, enforced on the cpu backend (offload_run.h).
  /// Empty: no offload.
  const recipe::Recipe* recipe = nullptr;
  std::vector<std::filesystem::path> plugin_paths;
  /// The longest a rank waits for a peer (a deadlock ends in an error after it); 0 = 60 s. The
  /// --timeout of `hp verify --simulate`.
  double timeout_s = 0;
};

/// When a compute action ran, relative to the start of the schedule (all ranks start it together,
/// after a barrier), and how long of it was spent blocked in hp.Recv (waiting for the previous
/// stage).
struct ActionTime {
  int micro_batch = 0;
  double start_s = 0, end_s = 0;
  double wait_s = 0;
  double busy() const { return end_s - start_s - wait_s; }
};

/// What one rank did.
struct RankRun {
  int rank = 0, stage = 0;  ///< stage: the pipeline index 0..pp-1
  std::vector<exec::HostTensor>
      outputs;  ///< local pieces of the graph outputs (empty off the last stage)
  std::vector<ActionTime> actions;  ///< of the last step (the first one also warms caches up)
  exec::ExecStats stats;
  double seconds = 0;                ///< the last step: schedule start to last action end
  std::vector<double> step_seconds;  ///< every step, in order
};

/// The ranks' inputs: per micro-batch, the rank's slice of every graph input its partition declares
/// (names in `wanted`, in that order). Errors: bad_input naming a missing or mis-shaped input.
Expected<std::vector<std::vector<exec::HostTensor>>> rank_inputs(
    const shard::Manifest& m, int rank, const std::vector<exec::GraphIO>& wanted,
    const std::vector<exec::HostTensor>& global_inputs);

/// Runs `rank` of the sharded job on transport `t` with opened `backends` (steps 2-4 above), with
/// `offload` for its executor (OffloadConfig{}: none).
Expected<RankRun> run_rank(const shard::Manifest& m, const ShardedRunOptions& o, comm::Transport& t,
                           const exec::Backends& backends,
                           const std::vector<exec::HostTensor>& global_inputs,
                           const exec::OffloadConfig& offload = {});

/// The pipeline index (0..pp-1) of `rank` in the manifest (bad_input when absent).
Expected<int> stage_of(const shard::Manifest& m, int rank);
/// Distinct ranks of the manifest (entries are per rank and model chunk).
int rank_count(const shard::Manifest& m);

/// The global outputs from every rank's RankRun::outputs (indexed by rank; empty for ranks without
/// outputs). bad_input when no rank holds some slice of an output, or when a piece has the wrong
/// shape.
Expected<std::vector<exec::HostTensor>> assemble_outputs(
    const shard::Manifest& m, const std::vector<std::vector<exec::HostTensor>>& per_rank);

/// All ranks on threads in this process (the in-process transport); returns the assembled outputs.
struct SimulatedRun {
  std::vector<exec::HostTensor> outputs;
  std::vector<RankRun> ranks;
  double seconds = 0;
};
Expected<SimulatedRun> run_sharded_in_process(const shard::Manifest& m, const ShardedRunOptions& o,
                                              const std::vector<exec::HostTensor>& global_inputs);

/// Measured pipeline bubble of a run: 1 - (busiest rank's compute time, Recv waits excluded) /
/// (makespan over all ranks). 0 when there is one stage.
double measured_bubble(const std::vector<RankRun>& ranks);

/// "step: 0.412 s (slowest rank, 4 micro-batches); stage compute 0.19 / 0.20 s; pipeline bubble
/// measured 0.21, schedule's 0.20 (1f1b, p=2, m=4)" — the measured bubble (of the last step) next
/// to bubble_fraction() of the schedule. With several steps: the median step (slowest rank per
/// step) and the first one.
std::string format_step_timing(const std::vector<RankRun>& ranks, const PipelineSchedule& schedule);

}  // namespace hp::job
