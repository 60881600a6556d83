// hp launch MODEL.onnx and hp verify MODEL.onnx: open the backends, load the model with its
// weights, prepare the executor (which lists unsupported ops before any work), bind the input
// files, run, and write or compare the outputs.
#include "hp/job/launch.h"

#include <fmt/core.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>

#include "hp/core/fs.h"
#include "hp/job/group_flow.h"
#include "hp/job/job.h"
#include "hp/job/launcher.h"
#include "hp/job/predict.h"
#include "hp/job/sharded.h"
#include "hp/job/train_run.h"
#include "hp/job/worker.h"
#include "hp/plugin/registry.h"
#include "hp/recipe/recipe.h"
#include "hp/shard/shard.h"
#include "single_rank.h"
#include "worker_internal.h"

namespace hp::job {
using exec::Backends;
using exec::bind_inputs;
using exec::compare_tensors;
using exec::ExecStats;
using exec::Executor;
using exec::GraphIO;
using exec::HostTensor;
using exec::open_backends;
using exec::read_tensor_dir;
using exec::write_tensor_dir;

std::filesystem::path default_run_dir(const recipe::Recipe& r,
                                      const std::filesystem::path& recipe_path) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  const std::string name = r.name.empty() ? recipe_path.stem().string() : r.name;
  return std::filesystem::path("hp-runs") / fmt::format("{}-{}-{}", name, stamp, ::getpid());
}

TempDir::TempDir() {
  path = std::filesystem::temp_directory_path() /
         fmt::format("hp-verify-{}-{}", ::getpid(),
                     std::chrono::steady_clock::now().time_since_epoch().count());
  std::filesystem::create_directories(path);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

Expected<JobOptions> job_options(const Job& job, const LaunchOptions& o) {
  JobOptions jo;
  jo.recipe = job.recipe_path;
  std::error_code ec;
  jo.worker = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec)
    return Error(Errc::internal,
                 "cannot find the hp executable (/proc/self/exe) to start the ranks with");
  jo.run_dir = o.run_dir.empty() ? default_run_dir(job.recipe, job.recipe_path) : o.run_dir;
  jo.inputs = o.inputs;
  jo.hostfile = o.hostfile;
  jo.launcher = o.launcher;
  jo.timeout_s = o.timeout_s;
  jo.threads = o.threads;
  jo.allow_run_as_root = o.allow_run_as_root;
  jo.plugin_paths = o.plugin_paths;
  return jo;
}

namespace {

// Each group's outputs from the lowest of its ranks that wrote any, in recipe group order; a name
// already gathered from an earlier group is not taken again.
Expected<std::vector<HostTensor>> gather_outputs(const recipe::Recipe& r, const JobPlan& plan) {
  std::vector<HostTensor> all;
  for (const auto& c : plan.contexts) {
    const recipe::Group* g =
        r.groups.empty() ? nullptr : &r.groups[static_cast<std::size_t>(c.index)];
    for (int k = c.first_rank; k < c.first_rank + c.ranks; ++k) {
      const auto dir = rank_output_dir(plan.run_dir, k);
      if (!std::filesystem::is_directory(dir)) continue;
      HP_ASSIGN_OR_RETURN(auto outs, read_tensor_dir(dir, "output"));
      for (auto& t : outs) {
        // A scheduler group writes what it collected (its inputs): those are the job's outputs.
        bool wanted = !g || g->outputs.empty() || is_scheduler(*g);
        if (g)
          for (const auto& n : g->outputs) wanted |= n == t.name;
        for (const auto& have : all)
          wanted &= have.name != t.name;  // replicas (TP, DP) hold copies
        if (wanted) all.push_back(std::move(t));
      }
      break;
    }
  }
  return all;
}

// A sharded job's outputs: every rank's pieces put back together by the manifest's layouts.
Expected<std::vector<HostTensor>> gather_sharded_outputs(const Job& job,
                                                         const std::filesystem::path& run_dir,
                                                         int ranks) {
  std::vector<std::vector<HostTensor>> per_rank(static_cast<std::size_t>(ranks));
  for (int k = 0; k < ranks; ++k) {
    const auto dir = rank_output_dir(run_dir, k);
    if (!std::filesystem::is_directory(dir)) continue;
    HP_ASSIGN_OR_RETURN(auto outs, read_tensor_dir(dir, "output"));
    per_rank[static_cast<std::size_t>(k)] = std::move(outs);
  }
  return assemble_outputs(*job.manifest, per_rank);
}

// The ranks' action times (RUN/timing/rank-N.json, written by sharded ranks).
Expected<std::vector<RankRun>> read_timing(const std::filesystem::path& run_dir, int ranks) {
  std::vector<RankRun> out;
  for (int k = 0; k < ranks; ++k) {
    HP_ASSIGN_OR_RETURN(auto text, read_file(run_dir / "timing" / fmt::format("rank-{}.json", k)));
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded())
      return Error(Errc::internal, "unreadable timing file", fmt::format("rank-{}.json", k));
    RankRun r;
    r.rank = j.value("rank", k);
    r.stage = j.value("stage", 0);
    r.seconds = j.value("seconds", 0.0);
    r.step_seconds = j.value("steps", std::vector<double>{});
    if (j.contains("actions"))
      for (const auto& a : j["actions"])
        r.actions.push_back({a.value("micro_batch", 0), a.value("start", 0.0), a.value("end", 0.0),
                             a.value("wait", 0.0)});
    out.push_back(std::move(r));
  }
  return out;
}

// RUN/shard for a sharded job: `hp shard` of the recipe as read into it, or a link to --shard-dir's
// partitions; their manifest is attached to the job (read once, checked against the recipe), and
// the inputs are checked against it here, once, rather than on every rank after mpirun.
Status prepare_shards(Job& job, const LaunchOptions& o, const std::filesystem::path& run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (!o.shard_dir.empty()) {
    HP_TRY(attach_manifest(job, o.shard_dir));
    std::filesystem::create_directory_symlink(std::filesystem::absolute(o.shard_dir),
                                              shard_dir_of(run_dir), ec);
    if (ec)
      return Error(Errc::runtime,
                   "cannot link the partitions into the run directory: " + ec.message(),
                   shard_dir_of(run_dir).string());
  } else {
    HP_ASSIGN_OR_RETURN(auto prepared, shard::prepare(job.recipe, job.where, job.recipe_path));
    HP_ASSIGN_OR_RETURN(auto written, shard::write_partitions(*prepared, shard_dir_of(run_dir)));
    HP_TRY(attach_manifest(job, shard_dir_of(run_dir)));
  }
  const shard::Manifest& m = *job.manifest;
  if (o.inputs.empty()) {
    if (!m.inputs.empty())
      return Error(Errc::usage,
                   fmt::format("the model reads {} graph input(s) ('{}', ...); pass --inputs DIR",
                               m.inputs.size(), m.inputs.front().tensor));
    return {};
  }
  HP_ASSIGN_OR_RETURN(auto given, read_tensor_dir(o.inputs, "input"));
  std::vector<GraphIO> all;
  for (const auto& in : m.inputs) all.push_back({in.tensor, -1, 0, {}, false});
  HP_ASSIGN_OR_RETURN(auto fed, rank_inputs(m, static_cast<int>(m.ranks.front().rank), all, given));
  return {};
}

Expected<LaunchReport> launch_recipe(const LaunchOptions& o) {
  if (o.worker) {
    // A rank of a training job trains (train_run.h); any other rank runs its forward schedule.
    if (auto job = load_job(o.target, o.preset_dirs); job && job->recipe.train)
      return launch_train(*job, o);
    WorkerOptions w{o.target, o.run_dir, o.inputs, o.threads, o.plugin_paths, std::max(o.steps, 1)};
    HP_ASSIGN_OR_RETURN(auto rep, run_worker(w));
    LaunchReport r;
    r.stats = rep.stats;
    r.summary = rep.summary();
    return r;
  }
  // The recipe is read here once; everything below takes the Job.
  HP_ASSIGN_OR_RETURN(Job job, load_job(o.target, o.preset_dirs));
  // A [train] table makes the recipe a training run, decided before anything of the MPI job.
  if (job.recipe.train) return launch_train(job, o);
  if (auto flag = training_option_given(o); !flag.empty())
    return Error(Errc::usage, flag + " applies to a recipe with a [train] table", o.target.string(),
                 "add [train] to the recipe (hp plan --mode train -o writes one) to train it");
  return launch_job(job, o);
}

}  // namespace

Expected<LaunchReport> launch_job(Job& job, const LaunchOptions& o) {
  const recipe::Recipe* rec = &job.recipe;
  HP_ASSIGN_OR_RETURN(JobOptions jo, job_options(job, o));
  if (o.steps < 0) return Error(Errc::usage, "--steps must be at least 1");
  jo.steps = std::max(o.steps, 1);
  if (!o.backend.empty())
    return Error(Errc::usage,
                 "--backend applies to MODEL.onnx; a recipe sets 'backend' per [[groups]] entry");
  HP_ASSIGN_OR_RETURN(auto plan, plan_job(job, jo, probe_host()));
  LaunchReport r;
  if (o.dry_run) {
    r.summary = format_dry_run(plan);
    return r;
  }
  // One sharded model (no [[groups]]): partition it into RUN/shard first; the ranks read it there.
  const bool sharded = job.kind == JobKind::sharded_model;
  if (!sharded && !o.shard_dir.empty())
    return Error(Errc::usage,
                 "--shard-dir applies to a recipe without [[groups]] (one sharded model)");
  if (sharded) {
    // A run directory made here is removed again when the job cannot start: nothing half-made
    // stays.
    std::error_code ec;
    const bool fresh = !std::filesystem::exists(jo.run_dir, ec);
    if (Status st = prepare_shards(job, o, jo.run_dir); !st) {
      if (fresh) std::filesystem::remove_all(jo.run_dir, ec);
      return std::move(st).error();
    }
  }
  auto sink = o.sink ? o.sink : [](bool, const std::string&) {};
  auto ran = run_job(plan, jo, sink);
  if (!ran) return std::move(ran).error();
  r.summary = fmt::format("job of {} rank(s) in {} group(s) finished in {:.2f} s; logs in {}\n",
                          ran->ranks, plan.contexts.size(), ran->seconds, ran->log_dir.string());
  if (sharded) {
    auto timing = read_timing(jo.run_dir, ran->ranks);
    if (timing) r.summary += format_step_timing(*timing, job.schedule.lowered);
    auto predicted = job.cluster ? predicted_step_seconds(job.recipe, job.base_dir, *job.cluster)
                                 : Expected<double>(Error(Errc::bad_input, job.cluster_problem));
    if (predicted) {
      r.summary += fmt::format(
          "plan's prediction: {:.4f} s per step (hp plan's cost model on '{}', inference)\n",
          *predicted, rec->cluster);
      // The model gives every rank a device of its own; ranks sharing cores wait for each other's
      // CPU.
      if (std::find(plan.argv.begin(), plan.argv.end(), "--oversubscribe") != plan.argv.end())
        r.summary += fmt::format(
            "  (here {} ranks share {} cores, which the model does not see: expect the measured "
            "step "
            "above the prediction)\n",
            plan.total_ranks, probe_host().cores);
    } else
      r.summary += fmt::format("plan's prediction: none ({})\n", predicted.error().what.message);
  }
  if (!o.outputs.empty()) {
    auto outs =
        sharded ? gather_sharded_outputs(job, jo.run_dir, ran->ranks) : gather_outputs(*rec, plan);
    if (!outs) return std::move(outs).error();
    HP_TRY(write_tensor_dir(o.outputs, *outs));
    r.summary += fmt::format("wrote {} output{} to {}\n", outs->size(),
                             outs->size() == 1 ? "" : "s", o.outputs.string());
  }
  return r;
}

Expected<LaunchReport> launch(const LaunchOptions& o) {
  if (o.target.extension() == ".toml") return launch_recipe(o);
  if (o.target.extension() != ".onnx")
    return Error(Errc::usage,
                 fmt::format("'{}' is neither a RECIPE.toml nor a MODEL.onnx", o.target.string()));
  if (o.worker) return Error(Errc::usage, "--worker applies to RECIPE.toml");
  if (auto flag = training_option_given(o); !flag.empty())
    return Error(Errc::usage, flag + " applies to a recipe with a [train] table", o.target.string(),
                 "a model runs forward; its recipe's [train] table trains it");
  if (o.dry_run)
    return Error(Errc::usage,
                 "--dry-run applies to RECIPE.toml (a model runs on one rank, no mpirun)");
  if (o.inputs.empty() || o.outputs.empty())
    return Error(Errc::usage, "'hp launch MODEL.onnx' needs --inputs DIR and --outputs DIR");
  HP_ASSIGN_OR_RETURN(
      auto p, prepare_single_rank(o.target, o.inputs, o.backend, o.threads, o.plugin_paths));
  auto outs = p.exec->run(p.inputs);
  if (!outs) return std::move(outs).error();
  HP_TRY(write_tensor_dir(o.outputs, *outs));
  LaunchReport r;
  r.stats = p.exec->stats();
  r.summary = stats_line(r.stats, p.backends.primary->name()) +
              fmt::format("wrote {} output{} to {}\n", outs->size(), outs->size() == 1 ? "" : "s",
                          o.outputs.string());
  return r;
}

}  // namespace hp::job
