// `hp verify RECIPE.toml` of a training recipe (verify_run.h, verify_training_run): the recipe's
// job and one rank train the same steps on the same data, each writing its metrics and trained
// model into a temporary directory through the same code hp launch runs; the losses and the final
// weights are then compared. Both runs go through files on purpose: an mpirun job's ranks are other
// processes, and reading what they wrote is how a user would check them too.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "hp/exec/tensor.h"
#include "hp/job/train_run.h"
#include "hp/job/verify_run.h"
#include "worker_internal.h"

namespace hp::job {
namespace fs = std::filesystem;
using exec::HostTensor;
using exec::OutputCheck;

namespace {

Expected<std::vector<double>> read_losses(const fs::path& metrics) {
  std::ifstream in(metrics);
  if (!in) return Error(Errc::runtime, "the run wrote no metrics", metrics.string());
  std::vector<double> losses;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("loss") || !j["loss"].is_number())
      return Error(Errc::runtime, "a metrics line is not what hp writes", metrics.string());
    losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

// The initializers of a model file, by name.
Expected<std::map<std::string, HostTensor>> weights_of(const fs::path& path) {
  HP_ASSIGN_OR_RETURN(auto all, exec::read_initializers(path));
  std::map<std::string, HostTensor> out;
  for (auto& t : all) {
    std::string name = t.name;
    out.emplace(std::move(name), std::move(t));
  }
  return out;
}

double norm_of_difference(const HostTensor& a, const HostTensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double d = static_cast<double>(a.as<float>()[i]) - b.as<float>()[i];
    s += d * d;
  }
  return std::sqrt(s);
}

// One weight of the job against the one-rank run's (see verify_training_run).
OutputCheck weight_check(const std::string& name, const HostTensor& got, const HostTensor& want,
                         const HostTensor& initial, double atol) {
  OutputCheck c = exec::compare_tensors(got, want, 0, atol);
  c.name = name;
  if (!c.problem.empty() || got.dtype != HP_F32) return c;
  const double moved = norm_of_difference(want, initial);
  const double off = norm_of_difference(got, want);
  if (moved > 0) {
    c.bad = off > 0.01 * moved ? std::max<std::int64_t>(c.bad, 1) : 0;
    if (c.bad)
      c.problem =
          fmt::format("differs by {:.2g}% of the update one rank gave it", 100 * off / moved);
  }
  return c;
}

}  // namespace

Expected<RecipeRunReport> verify_training_run(const Job& job, const RecipeRunOptions& o) {
  if (o.inputs.empty() == o.data.empty())
    return Error(Errc::usage,
                 "verifying a training recipe needs its data: --inputs DIR (the inputs and the "
                 "labels as .pb tensors) or --data FILE (a token stream), one of them",
                 job.recipe_path.string());
  if (o.steps < 0) return Error(Errc::usage, "--steps must be at least 1");
  const recipe::Parallel& p = job.recipe.parallel;
  RecipeRunReport rep;
  rep.training = true;
  rep.ranks = static_cast<int>(job.recipe.ranks());
  rep.layout = p.tp > 1 ? fmt::format("tp={} (hp shard's partitions)", p.tp)
               : p.pp > 1
                   ? fmt::format("pp={}, {} schedule, {} micro-batches", p.pp,
                                 recipe::schedule_name(p.schedule), p.micro_batches)
                   : fmt::format("dp={}, optimizer_shard {}{}", p.dp,
                                 recipe::optimizer_shard_name(p.optimizer_shard),
                                 p.shard_group > 0 && p.shard_group < p.dp
                                     ? fmt::format(", HSDP shard groups of {}", p.shard_group)
                                     : std::string());
  if (p.expert_parallel > 1)
    rep.layout += fmt::format(", experts shared out over expert_parallel = {}", p.expert_parallel);
  rep.how = o.simulate || rep.ranks == 1 ? "simulated in one process"
                                         : fmt::format("mpirun, {} ranks", rep.ranks);
  TempDir tmp;
  LaunchOptions lo;
  lo.inputs = o.inputs;
  lo.data = o.data;
  lo.steps = o.steps > 0 ? o.steps : 3;
  lo.threads = o.threads;
  lo.plugin_paths = o.plugin_paths;
  lo.backend = o.backend;

  // One rank: the same recipe with its data, tensor and pipeline parallelism removed.
  Job one = job;
  one.recipe.parallel.dp = 1;
  one.recipe.parallel.tp = 1;
  one.recipe.parallel.pp = 1;
  one.recipe.parallel.micro_batches = 1;
  one.recipe.parallel.optimizer_shard = 0;
  one.recipe.parallel.shard_group = 0;
  one.recipe.parallel.expert_parallel = 1;
  LaunchOptions lone = lo;
  lone.metrics = tmp.path / "one.jsonl";
  lone.save_model = tmp.path / "one.onnx";
  auto t0 = std::chrono::steady_clock::now();
  HP_TRY(launch_train(one, lone));
  rep.unsharded_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  LaunchOptions ljob = lo;
  ljob.metrics = tmp.path / "job.jsonl";
  ljob.save_model = tmp.path / "job.onnx";
  if (rep.ranks > 1) {
    ljob.simulate = o.simulate;
    ljob.timeout_s = o.timeout_s;
    ljob.allow_run_as_root = o.allow_run_as_root;
    ljob.run_dir = o.run_dir.empty() ? tmp.path / "run" : o.run_dir;
  }
  t0 = std::chrono::steady_clock::now();
  // An mpirun job's run directory outlives a failure (its error names the logs there).
  tmp.keep = rep.ranks > 1 && !o.simulate && o.run_dir.empty();
  auto launched = launch_train(job, ljob);
  if (!launched)
    return tmp.keep ? with_kept_dir(std::move(launched).error(), tmp.path) : launched.error();
  auto ran = std::move(*launched);
  rep.sharded_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rep.timing = ran.summary;
  rep.ran = true;

  HP_ASSIGN_OR_RETURN(auto want_loss, read_losses(lone.metrics));
  HP_ASSIGN_OR_RETURN(auto got_loss, read_losses(ljob.metrics));
  if (got_loss.size() != want_loss.size())
    return Error(Errc::runtime, fmt::format("the job trained {} steps, one rank {}",
                                            got_loss.size(), want_loss.size()));
  for (std::size_t k = 0; k < want_loss.size(); ++k) {
    OutputCheck c;
    c.name = fmt::format("loss, step {}", k + 1);
    c.max_abs = std::fabs(got_loss[k] - want_loss[k]);
    c.max_rel = want_loss[k] != 0 ? c.max_abs / std::fabs(want_loss[k]) : c.max_abs;
    c.bad = !(c.max_rel <= o.rtol);
    rep.outputs.push_back(std::move(c));
  }
  HP_ASSIGN_OR_RETURN(auto initial, weights_of(job.model_path()));
  HP_ASSIGN_OR_RETURN(auto want_w, weights_of(lone.save_model));
  HP_ASSIGN_OR_RETURN(auto got_w, weights_of(ljob.save_model));
  for (const auto& [name, want] : want_w) {
    auto g = got_w.find(name);
    auto i = initial.find(name);
    if (g == got_w.end() || i == initial.end()) {
      OutputCheck c;
      c.name = name;
      c.problem = "missing from the job's trained model";
      rep.outputs.push_back(std::move(c));
      continue;
    }
    rep.outputs.push_back(weight_check(name, g->second, want, i->second, o.atol));
  }
  if (tmp.keep && rep.ok())
    tmp.keep = false;
  else if (tmp.keep)
    rep.kept_dir = tmp.path;
  return rep;
}

}  // namespace hp::job
