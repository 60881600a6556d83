// Data- and pipeline-parallel training jobs (train_run.h): the ranks as threads of this process, as
// an mpirun job, and one rank of that job. Every rank runs hp::train::train() with the same options
// and the recipe's data-parallel group (hp/train/data_parallel.h) or its pipeline stage
// (hp/train/pipeline.h, train_pipeline.cpp); the first rank prints and writes the metrics,
// checkpoints and saved model.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "hp/job/launcher.h"
#include "hp/job/train_run.h"
#include "hp/train/trace.h"
#include "worker_internal.h"

namespace hp::job {
namespace fs = std::filesystem;

namespace {

std::int64_t bucket_bytes(const recipe::Parallel& p) {
  return std::max<std::int64_t>(4, static_cast<std::int64_t>(p.bucket_mb * 1024 * 1024));
}

}  // namespace

train::DataParallel data_parallel_of(const recipe::Recipe& r, comm::Transport& t) {
  train::DataParallel dp;
  dp.transport = &t;
  for (int k = 0; k < t.size(); ++k) dp.group.push_back(k);
  dp.zero = r.parallel.optimizer_shard;
  dp.shard = static_cast<int>(r.parallel.shard_group);
  dp.bucket_bytes = bucket_bytes(r.parallel);
  dp.gather_per_step = r.parallel.zero3_per_step;
  return dp;
}

train::ExpertParallel expert_parallel_of(const recipe::Recipe& r, comm::Transport& t) {
  train::ExpertParallel ep;
  ep.transport = &t;
  const int ranks = t.size(), size = static_cast<int>(r.parallel.expert_parallel);
  const int me = t.rank(), first = me / size * size;
  for (int k = 0; k < ranks; ++k) {
    ep.data.push_back(k);
    if (k % size == me % size) ep.replicas.push_back(k);
  }
  for (int k = first; k < first + size; ++k) ep.group.push_back(k);
  ep.zero = r.parallel.optimizer_shard;
  ep.shard = static_cast<int>(r.parallel.shard_group);
  ep.bucket_bytes = bucket_bytes(r.parallel);
  ep.routed = r.parallel.routed_experts;
  ep.gather_per_step = r.parallel.zero3_per_step;
  return ep;
}

namespace {

// Each rank's role: its pipeline stage, tensor-parallel part, expert group or data-parallel group.
Status place_rank(const recipe::Recipe& r, comm::Transport& t, train::TrainOptions& to) {
  if (r.parallel.pp > 1) return pipeline_rank(r, t, to);
  if (r.parallel.tp > 1) return tensor_parallel_rank(r, t, to);
  if (r.parallel.expert_parallel > 1)
    to.ep = expert_parallel_of(r, t);
  else
    to.dp = data_parallel_of(r, t);
  return {};
}

// "pipeline x tensor x expert x data-parallel", ...: what the ranks are.
std::string kinds(const recipe::Parallel& p) {
  std::string s;
  for (auto [degree, name] : {std::pair{p.pp, "pipeline"},
                              {p.tp, "tensor"},
                              {p.expert_parallel, "expert"},
                              {p.dp, "data"}})
    if (degree > 1) s += (s.empty() ? "" : " x ") + std::string(name);
  return (s.empty() ? std::string("data") : s) + "-parallel";
}

std::string closing_lines(const train::TrainReport& rep) {
  if (!rep.summary.empty()) return rep.summary;
  if (rep.steps.empty()) return "";
  return fmt::format("trained steps {}-{}: loss {:.6g} -> {:.6g}, median step {:.4f} s\n",
                     rep.steps.front().step, rep.steps.back().step, rep.steps.front().loss,
                     rep.steps.back().loss, rep.median_step_seconds);
}

}  // namespace

Expected<LaunchReport> train_as_rank(const Job& job, train::TrainOptions to,
                                     const fs::path& run_dir) {
  HP_ASSIGN_OR_RETURN(comm::Transport * world, comm::mpi_world());
  HP_TRY(record_rank_pid(run_dir, world->rank()));
  if (world->size() != job.recipe.ranks())
    return Error(Errc::bad_input,
                 fmt::format("the recipe trains on {} ranks, the job has {}", job.recipe.ranks(),
                             world->size()),
                 job.recipe_path.string());
  HP_TRY(place_rank(job.recipe, *world, to));
  if (!to.trace.empty()) to.trace = train::trace_part(to.trace, world->rank());
  HP_ASSIGN_OR_RETURN(train::TrainReport rep, train::train(to));
  comm::mpi_finalize();
  LaunchReport r;
  if ((!to.pp.active() || to.pp.stage == 0) && to.dp.index() <= 0 && to.tp.index() <= 0 &&
      to.ep.part() <= 0)
    r.summary = closing_lines(rep);  // once, from the lead rank
  return r;
}

Expected<LaunchReport> train_in_process(const Job& job, train::TrainOptions to) {
  const int ranks = static_cast<int>(job.recipe.ranks());
  // Each rank's executor gets its share of the cores unless --threads says otherwise.
  if (to.threads <= 0)
    to.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks);
  train::TrainReport lead;
  std::mutex mu;
  const auto t0 = std::chrono::steady_clock::now();
  HP_TRY(comm::run_in_process(
      ranks,
      [&](int rank, comm::Transport& t) -> Status {
        train::TrainOptions mine = to;
        HP_TRY(place_rank(job.recipe, t, mine));
        if (!to.trace.empty()) mine.trace = train::trace_part(to.trace, rank);
        HP_ASSIGN_OR_RETURN(train::TrainReport rep, train::train(mine));
        if (rank == 0) {
          std::lock_guard<std::mutex> lock(mu);
          lead = std::move(rep);
        }
        return {};
      },
      // A step of a large model can take minutes; the in-process transport only bounds a wait.
      3600));
  if (!to.trace.empty()) HP_TRY(train::merge_traces(to.trace, ranks));
  LaunchReport r;
  r.summary = closing_lines(lead);
  r.summary += fmt::format(
      "{} {} ranks simulated as threads of this process ({} thread(s) each) in "
      "{:.2f} s\n",
      ranks, kinds(job.recipe.parallel), to.threads,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return r;
}

Expected<LaunchReport> train_over_mpi(const Job& job, const LaunchOptions& o) {
  HP_ASSIGN_OR_RETURN(JobOptions jo, job_options(job, o));
  // The ranks get this command line's training options; paths absolute, since a rank's working
  // directory is not guaranteed on a cluster.
  auto& a = jo.extra_args;
  auto path = [&](const char* flag, const fs::path& p) {
    if (!p.empty()) a.insert(a.end(), {flag, fs::absolute(p).string()});
  };
  auto number = [&](const char* flag, auto v, bool given) {
    if (given) a.insert(a.end(), {flag, std::to_string(v)});
  };
  path("--data", o.data);
  number("--token-bytes", o.token_bytes, o.token_bytes != 0);
  number("--seed", o.seed, o.seed >= 0);
  path("--metrics", o.metrics);
  path("--trace", o.trace);
  path("--save-model", o.save_model);
  path("--checkpoint", o.checkpoint_dir);
  number("--checkpoint-every", o.checkpoint_every, o.checkpoint_every != 0);
  path("--resume", o.resume_dir);
  number("--log-every", o.log_every, o.log_every != 0);
  number("--steps", o.steps, o.steps > 0);
  if (o.force) a.push_back("--force");
  if (!o.backend.empty()) a.insert(a.end(), {"--backend", o.backend});
  HP_ASSIGN_OR_RETURN(auto plan, plan_job(job, jo, probe_host()));
  auto sink = o.sink ? o.sink : [](bool, const std::string&) {};
  if (o.verbose) announce_job(plan, sink);
  if (o.run_dir.empty()) {  // older default run directories go, as for a forward job
    std::error_code ec;
    fs::create_directories(jo.run_dir, ec);
    HP_TRY(prune_runs(fs::absolute(jo.run_dir)));
  }
  HP_ASSIGN_OR_RETURN(auto ran, run_job(plan, jo, sink));
  if (!o.trace.empty()) HP_TRY(train::merge_traces(fs::absolute(o.trace), ran.ranks));
  LaunchReport r;
  r.summary = fmt::format("{} {} ranks trained (mpirun) in {:.2f} s; logs in {}\n", ran.ranks,
                          kinds(job.recipe.parallel), ran.seconds, ran.log_dir.string());
  return r;
}

}  // namespace hp::job
