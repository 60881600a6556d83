// The rank side of `hp launch RECIPE.toml`: what every MPI rank runs (`hp launch RECIPE --worker`,
// started by mpirun with HP_GROUP_INDEX etc. in its environment, see launcher.h).
//
// A worker: initialises MPI, finds its group (HP_GROUP_INDEX, cross-checked with MPI_APPNUM; by
// rank when unset, as under srun), records its PID under RUN/pids, opens its group's backend, loads
// the group's module (an ONNX file; a shard manifest's per-rank file later) and prepares the
// executor with the MPI comm ops. Then it executes its pipeline schedule's action list: when the
// recipe has pp > 1 and the job has dp*tp*pp ranks (laid out tp fastest, then pp, then dp: stage =
// (rank / tp) % pp), the rank runs its stage's list of the recipe's schedule (gpipe / 1f1b) over
// [parallel] micro_batches, splitting its inputs along axis 0; the hp.Send / hp.Recv nodes of the
// partition carry the SEND/RECV actions, with tags offset per micro-batch. Otherwise it runs one
// forward. Its outputs (micro-batches concatenated along axis 0) go to RUN/outputs/rank-N/.
// A recipe whose groups exchange tensors (group_flow.h) runs instead: inputs received from the
// producer groups, one forward, outputs sent to the consumer groups; the scheduler rank runs no
// model.
//
// Errors are returned; the caller prints them and must then call mpi_abort(exit code), never return
// normally: a rank that finalises and exits non-zero while others wait hangs the job.
//
// Fault injection (for tests/mpi): HP_TEST_FAULT=segv in a group's env makes its ranks crash, =hang
// makes them block forever, right after start-up.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/executor.h"

namespace hp::job {

struct WorkerOptions {
  std::filesystem::path recipe;
  std::filesystem::path run_dir;
  std::filesystem::path inputs;  ///< may be empty: the module then needs no graph inputs
  int threads = 0;
  std::vector<std::filesystem::path> plugin_paths;
  int steps = 1;  ///< sharded ranks: repeat the schedule (hp launch --steps, for benchmarks)
};

struct WorkerReport {
  int rank = 0, ranks = 0;
  std::string group;
  int forwards = 0;  ///< forward actions executed
  double seconds = 0;
  exec::ExecStats stats;
  std::string summary() const;
};

/// Runs this rank (see the file comment) and finalises MPI on success.
Expected<WorkerReport> run_worker(const WorkerOptions& o);

/// The directory a rank writes its outputs to.
std::filesystem::path rank_output_dir(const std::filesystem::path& run_dir, int rank);

}  // namespace hp::job
