// Private to run_worker: the two kinds of rank. A recipe without [[groups]] is one sharded model:
// every rank runs its `hp shard` partition (worker_sharded.cpp). A recipe with [[groups]] runs each
// group's own module (worker.cpp).
#pragma once

#include <memory>

#include "hp/comm/comm.h"
#include "hp/core/interrupt.h"
#include "hp/exec/backends.h"
#include "hp/job/job.h"
#include "hp/job/launch.h"
#include "hp/job/launcher.h"
#include "hp/job/worker.h"
#include "hp/model/model.h"
#include "hp/recipe/recipe.h"

namespace hp::job {

/// A group's backends (errors name the group) and its module (an ONNX file, relative to the
/// recipe), loaded with its weights.
struct GroupModule {
  exec::Backends backends;
  model::Model model;
  std::filesystem::path path;  ///< the module file, resolved
};
Expected<GroupModule> load_group_module(const WorkerOptions& o, const Job& job,
                                        const recipe::Group& g);

/// Writes RUN/pids/rank-N.pid with this process's PID, so that a stopped job's ranks can be found
/// and killed (launcher_run.cpp: recorded_ranks). Every kind of rank records itself: forward,
/// group and training ranks.
Status record_rank_pid(const std::filesystem::path& run_dir, int rank);

/// Records under `run_dir`/exits the exit code this rank is about to abort with. mpirun's own exit
/// status is a poor witness: a peer it kills while tearing the job down can make it report a
/// signal instead, so the launcher reads the first failing rank's code from here
/// (launcher_run.cpp).
void record_rank_exit(const std::filesystem::path& run_dir, const Error& e);

/// The shard directory of a run: RUN/shard (written by hp launch before it starts the ranks).
std::filesystem::path shard_dir_of(const std::filesystem::path& run_dir);
/// A temporary directory (hp-verify-<pid>-<time> under the system's), removed on scope exit unless
/// `keep` is set (hp verify keeps a failed job's run directory: its error points at the logs
/// there), and by the interrupt handler on SIGINT/SIGTERM (hp/core/interrupt.h). Creating one
/// first removes those of processes that are gone (a SIGKILLed verify).
struct TempDir {
  std::filesystem::path path;
  bool keep = false;
  std::unique_ptr<TemporaryGuard> on_signal;
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};
/// The MPI job's options from the command line: this hp as the ranks' program, the run directory
/// (default_run_dir unless --run-dir), inputs, hostfile, launcher, timeout, threads, root and
/// plugin paths. Errc::internal when /proc/self/exe cannot be read.
/// launch -v: the exact command (with the launcher's environment) and where each rank's log goes,
/// as two stderr lines of `sink`, before the job starts.
void announce_job(const JobPlan& plan, const LineSink& sink);
/// `e` with "; the run directory <dir> is kept" added to its hint (a failed verify's job).
Error with_kept_dir(Error e, const std::filesystem::path& dir);
Expected<JobOptions> job_options(const Job& job, const LaunchOptions& o);
/// Where default run directories go: $HP_RUNS_DIR, else hp-runs (in the working directory).
std::filesystem::path runs_root();
/// Removes the oldest default-named run directories (<name>-YYYYMMDD-HHMMSS-<pid>) beside
/// `current` so that $HP_KEEP_RUNS (default 10; 0 keeps all) remain, `current` included. Other
/// entries are never touched. Errc::usage for an HP_KEEP_RUNS that is not a whole number.
Status prune_runs(const std::filesystem::path& current);
/// <runs_root()>/<recipe name>-<time>-<pid>: where a job writes when --run-dir is not given.
std::filesystem::path default_run_dir(const recipe::Recipe& r,
                                      const std::filesystem::path& recipe_path);

/// Runs this rank's partition (sharded.h run_rank), writes its outputs to rank_output_dir and its
/// action times to RUN/timing/rank-N.json. `rep` comes in with rank, ranks and group set.
Expected<WorkerReport> run_sharded_worker(const WorkerOptions& o, Job& job, comm::Transport& t,
                                          WorkerReport rep);

/// Runs this rank of a recipe whose groups exchange tensors (group_flow.h): group `group` of `r`,
/// the scheduler or a module group. Finalises MPI on success. `rep` as for run_sharded_worker.
Expected<WorkerReport> run_flow_worker(const WorkerOptions& o, const Job& job, std::size_t group,
                                       comm::Transport& t, WorkerReport rep);

}  // namespace hp::job
