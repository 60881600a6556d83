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
#include <fstream>
#include <regex>

#include "hp/core/fs.h"
#include "hp/core/interrupt.h"
#include "hp/job/group_flow.h"
#include "hp/job/job.h"
#include "hp/job/launcher.h"
#include "hp/job/predict.h"
#include "hp/job/sharded.h"
#include "hp/job/train_run.h"
#include "hp/job/worker.h"
#include "hp/plugin/registry.h"
#include "hp/recipe/recipe.h"
#include "hp/recipe/verify.h"
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

std::filesystem::path runs_root() {
  const char* env = std::getenv("HP_RUNS_DIR");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path("hp-runs");
}

std::filesystem::path default_run_dir(const recipe::Recipe& r,
                                      const std::filesystem::path& recipe_path) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  const std::string name = r.name.empty() ? recipe_path.stem().string() : r.name;
  return runs_root() / fmt::format("{}-{}-{}", name, stamp, ::getpid());
}

Status prune_runs(const std::filesystem::path& current) {
  namespace fs = std::filesystem;
  long keep = 10;
  if (const char* env = std::getenv("HP_KEEP_RUNS"); env && *env) {
    char* end = nullptr;
    keep = std::strtol(env, &end, 10);
    if (*end != '\0' || keep < 0)
      return Error(Errc::usage, fmt::format("HP_KEEP_RUNS='{}' is not a number of runs", env), "",
                   "set it to a whole number (0 keeps every run)");
  }
  if (keep == 0) return {};
  // Only directories named as default_run_dir names them: anything else there is the user's.
  static const std::regex ours(R"(.+-\d{8}-\d{6}-\d+)");
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> runs;
  for (fs::directory_iterator it(current.parent_path(), ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!it->is_directory(ec) || !std::regex_match(name, ours)) continue;
    if (fs::equivalent(it->path(), current, ec)) continue;
    runs.emplace_back(fs::last_write_time(it->path(), ec), it->path());
  }
  std::sort(runs.begin(), runs.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  // The current run counts as one of the `keep`.
  for (std::size_t k = static_cast<std::size_t>(keep - 1); k < runs.size(); ++k)
    fs::remove_all(runs[k].second, ec);
  return {};
}

namespace {
constexpr const char* kKeptMark = ".hp-kept";
}  // namespace

TempDir::TempDir() {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path();
  // Scratch directories of verify runs that were SIGKILLed (their PID is gone) go first.
  static const std::regex stale(R"(hp-verify-(\d{1,9})-\d+)");
  std::error_code ec;
  std::vector<fs::path> gone;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, stale) && process_gone(std::stol(m[1])) &&
        !fs::exists(it->path() / kKeptMark, ec))
      gone.push_back(it->path());
  }
  for (const auto& g : gone) fs::remove_all(g, ec);
  path = root / fmt::format("hp-verify-{}-{}", ::getpid(),
                            std::chrono::steady_clock::now().time_since_epoch().count());
  fs::create_directories(path);
  on_signal = std::make_unique<TemporaryGuard>(path);
}

TempDir::~TempDir() {
  std::error_code ec;
  // A failed job's directory stays for inspection (marked so that no later run sweeps it), but
  // not one of a run the user interrupted.
  if (keep && interrupted_signal() == 0) {
    std::ofstream(path / kKeptMark) << "kept by hp verify for inspection\n";
    return;
  }
  std::filesystem::remove_all(path, ec);
}

Error with_kept_dir(Error e, const std::filesystem::path& dir) {
  if (interrupted_signal() != 0) return e;  // ~TempDir removes it
  e.what.hint += fmt::format("{}the run directory {} is kept for inspection",
                             e.what.hint.empty() ? "" : "; ", dir.string());
  return e;
}

void announce_job(const JobPlan& plan, const LineSink& sink) {
  std::string cmd;
  for (const auto& [k, v] : plan.launcher_env) cmd += shell_quote(k + "=" + v) + " ";
  for (std::size_t i = 0; i < plan.argv.size(); ++i)
    cmd += (i ? " " : "") + shell_quote(plan.argv[i]);
  sink(true, "hp: launching: " + cmd);
  sink(true, fmt::format("hp: rank logs: {}/logs/rank-{{0..{}}}.log", plan.run_dir.string(),
                         plan.total_ranks - 1));
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
  if (!o.mpi_args.empty()) {
    HP_ASSIGN_OR_RETURN(jo.launcher_args, split_words(o.mpi_args, "--mpi-args"));
  }
  if (o.nproc_per_node > 0) {
    // torchrun's --nproc-per-node: the recipe fixes the rank count, so on one host the two must
    // agree; across a hostfile's nodes it places that many ranks per node.
    int total = 0;
    for (const auto& g : job.groups()) total += static_cast<int>(g.ranks.size());
    if (o.hostfile.empty() && o.nproc_per_node != total)
      return Error(Errc::usage,
                   fmt::format("--nproc-per-node {} on one host, but the recipe runs {} rank(s)",
                               o.nproc_per_node, total),
                   job.recipe_path.string(),
                   "the recipe sets the rank count ([parallel] dp*tp*pp, or its [[groups]]); "
                   "drop --nproc-per-node, or give --hostfile to spread the ranks over nodes");
    if (!o.hostfile.empty() && total % o.nproc_per_node != 0)
      return Error(Errc::usage,
                   fmt::format("the recipe's {} rank(s) do not fill nodes of --nproc-per-node {}",
                               total, o.nproc_per_node),
                   job.recipe_path.string());
    if (!o.hostfile.empty() && o.launcher == "mpirun")
      jo.launcher_args.insert(jo.launcher_args.begin(),
                              {"--npernode", std::to_string(o.nproc_per_node)});
    if (!o.hostfile.empty() && o.launcher == "slurm")
      jo.launcher_args.insert(jo.launcher_args.begin(),
                              "--ntasks-per-node=" + std::to_string(o.nproc_per_node));
  }
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

// One rank of the job: a rank of a training job trains (train_run.h); any other rank runs its
// forward schedule.
Expected<LaunchReport> run_rank(const LaunchOptions& o) {
  if (auto job = load_job(o.target, o.preset_dirs); job && job->recipe.train)
    return launch_train(*job, o);
  WorkerOptions w{o.target, o.run_dir, o.inputs, o.threads, o.plugin_paths, std::max(o.steps, 1)};
  HP_ASSIGN_OR_RETURN(auto rep, run_worker(w));
  LaunchReport r;
  r.stats = rep.stats;
  r.summary = rep.summary();
  return r;
}

Expected<LaunchReport> launch_recipe(const LaunchOptions& o) {
  if (o.worker) {
    // A rank must not outlive its launcher: if mpirun (or orted) dies, even by SIGKILL, it stops.
    start_parent_watchdog();
    auto r = run_rank(o);
    if (!r) record_rank_exit(o.run_dir, r.error());
    return r;
  }
  if (!o.dtype.empty())
    return Error(Errc::usage, "--dtype applies to MODEL.onnx; a recipe's ranks compute in float32",
                 o.target.string());
  if (o.profile)
    return Error(Errc::usage, "--profile applies to MODEL.onnx", o.target.string(),
                 "a recipe's ranks report their step times; a training recipe takes --trace FILE");
  // The checks `hp verify --static` and `hp shard` apply (the cluster, the ranks on it, the model
  // file), before any rank starts.
  HP_TRY(recipe::check_recipe_before_use(o.target, o.preset_dirs));
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
  // --outputs is checked now, not after the job: it must never be an input, the run directory or
  // a directory of the user's (docs/hardening.md, "Output directories and signals").
  OutputDirOptions guard{"hp launch", {o.target, o.inputs, o.shard_dir}, {jo.run_dir}, {}, o.force};
  for (const auto& g : job.groups()) guard.inputs.push_back(job.module_path(g));
  if (!o.outputs.empty()) HP_TRY(check_output_dir(o.outputs, guard));
  LaunchReport r;
  if (o.dry_run) {
    // The printed command reads the app file, so it is written: the command runs as printed.
    std::error_code ec;
    std::filesystem::create_directories(plan.run_dir, ec);
    if (ec)
      return Error(Errc::runtime, "cannot create the run directory: " + ec.message(),
                   plan.run_dir.string());
    HP_TRY(write_file_atomic(plan.run_dir / plan.app_file_name, plan.app_file));
    if (o.run_dir.empty()) HP_TRY(prune_runs(plan.run_dir));  // a dry run's directory is a run's
    r.summary = format_dry_run(plan);
    nlohmann::ordered_json j{{"mode", "dry-run"},
                             {"ranks", plan.total_ranks},
                             {"groups", plan.contexts.size()},
                             {"run_dir", plan.run_dir.string()},
                             {"app_file", (plan.run_dir / plan.app_file_name).string()},
                             {"argv", plan.argv}};
    r.json = j.dump();
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
  if (o.verbose) announce_job(plan, sink);
  // Older default run directories go once this one exists; a --run-dir is the user's to keep.
  if (o.run_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(jo.run_dir, ec);
    HP_TRY(prune_runs(std::filesystem::absolute(jo.run_dir)));
  }
  auto ran = run_job(plan, jo, sink);
  if (!ran) return std::move(ran).error();
  nlohmann::ordered_json j{{"mode", "recipe"},
                           {"ranks", ran->ranks},
                           {"groups", plan.contexts.size()},
                           {"seconds", ran->seconds},
                           {"run_dir", plan.run_dir.string()},
                           {"log_dir", ran->log_dir.string()}};
  r.summary = fmt::format("job of {} rank(s) in {} group(s) finished in {:.2f} s; logs in {}\n",
                          ran->ranks, plan.contexts.size(), ran->seconds, ran->log_dir.string());
  if (sharded) {
    auto timing = read_timing(jo.run_dir, ran->ranks);
    if (timing) {
      r.summary += format_step_timing(*timing, job.schedule.lowered);
      // Rank 0's step times: the repeats of --steps, the first one paying for first-run work.
      if (!timing->empty()) j["step_seconds"] = timing->front().step_seconds;
    }
    auto predicted = job.cluster ? predicted_step_seconds(job.recipe, job.base_dir, *job.cluster)
                                 : Expected<double>(Error(Errc::bad_input, job.cluster_problem));
    if (predicted) {
      j["predicted_step_seconds"] = *predicted;
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
    HP_TRY(write_tensor_dir(o.outputs, *outs, "output", guard));
    r.summary += fmt::format("wrote {} output{} to {}\n", outs->size(),
                             outs->size() == 1 ? "" : "s", o.outputs.string());
    j["outputs_dir"] = o.outputs.string();
    j["outputs"] = outputs_json(*outs);
  }
  r.json = j.dump();
  return r;
}

Expected<LaunchReport> launch(const LaunchOptions& o) {
  if (o.target.extension() == ".toml") return launch_recipe(o);
  if (o.target.extension() != ".onnx")
    return Error(Errc::usage,
                 fmt::format("'{}' is neither a RECIPE.toml nor a MODEL.onnx", o.target.string()));
  return launch_model(o);
}

}  // namespace hp::job
