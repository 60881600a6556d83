// hp launch MODEL.onnx and hp verify MODEL.onnx: open the backends, load the model with its weights,
// prepare the executor (which lists unsupported ops before any work), bind the input files, run, and
// write or compare the outputs.
#include "hp/job/launch.h"

#include <fmt/core.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>

#include "hp/core/fs.h"
#include "hp/plugin/registry.h"
#include "hp/recipe/presets.h"
#include "hp/recipe/recipe.h"
#include "hp/job/group_flow.h"
#include "hp/job/launcher.h"
#include "hp/job/predict.h"
#include "hp/job/sharded.h"
#include "hp/shard/shard.h"
#include "worker_internal.h"
#include "hp/job/worker.h"

namespace hp::job {
using exec::HostTensor;
using exec::GraphIO;
using exec::ExecStats;
using exec::Executor;
using exec::Backends;
using exec::bind_inputs;
using exec::read_tensor_dir;
using exec::write_tensor_dir;
using exec::compare_tensors;
using exec::open_backends;

namespace {

struct Prepared {
  Backends backends;
  std::unique_ptr<Executor> exec;
  std::vector<HostTensor> inputs;
};

Expected<Prepared> prepare(const std::filesystem::path& model_path, const std::filesystem::path& inputs,
                           const std::string& backend, int threads, const std::vector<std::filesystem::path>& paths) {
  Prepared p;
  auto b = open_backends(backend, threads, paths);
  if (!b) return std::move(b).error();
  p.backends = *b;
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  auto m = model::load_model(model_path, lo);
  if (!m) return std::move(m).error();
  auto ex = Executor::create(*m, {p.backends.primary, p.backends.cpu, nullptr});
  if (!ex) return std::move(ex).error();
  p.exec = std::move(*ex);
  auto given = read_tensor_dir(inputs, "input");
  if (!given) return std::move(given).error();
  auto bound = bind_inputs(p.exec->inputs(), std::move(*given), inputs.string());
  if (!bound) return std::move(bound).error();
  p.inputs = std::move(*bound);
  return p;
}

std::string stats_line(const ExecStats& s, const std::string& backend) {
  return fmt::format("ran {} nodes on {} ({} on the cpu fallback) in {:.3f} s; peak tensor memory {:.2f} MiB "
                     "(weights {:.2f} MiB)\n",
                     s.nodes, backend, s.nodes_on_fallback, s.seconds, static_cast<double>(s.peak_bytes) / (1 << 20),
                     static_cast<double>(s.weight_bytes) / (1 << 20));
}

}  // namespace

namespace {

std::filesystem::path default_run_dir(const recipe::Recipe& r, const std::filesystem::path& recipe_path) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  const std::string name = r.name.empty() ? recipe_path.stem().string() : r.name;
  return std::filesystem::path("hp-runs") / fmt::format("{}-{}-{}", name, stamp, ::getpid());
}

// Each group's outputs from the lowest of its ranks that wrote any, in recipe group order; a name
// already gathered from an earlier group is not taken again.
Expected<std::vector<HostTensor>> gather_outputs(const recipe::Recipe& r, const JobPlan& plan) {
  std::vector<HostTensor> all;
  for (const auto& c : plan.contexts) {
    const recipe::Group* g = r.groups.empty() ? nullptr : &r.groups[static_cast<std::size_t>(c.index)];
    for (int k = c.first_rank; k < c.first_rank + c.ranks; ++k) {
      const auto dir = rank_output_dir(plan.run_dir, k);
      if (!std::filesystem::is_directory(dir)) continue;
      auto outs = read_tensor_dir(dir, "output");
      if (!outs) return std::move(outs).error();
      for (auto& t : *outs) {
        // A scheduler group writes what it collected (its inputs): those are the job's outputs.
        bool wanted = !g || g->outputs.empty() || is_scheduler(*g);
        if (g)
          for (const auto& n : g->outputs) wanted |= n == t.name;
        for (const auto& have : all) wanted &= have.name != t.name;  // replicas (TP, DP) hold copies
        if (wanted) all.push_back(std::move(t));
      }
      break;
    }
  }
  return all;
}

// A sharded job's outputs: every rank's pieces put back together by the manifest's layouts.
Expected<std::vector<HostTensor>> gather_sharded_outputs(const std::filesystem::path& run_dir, int ranks) {
  auto m = shard::read_manifest(shard_dir_of(run_dir) / "manifest.toml");
  if (!m) return std::move(m).error();
  std::vector<std::vector<HostTensor>> per_rank(static_cast<std::size_t>(ranks));
  for (int k = 0; k < ranks; ++k) {
    const auto dir = rank_output_dir(run_dir, k);
    if (!std::filesystem::is_directory(dir)) continue;
    auto outs = read_tensor_dir(dir, "output");
    if (!outs) return std::move(outs).error();
    per_rank[static_cast<std::size_t>(k)] = std::move(*outs);
  }
  return assemble_outputs(*m, per_rank);
}

// The ranks' action times (RUN/timing/rank-N.json, written by sharded ranks).
Expected<std::vector<RankRun>> read_timing(const std::filesystem::path& run_dir, int ranks) {
  std::vector<RankRun> out;
  for (int k = 0; k < ranks; ++k) {
    auto text = read_file(run_dir / "timing" / fmt::format("rank-{}.json", k));
    if (!text) return std::move(text).error();
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded()) return Error(Errc::internal, "unreadable timing file", fmt::format("rank-{}.json", k));
    RankRun r;
    r.rank = j.value("rank", k);
    r.stage = j.value("stage", 0);
    r.seconds = j.value("seconds", 0.0);
    r.step_seconds = j.value("steps", std::vector<double>{});
    if (j.contains("actions"))
      for (const auto& a : j["actions"]) r.actions.push_back(
            {a.value("micro_batch", 0), a.value("start", 0.0), a.value("end", 0.0), a.value("wait", 0.0)});
    out.push_back(std::move(r));
  }
  return out;
}

// RUN/shard for a sharded job: `hp shard` into it, or a link to --shard-dir's partitions; then the
// inputs are checked against the manifest here, once, rather than on every rank after mpirun.
Status prepare_shards(const recipe::Recipe& rec, const LaunchOptions& o, const std::filesystem::path& run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (!o.shard_dir.empty()) {
    auto m = shard::read_manifest(o.shard_dir / "manifest.toml");
    if (!m) return std::move(m).error();
    if (rank_count(*m) != rec.ranks())
      return Error(Errc::bad_input, fmt::format("the partitions are for {} ranks; the recipe has {}", rank_count(*m),
                                                rec.ranks()),
                   (o.shard_dir / "manifest.toml").string());
    std::filesystem::create_directory_symlink(std::filesystem::absolute(o.shard_dir), shard_dir_of(run_dir), ec);
    if (ec) return Error(Errc::runtime, "cannot link the partitions into the run directory: " + ec.message(),
                         shard_dir_of(run_dir).string());
  } else {
    auto prepared = shard::prepare(o.target);
    if (!prepared) return std::move(prepared).error();
    auto written = shard::write_partitions(**prepared, shard_dir_of(run_dir));
    if (!written) return std::move(written).error();
  }
  // Check the inputs here, once, rather than on every rank after mpirun started them.
  if (o.inputs.empty()) {
    auto m = shard::read_manifest(shard_dir_of(run_dir) / "manifest.toml");
    if (!m) return std::move(m).error();
    if (!m->inputs.empty())
      return Error(Errc::usage, fmt::format("the model reads {} graph input(s) ('{}', ...); pass --inputs DIR",
                                            m->inputs.size(), m->inputs.front().tensor));
  } else {
    auto m = shard::read_manifest(shard_dir_of(run_dir) / "manifest.toml");
    if (!m) return std::move(m).error();
    auto given = read_tensor_dir(o.inputs, "input");
    if (!given) return std::move(given).error();
    std::vector<GraphIO> all;
    for (const auto& in : m->inputs) all.push_back({in.tensor, -1, 0, {}, false});
    auto fed = rank_inputs(*m, static_cast<int>(m->ranks.front().rank), all, *given);
    if (!fed) return std::move(fed).error();
  }
  return {};
}

Expected<LaunchReport> launch_recipe(const LaunchOptions& o) {
  if (o.worker) {
    WorkerOptions w{o.target, o.run_dir, o.inputs, o.threads, o.plugin_paths, o.steps};
    auto rep = run_worker(w);
    if (!rep) return std::move(rep).error();
    LaunchReport r;
    r.stats = rep->stats;
    r.summary = rep->summary();
    return r;
  }
  auto rec = recipe::load_recipe(o.target);
  if (!rec) return std::move(rec).error();
  JobOptions jo;
  jo.recipe = o.target;
  std::error_code ec;
  jo.worker = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return Error(Errc::internal, "cannot find the hp executable (/proc/self/exe) to start the ranks with");
  jo.run_dir = o.run_dir.empty() ? default_run_dir(*rec, o.target) : o.run_dir;
  jo.inputs = o.inputs;
  jo.hostfile = o.hostfile;
  jo.launcher = o.launcher;
  jo.timeout_s = o.timeout_s;
  jo.threads = o.threads;
  jo.allow_run_as_root = o.allow_run_as_root;
  jo.plugin_paths = o.plugin_paths;
  if (o.steps < 1) return Error(Errc::usage, "--steps must be at least 1");
  jo.steps = o.steps;
  if (!o.backend.empty())
    return Error(Errc::usage, "--backend applies to MODEL.onnx; a recipe sets 'backend' per [[groups]] entry");
  auto plan = plan_job(*rec, jo, probe_host());
  if (!plan) return std::move(plan).error();
  LaunchReport r;
  if (o.dry_run) {
    r.summary = format_dry_run(*plan);
    return r;
  }
  // One sharded model (no [[groups]]): partition it into RUN/shard first; the ranks read it there.
  const bool sharded = rec->groups.empty();
  if (!sharded && !o.shard_dir.empty())
    return Error(Errc::usage, "--shard-dir applies to a recipe without [[groups]] (one sharded model)");
  if (sharded) {
    // A run directory made here is removed again when the job cannot start: nothing half-made stays.
    std::error_code ec;
    const bool fresh = !std::filesystem::exists(jo.run_dir, ec);
    if (Status st = prepare_shards(*rec, o, jo.run_dir); !st) {
      if (fresh) std::filesystem::remove_all(jo.run_dir, ec);
      return std::move(st).error();
    }
  }
  auto sink = o.sink ? o.sink : [](bool, const std::string&) {};
  auto job = run_job(*plan, jo, sink);
  if (!job) return std::move(job).error();
  r.summary = fmt::format("job of {} rank(s) in {} group(s) finished in {:.2f} s; logs in {}\n", job->ranks,
                          plan->contexts.size(), job->seconds, job->log_dir.string());
  if (sharded) {
    auto timing = read_timing(jo.run_dir, job->ranks);
    if (timing)
      r.summary += format_step_timing(*timing, static_cast<int>(rec->parallel.pp),
                                      static_cast<int>(rec->parallel.pp > 1 ? rec->parallel.micro_batches : 1),
                                      recipe::schedule_name(rec->parallel.schedule),
                                      rec->parallel.schedule == recipe::Schedule::interleaved
                                          ? static_cast<int>(rec->parallel.virtual_stages) : 1);
    auto cluster = recipe::cluster_for(*rec, o.target.parent_path(), o.preset_dirs);
    auto predicted = cluster ? predicted_step_seconds(*rec, o.target.parent_path(), *cluster) : Expected<double>(cluster.error());
    if (predicted) {
      r.summary += fmt::format("plan's prediction: {:.4f} s per step (hp plan's cost model on '{}', inference)\n",
                               *predicted, rec->cluster);
      // The model gives every rank a device of its own; ranks sharing cores wait for each other's CPU.
      if (std::find(plan->argv.begin(), plan->argv.end(), "--oversubscribe") != plan->argv.end())
        r.summary += fmt::format("  (here {} ranks share {} cores, which the model does not see: expect the measured step "
                                 "above the prediction)\n", plan->total_ranks, probe_host().cores);
    } else
      r.summary += fmt::format("plan's prediction: none ({})\n", predicted.error().what.message);
  }
  if (!o.outputs.empty()) {
    auto outs = sharded ? gather_sharded_outputs(jo.run_dir, job->ranks) : gather_outputs(*rec, *plan);
    if (!outs) return std::move(outs).error();
    HP_TRY(write_tensor_dir(o.outputs, *outs));
    r.summary += fmt::format("wrote {} output{} to {}\n", outs->size(), outs->size() == 1 ? "" : "s", o.outputs.string());
  }
  return r;
}

}  // namespace

Expected<LaunchReport> launch(const LaunchOptions& o) {
  if (o.target.extension() == ".toml") return launch_recipe(o);
  if (o.target.extension() != ".onnx")
    return Error(Errc::usage, fmt::format("'{}' is neither a RECIPE.toml nor a MODEL.onnx", o.target.string()));
  if (o.worker) return Error(Errc::usage, "--worker applies to RECIPE.toml");
  if (o.dry_run) return Error(Errc::usage, "--dry-run applies to RECIPE.toml (a model runs on one rank, no mpirun)");
  if (o.inputs.empty() || o.outputs.empty())
    return Error(Errc::usage, "'hp launch MODEL.onnx' needs --inputs DIR and --outputs DIR");
  auto p = prepare(o.target, o.inputs, o.backend, o.threads, o.plugin_paths);
  if (!p) return std::move(p).error();
  auto outs = p->exec->run(p->inputs);
  if (!outs) return std::move(outs).error();
  HP_TRY(write_tensor_dir(o.outputs, *outs));
  LaunchReport r;
  r.stats = p->exec->stats();
  r.summary = stats_line(r.stats, p->backends.primary->name()) +
              fmt::format("wrote {} output{} to {}\n", outs->size(), outs->size() == 1 ? "" : "s", o.outputs.string());
  return r;
}

bool ModelVerifyReport::ok() const {
  for (const auto& o : outputs)
    if (!o.ok()) return false;
  return true;
}

std::string ModelVerifyReport::format() const {
  std::string s;
  for (const auto& o : outputs) {
    if (!o.problem.empty())
      s += fmt::format("{}: MISMATCH: {}\n", o.name, o.problem);
    else
      s += fmt::format("{}: max abs error {:.3g}, max rel error {:.3g}: {}\n", o.name, o.max_abs, o.max_rel,
                       o.ok() ? "ok" : fmt::format("MISMATCH ({} elements out of tolerance)", o.bad));
  }
  s += stats_line(stats, backend);
  return s;
}

Expected<ModelVerifyReport> verify_model(const ModelVerifyOptions& o) {
  if (o.inputs.empty() || o.expected.empty())
    return Error(Errc::usage, "'hp verify MODEL.onnx' needs --inputs DIR and --expected DIR");
  if (!(o.rtol >= 0) || !(o.atol >= 0)) return Error(Errc::usage, "--rtol and --atol must be non-negative");
  auto want = read_tensor_dir(o.expected, "output");
  if (!want) return std::move(want).error();
  auto p = prepare(o.model, o.inputs, o.backend, o.threads, o.plugin_paths);
  if (!p) return std::move(p).error();
  if (want->size() != p->exec->outputs().size())
    return Error(Errc::bad_input,
                 fmt::format("the graph has {} outputs, {} holds {} output_K.pb files", p->exec->outputs().size(),
                             o.expected.string(), want->size()));
  auto got = p->exec->run(p->inputs);
  if (!got) return std::move(got).error();
  ModelVerifyReport r;
  r.stats = p->exec->stats();
  r.backend = p->backends.primary->name();
  for (std::size_t k = 0; k < got->size(); ++k) {
    (*want)[k].name = (*got)[k].name;
    r.outputs.push_back(compare_tensors((*got)[k], (*want)[k], o.rtol, o.atol));
  }
  return r;
}

}  // namespace hp::job
