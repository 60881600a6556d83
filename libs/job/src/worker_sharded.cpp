// A rank of a sharded job (worker_internal.h): its partition from RUN/shard, the recipe's inputs
// sliced for it, its stage's schedule, its outputs and action times written for the launcher.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "hp/core/fs.h"
#include "hp/exec/tensor.h"
#include "hp/job/job.h"
#include "hp/job/offload_run.h"
#include "hp/job/sharded.h"
#include "worker_internal.h"

namespace hp::job {
using comm::mpi_finalize;
using comm::Transport;
using exec::HostTensor;
using exec::open_backends;
using exec::read_tensor_dir;
using exec::write_tensor_dir;
namespace fs = std::filesystem;

fs::path shard_dir_of(const fs::path& run_dir) { return run_dir / "shard"; }

Expected<WorkerReport> run_sharded_worker(const WorkerOptions& o, Job& job, Transport& t,
                                          WorkerReport rep) {
  if (o.run_dir.empty())
    return Error(Errc::usage, "a sharded rank needs the run directory (HP_RUN_DIR / --run-dir)");
  const recipe::Recipe& r = job.recipe;
  ShardedRunOptions so;
  so.shard_dir = shard_dir_of(o.run_dir);
  so.schedule = job.schedule.lowered;
  so.threads = o.threads;
  so.steps = o.steps;
  so.plugin_paths = o.plugin_paths;
  HP_TRY(attach_manifest(job,
                         so.shard_dir));  // the manifest, read once and checked against the recipe
  const shard::Manifest& m = *job.manifest;
  if (rank_count(m) != t.size())
    return Error(
        Errc::bad_input,
        fmt::format("the partitions are for {} ranks, the job has {}", rank_count(m), t.size()),
        (so.shard_dir / "manifest.toml").string());
  // The recipe's [offload] section for this rank's stage: the budget goes to the backend (enforced
  // by the cpu plugin), the schedule to the executor (offload_run.h).
  HP_ASSIGN_OR_RETURN(auto stage, stage_of(m, rep.rank));
  auto off = offload_run_for(r, stage, so.backend);
  if (!off) return std::move(off).error();
  auto backends = open_backends(so.backend, so.threads, so.plugin_paths, off->open_options);
  if (!backends) return std::move(backends).error();
  std::vector<HostTensor> inputs;
  if (!o.inputs.empty()) {
    auto given = read_tensor_dir(o.inputs, "input");
    if (!given) return std::move(given).error();
    inputs = std::move(*given);
  }
  auto rr = run_rank(m, so, t, *backends, inputs, off->exec);
  if (!rr) return std::move(rr).error();
  if (!rr->outputs.empty())
    HP_TRY(write_tensor_dir(rank_output_dir(o.run_dir, rep.rank), rr->outputs));
  nlohmann::json j = {{"rank", rep.rank},
                      {"stage", rr->stage},
                      {"seconds", rr->seconds},
                      {"steps", rr->step_seconds}};
  for (const auto& a : rr->actions)
    j["actions"].push_back({{"micro_batch", a.micro_batch},
                            {"start", a.start_s},
                            {"end", a.end_s},
                            {"wait", a.wait_s}});
  std::error_code ec;
  fs::create_directories(o.run_dir / "timing", ec);
  HP_TRY(write_file_atomic(o.run_dir / "timing" / fmt::format("rank-{}.json", rep.rank),
                           j.dump() + "\n"));
  rep.forwards = static_cast<int>(rr->actions.size());
  rep.stats = rr->stats;
  rep.seconds = rr->seconds;
  mpi_finalize();
  return rep;
}

}  // namespace hp::job
