// verify_recipe_run: sharded against unsharded outputs of a recipe (verify_run.h).
#include <fmt/core.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <random>

#include "hp/exec/tensor.h"
#include "hp/job/job.h"
#include "hp/job/launch.h"
#include "hp/job/schedule.h"
#include "hp/job/sharded.h"
#include "hp/job/verify_run.h"
#include "hp/model/model.h"
#include "hp/recipe/recipe.h"
#include "hp/shard/shard.h"
#include "worker_internal.h"

namespace hp::job {
using exec::bind_inputs;
using exec::compare_tensors;
using exec::dtype_from_onnx;
using exec::dtype_size;
using exec::Executor;
using exec::GraphIO;
using exec::HostTensor;
using exec::open_backends;
using exec::read_tensor_dir;
using exec::write_tensor_dir;
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The exclusive bound of the integer values of graph input `t`: the smallest table a Gather
// consumer indexes with it (the size of the data's axis), 0 when none does.
std::int64_t index_bound(const model::Graph& g, int t) {
  std::int64_t bound = 0;
  for (int n : g.tensor(t).consumers) {
    const auto& node = g.node(n);
    if (node.op_type != "Gather" || node.inputs.size() < 2 || node.inputs[1] != t ||
        node.inputs[0] < 0)
      continue;
    const auto& data = g.tensor(node.inputs[0]);
    if (data.dims.empty() || !data.dims[0].known()) continue;
    const std::int64_t n0 = data.dims[0].value;  // embeddings gather along axis 0
    bound = bound == 0 ? n0 : std::min(bound, n0);
  }
  return bound;
}

}  // namespace

std::vector<HostTensor> generate_inputs(const std::vector<GraphIO>& inputs,
                                        const std::vector<std::int64_t>& bounds,
                                        std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<HostTensor> out;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    HostTensor t;
    t.name = inputs[k].name;
    t.dtype = inputs[k].dtype;
    t.dims = inputs[k].dims;
    t.data.resize(static_cast<std::size_t>(t.numel() * dtype_size(t.dtype)));
    const std::int64_t n = t.numel();
    const std::int64_t hi = k < bounds.size() && bounds[k] > 0 ? bounds[k] : 2;
    std::uniform_real_distribution<double> real(-1, 1);
    std::uniform_int_distribution<std::int64_t> integer(0, hi - 1);
    for (std::int64_t i = 0; i < n; ++i) switch (t.dtype) {
        case HP_F32: t.as<float>()[i] = static_cast<float>(real(gen)); break;
        case HP_F64: t.as<double>()[i] = real(gen); break;
        case HP_I32: t.as<std::int32_t>()[i] = static_cast<std::int32_t>(integer(gen)); break;
        case HP_I64: t.as<std::int64_t>()[i] = integer(gen); break;
        default: t.as<std::uint8_t>()[i] = static_cast<std::uint8_t>(integer(gen) & 1); break;
      }
    out.push_back(std::move(t));
  }
  return out;
}

bool RecipeRunReport::ok() const { return exec::all_ok(outputs); }

std::string RecipeRunReport::format() const {
  if (!ran) return fmt::format("sharded run: not done ({})\n", skipped);
  if (training) {
    std::string s = fmt::format(
        "training ({}, {}) against one rank, same weights and data; {} step(s):\n", layout, how,
        std::count_if(outputs.begin(), outputs.end(), [](const exec::OutputCheck& c) {
          return c.name.rfind("loss, step", 0) == 0;
        }));
    for (const auto& o : outputs) s += "  " + exec::format_check(o) + "\n";
    s += fmt::format("one rank {:.3f} s, the job {:.3f} s ({} ranks)\n", unsharded_s, sharded_s,
                     ranks);
    if (!kept_dir.empty())
      s += fmt::format("the job's run directory is kept: {} (rank logs in run/logs)\n",
                       kept_dir.string());
    return s;
  }
  std::string s = fmt::format("pipeline schedule: {}\n", schedule);
  s += fmt::format("sharded run ({}) against the unsharded model on {} input{}:\n", how,
                   generated_inputs ? "generated" : "the given", generated_inputs ? "s" : "s");
  for (const auto& o : outputs) s += "  " + exec::format_check(o) + "\n";
  s += fmt::format("unsharded {:.3f} s, sharded {:.3f} s ({} ranks)\n", unsharded_s, sharded_s,
                   ranks);
  if (!timing.empty()) s += timing;
  if (!kept_dir.empty())
    s += fmt::format("the job's run directory is kept: {} (rank logs in run/logs)\n",
                     kept_dir.string());
  return s;
}

namespace {

// Inputs at the recipe's full dims (the manifest holds one micro-batch): floats in [-1, 1), integer
// ids inside the table they index (generate_inputs).
std::vector<HostTensor> generated_inputs(const shard::Prepared& P, const shard::Manifest& manifest,
                                         std::uint64_t seed) {
  std::vector<GraphIO> ios;
  std::vector<std::int64_t> bounds;
  for (const auto& in : manifest.inputs) {
    const int ti = P.graph.find_tensor(in.tensor);
    GraphIO io;
    io.name = in.tensor;
    io.dtype = ti >= 0 ? dtype_from_onnx(P.graph.tensor(ti).elem_type) : HP_F32;
    io.dims = in.shape;
    if (in.batched && !io.dims.empty()) io.dims[0] *= manifest.micro_batches;
    ios.push_back(io);
    bounds.push_back(ti >= 0 ? index_bound(P.graph, ti) : 0);
  }
  return generate_inputs(ios, bounds, seed);
}

// All ranks on threads in this process: the partitions of `P` (or --shard-dir's), the job's
// schedule.
Expected<std::vector<HostTensor>> run_simulated(Job& job, const shard::Prepared& P,
                                                const RecipeRunOptions& o,
                                                const std::vector<HostTensor>& inputs,
                                                const fs::path& tmp, RecipeRunReport& rep) {
  ShardedRunOptions so;
  so.shard_dir = o.shard_dir;
  if (so.shard_dir.empty()) {
    so.shard_dir = tmp / "shard";
    HP_TRY(shard::write_partitions(P, so.shard_dir));
  }
  HP_TRY(attach_manifest(job, so.shard_dir));
  so.schedule = job.schedule.lowered;
  so.backend = o.backend;
  so.threads = 1;  // the ranks share this process's cores
  so.plugin_paths = o.plugin_paths;
  so.recipe = &job.recipe;
  so.timeout_s = o.timeout_s;
  HP_ASSIGN_OR_RETURN(auto sim, run_sharded_in_process(*job.manifest, so, inputs));
  rep.how = fmt::format("simulated in one process, {} ranks", rep.ranks);
  rep.timing = format_step_timing(sim.ranks, job.schedule.lowered);
  return std::move(sim.outputs);
}

// A real MPI job through hp launch's own path, on the inputs written to a temporary directory.
Expected<std::vector<HostTensor>> run_mpi(Job& job, const RecipeRunOptions& o,
                                          const std::vector<HostTensor>& inputs,
                                          const fs::path& tmp, RecipeRunReport& rep) {
  HP_TRY(write_tensor_dir(tmp / "inputs", inputs, "input"));
  LaunchOptions lo;
  lo.target = job.recipe_path;
  lo.inputs = tmp / "inputs";
  lo.outputs = tmp / "outputs";
  lo.shard_dir = o.shard_dir;
  lo.threads = o.threads;
  lo.timeout_s = o.timeout_s;
  lo.allow_run_as_root = o.allow_run_as_root;
  lo.plugin_paths = o.plugin_paths;
  lo.run_dir = o.run_dir.empty() ? tmp / "run" : o.run_dir;
  HP_ASSIGN_OR_RETURN(auto launched, launch_job(job, lo));
  HP_ASSIGN_OR_RETURN(auto outs, read_tensor_dir(lo.outputs, "output"));
  rep.how = fmt::format("mpirun, {} ranks", rep.ranks);
  const auto& s = launched.summary;
  if (auto at = s.find("step: "); at != std::string::npos)
    rep.timing = s.substr(at, s.find('\n', at) - at + 1);
  return outs;
}

}  // namespace

Expected<RecipeRunReport> verify_recipe_run(Job& job, const RecipeRunOptions& o) {
  if (!(o.rtol >= 0) || !(o.atol >= 0))
    return Error(Errc::usage, "--rtol and --atol must be non-negative");
  if (job.recipe.train) return verify_training_run(job, o);
  RecipeRunReport rep;
  if (job.kind != JobKind::sharded_model) {
    rep.skipped = "the recipe runs [[groups]] modules (MPMD); hp launch runs it";
    return rep;
  }
  // The schedule the ranks will run (load_job simulated it: no deadlock).
  const auto& sched = job.schedule;
  rep.schedule = fmt::format(
      "{}, p={}, m={}{}: no deadlock, bubble {:.3f}", schedule_kind_name(sched.lowered.kind),
      sched.lowered.ranks, job.recipe.parallel.micro_batches,
      sched.lowered.chunks > 1 ? fmt::format(", v={}", sched.lowered.chunks) : "",
      sched.check.bubble());

  // Weights decide whether anything can run. A recipe for planning only may name a file that is no
  // model at all (the static checks need it to exist): then there is nothing to partition or run.
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  auto model = model::load_model(job.model_path(), lo);
  if (!model) {
    if (auto probe = model::load_model(job.model_path()); !probe) {
      rep.skipped = "the model does not load: " + probe.error().what.message;
      return rep;
    }
    rep.skipped = "the model has no weight data (shapes only): " + model.error().what.message;
    HP_TRY(
        shard::prepare(job.recipe, job.where, job.recipe_path));  // still check that it partitions
    return rep;
  }
  HP_ASSIGN_OR_RETURN(auto prepared, shard::prepare(job.recipe, job.where, job.recipe_path));
  const shard::Prepared& P = *prepared;
  const shard::Manifest manifest = shard::make_manifest(P);
  rep.ranks = rank_count(manifest);

  HP_ASSIGN_OR_RETURN(auto backends, open_backends(o.backend, o.threads, o.plugin_paths));
  HP_ASSIGN_OR_RETURN(auto unsharded,
                      Executor::create(*model, {backends.primary, backends.cpu, nullptr}));
  TempDir tmp;
  std::vector<HostTensor> inputs;
  if (!o.inputs.empty()) {
    HP_ASSIGN_OR_RETURN(inputs, read_tensor_dir(o.inputs, "input"));
  } else {
    inputs = generated_inputs(P, manifest, o.seed);
    rep.generated_inputs = true;
  }
  HP_ASSIGN_OR_RETURN(auto bound, bind_inputs(unsharded->inputs(), inputs,
                                              o.inputs.empty() ? "generated" : o.inputs.string()));
  auto t0 = std::chrono::steady_clock::now();
  HP_ASSIGN_OR_RETURN(auto want, unsharded->run(bound));
  rep.unsharded_s = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  // An MPI job's run directory (its rank logs) outlives a failure, which points into it; it is
  // removed once the outputs have matched.
  tmp.keep = !o.simulate && o.run_dir.empty();
  auto ran = o.simulate ? run_simulated(job, P, o, bound, tmp.path, rep)
                        : run_mpi(job, o, bound, tmp.path, rep);
  if (!ran) return tmp.keep ? with_kept_dir(std::move(ran).error(), tmp.path) : ran.error();
  auto got = std::move(*ran);
  rep.sharded_s = seconds_since(t0);
  rep.ran = true;
  if (got.size() != want.size())
    return Error(Errc::internal, fmt::format("the sharded job produced {} outputs, the model {}",
                                             got.size(), want.size()));
  for (std::size_t k = 0; k < want.size(); ++k) {
    auto c = compare_tensors(got[k], want[k], o.rtol, o.atol);
    c.name = want[k].name;
    rep.outputs.push_back(std::move(c));
  }
  if (tmp.keep && rep.ok())
    tmp.keep = false;
  else if (tmp.keep)
    rep.kept_dir = tmp.path;
  return rep;
}

std::string add_run_json(const std::string& static_json, const Expected<RecipeRunReport>& run) {
  auto j = nlohmann::ordered_json::parse(static_json, nullptr, false);
  if (j.is_discarded()) j = nlohmann::ordered_json::object();
  nlohmann::ordered_json r;
  if (!run) {
    r["error"] = run.error().str();
    r["code"] = errc_name(run.error().code);
    j["ok"] = false;
  } else {
    r["ran"] = run->ran;
    if (!run->ran) {
      r["skipped"] = run->skipped;
    } else {
      r["how"] = run->how;
      r["ranks"] = run->ranks;
      r["generated_inputs"] = run->generated_inputs;
      r["schedule"] = run->schedule;
      r["unsharded_s"] = run->unsharded_s;
      r["sharded_s"] = run->sharded_s;
      r["outputs"] = nlohmann::ordered_json::array();
      for (const auto& o : run->outputs)
        r["outputs"].push_back({{"name", o.name},
                                {"max_abs", o.max_abs},
                                {"max_rel", o.max_rel},
                                {"bad", o.bad},
                                {"problem", o.problem},
                                {"ok", o.ok()}});
      if (!run->ok()) j["ok"] = false;
    }
  }
  j["run"] = std::move(r);
  return j.dump();
}

}  // namespace hp::job
