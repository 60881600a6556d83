// `hp launch RECIPE.toml` for a recipe with a [train] table: the recipe and the command line turned
// into one hp::train::train() run on this process, or one such run per rank of an MPI or
// in-process job (docs/training.md). What is not trained yet (expert parallelism with tp, [train]
// with [[groups]]) is Errc::not_implemented, so a recipe is refused rather than trained otherwise.
#pragma once

#include <memory>
#include <string>

#include "hp/comm/comm.h"
#include "hp/core/expected.h"
#include "hp/job/job.h"
#include "hp/job/launch.h"
#include "hp/train/trainer.h"

namespace hp::shard {
struct Prepared;
}

namespace hp::job {

/// The name of the first training-only option `o` sets (--data, --metrics, ...), or "" when none:
/// launch() refuses them where nothing trains.
std::string training_option_given(const LaunchOptions& o);

/// The training run of `job` (whose recipe has [train]) under the command line `o`:
///  - the model resolved against the recipe's directory;
///  - the loss, logits, labels and frozen globs of [train]; the blocks recomputed in the backward
///    are the stages' layers whose recompute_of() is not none;
///  - the optimizer and its schedule from [train] (total steps = the steps run);
///  - --steps and --seed over [train]'s steps and seed;
///  - the batch and sequence length of --data windows from [workload] global_batch and seq, else
///    [model] dims batch and seq.
/// Errors: not_implemented for more than one rank or [[groups]]; usage for neither or both of
/// --inputs and --data, and for options of distributed jobs (--outputs, --shard-dir, --hostfile,
/// --launcher, --timeout, --run-dir); bad_input for a data or --resume path that does not exist,
/// or --data without a batch and sequence length in the recipe.
Expected<train::TrainOptions> train_options(const Job& job, const LaunchOptions& o);

/// A one-paragraph description of `t` (what --dry-run prints for a training recipe).
std::string format_train_options(const train::TrainOptions& t);

/// Trains: train_options(), then train::train(); the summary is the run's closing lines. With
/// --dry-run, the summary is format_train_options() and nothing runs. A recipe with dp > 1 trains
/// on dp ranks (data_parallel.h): an mpirun job whose ranks run `hp launch RECIPE --worker` with
/// the same training options (train_over_mpi), or threads of this process with --simulate
/// (train_in_process); a --worker process is one such rank (train_as_rank).
Expected<LaunchReport> launch_train(const Job& job, const LaunchOptions& o);

// The data-parallel runs behind launch_train (train_ranks.cpp).

/// The data-parallel group of `recipe` for the ranks of `transport`: every rank, in order, with
/// the recipe's optimizer_shard and shard_group.
train::DataParallel data_parallel_of(const recipe::Recipe& recipe, comm::Transport& transport);
/// The expert-parallel groups of `recipe` (expert_parallel > 1) for the ranks of `transport`:
/// consecutive blocks of expert_parallel data-parallel ranks, and the ranks at the same position
/// of every block.
train::ExpertParallel expert_parallel_of(const recipe::Recipe& recipe, comm::Transport& transport);
/// This process as one rank of an mpirun training job (MPI is finalised on success); it records its
/// PID under `run_dir`/pids so that an interrupted job's ranks are found and stopped.
Expected<LaunchReport> train_as_rank(const Job& job, train::TrainOptions to,
                                     const std::filesystem::path& run_dir);
/// dp ranks on threads exchanging through shared memory; the report is rank 0's.
Expected<LaunchReport> train_in_process(const Job& job, train::TrainOptions to);
/// The mpirun job: the ranks get this command line's training options (paths made absolute).
Expected<LaunchReport> train_over_mpi(const Job& job, const LaunchOptions& o);

// Pipeline parallelism (train_pipeline.cpp; hp/train/pipeline.h).

/// to.pp from a recipe with pp > 1: the stage boundaries (hp shard's plan of the recipe's
/// [[stages]]), micro-batches, whether the backward splits (zb-h1) and to.pp.grid, where the
/// ranks are (hp shard's stage ranks: grid[stage][data-parallel index]).
/// Errc::not_implemented for a schedule other than gpipe, 1f1b, zb-h1 or a tensor that skips a
/// stage; Errc::bad_input for stages that do not cut the model (shard's errors, or nothing
/// crossing).
Status pipeline_options(const Job& job, train::TrainOptions& to);
/// The compute actions of pipeline position `position` under the recipe's schedule (what
/// pipeline_rank gives a rank), `pp` as pipeline_options made it with its ranks set.
Expected<std::vector<train::PipelineAction>> pipeline_actions(const recipe::Recipe& recipe,
                                                              const train::PipelineRole& pp,
                                                              int position);
/// --timeline: the last step of a pipeline job's merged `trace` as measured, above the same step
/// simulated from its schedule with the measured mean F/B/W times (timeline.cpp), written to
/// `svg` atomically; returns the line saying so. Errc::runtime for a trace without pipeline
/// actions.
Expected<std::string> write_timeline(const Job& job, const train::TrainOptions& to,
                                     const std::filesystem::path& trace,
                                     const std::filesystem::path& svg);
/// The rank of `transport` in the job: its pipeline (to.pp: stage, the replica's ranks, its
/// schedule's compute actions) and, with dp > 1, its stage's data-parallel group (to.dp).
Status pipeline_rank(const recipe::Recipe& recipe, comm::Transport& transport,
                     train::TrainOptions& to);

// Tensor parallelism (train_tensor.cpp; hp/train/tensor_parallel.h).

/// to.tp from a recipe with tp > 1: its group (hp shard's stage ranks) and how each member's part
/// is built (hp shard's partition of the recipe, built when the rank asks for it; every rank reads
/// the recipe's model once here). Errc::bad_input for what hp shard refuses.
Status tensor_parallel_options(const Job& job, train::TrainOptions& to);
/// The same from a partitioned recipe (pipeline_options shares its own).
Status tensor_parallel_setup(const Job& job, std::shared_ptr<const shard::Prepared> prepared,
                             train::TrainOptions& to);
/// The rank of `transport` in the job: its tensor-parallel group and mesh position (to.tp) and,
/// with dp > 1, the data-parallel group of its tensor-parallel index (to.dp).
Status tensor_parallel_rank(const recipe::Recipe& recipe, comm::Transport& transport,
                            train::TrainOptions& to);

}  // namespace hp::job
