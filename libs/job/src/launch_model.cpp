// hp launch MODEL.onnx: the model on one rank without a recipe (single_rank.h), run --steps times,
// with --dtype bf16 (the cpu plugin's compute=bf16), --profile (where the last run's time went,
// per op type) and --trace FILE (each node of the last run as a Chrome trace event).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>

#include "hp/core/fs.h"
#include "hp/exec/compare.h"
#include "hp/job/train_run.h"
#include "hp/train/trace.h"
#include "single_rank.h"

namespace hp::job {
namespace {

using exec::ExecStats;
using exec::HostTensor;

/// The per-op-type table of --profile, slowest first, and the same rows as JSON.
std::string profile_table(const ExecStats& st, nlohmann::ordered_json& rows) {
  std::vector<std::pair<std::string, exec::OpTime>> ops(st.by_op.begin(), st.by_op.end());
  std::sort(ops.begin(), ops.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double kernels = 0;
  int nodes = 0;
  for (const auto& [op, t] : ops) {
    kernels += t.seconds;
    nodes += t.nodes;
  }
  std::string out =
      fmt::format("profile of the last run: {:.4g} s in {} nodes' kernels\n", kernels, nodes);
  out += fmt::format("  {:<28} {:>6} {:>10} {:>6}\n", "op", "nodes", "ms", "%");
  rows = nlohmann::ordered_json::array();
  for (const auto& [op, t] : ops) {
    const double share = kernels > 0 ? t.seconds / kernels : 0;
    out += fmt::format("  {:<28} {:>6} {:>10.3f} {:>6.1f}\n", op, t.nodes, t.seconds * 1e3,
                       100 * share);
    rows.push_back({{"op", op}, {"nodes", t.nodes}, {"seconds", t.seconds}, {"share", share}});
  }
  return out;
}

Status check_model_options(const LaunchOptions& o) {
  if (o.worker) return Error(Errc::usage, "--worker applies to RECIPE.toml");
  LaunchOptions training = o;
  training.trace.clear();  // a model run writes its nodes' trace
  if (auto flag = training_option_given(training); !flag.empty())
    return Error(Errc::usage, flag + " applies to a recipe with a [train] table", o.target.string(),
                 "a model runs forward; its recipe's [train] table trains it");
  if (o.dry_run)
    return Error(Errc::usage,
                 "--dry-run applies to RECIPE.toml (a model runs on one rank, no mpirun)");
  if (o.inputs.empty())
    return Error(Errc::usage, "'hp launch MODEL.onnx' needs --inputs DIR", o.target.string(),
                 "--outputs DIR writes the outputs; without it hp prints a summary of each");
  if (o.steps < 0) return Error(Errc::usage, "--steps must be at least 1");
  if (o.nproc_per_node > 0)
    return Error(Errc::usage, "--nproc-per-node applies to a recipe; a model runs on one rank",
                 o.target.string(),
                 "`hp plan MODEL -o RECIPE.toml` writes a recipe that shards it over ranks");
  if (!o.mpi_args.empty()) return Error(Errc::usage, "--mpi-args applies to a recipe (mpirun)");
  if (!o.trace.empty() && std::filesystem::exists(o.trace) && !o.force)
    return Error(Errc::usage, fmt::format("--trace {} exists", o.trace.string()), "",
                 "--force replaces it");
  return {};
}

/// The cpu plugin's open options for --dtype: compute=bf16, or none for float32.
Expected<std::vector<std::string>> dtype_options(const std::string& dtype) {
  if (dtype == "bf16" || dtype == "bfloat16") return std::vector<std::string>{"compute=bf16"};
  if (dtype.empty() || dtype == "f32" || dtype == "fp32" || dtype == "float32")
    return std::vector<std::string>{};
  return Error(Errc::usage, fmt::format("--dtype '{}' is not f32 or bf16", dtype));
}

}  // namespace

Expected<LaunchReport> launch_model(const LaunchOptions& o) {
  HP_TRY(check_model_options(o));
  HP_ASSIGN_OR_RETURN(const auto open_options, dtype_options(o.dtype));
  const OutputDirOptions guard{"hp launch", {o.target, o.inputs}, {}, {}, o.force};
  if (!o.outputs.empty()) HP_TRY(check_output_dir(o.outputs, guard));
  const bool profile = o.profile || !o.trace.empty();
  HP_ASSIGN_OR_RETURN(auto p, prepare_single_rank(o.target, o.inputs, o.backend, o.threads,
                                                  o.plugin_paths, open_options, profile));
  // --steps N: the same inputs N times; the median is the figure to quote (the first run pays for
  // first-run work: allocations, kernel selection).
  const int runs = std::max(o.steps, 1);
  std::vector<double> secs;
  std::vector<HostTensor> outs;
  for (int k = 0; k < runs; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    auto got = p.exec->run(p.inputs);
    if (!got) return std::move(got).error();
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    outs = std::move(*got);
  }
  if (!o.outputs.empty()) HP_TRY(write_tensor_dir(o.outputs, outs, "output", guard));
  LaunchReport r;
  r.stats = p.exec->stats();
  if (!o.trace.empty()) {
    train::TraceLog log;
    for (const exec::NodeSpan& s : r.stats.timeline)
      log.add(s.node, s.op.c_str(), 0, s.start, s.end);
    HP_TRY(log.write(o.trace, 0));
  }
  r.summary = stats_line(r.stats, p.backends.primary->name());
  std::vector<double> sorted = secs;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  if (runs > 1)
    r.summary += fmt::format("{} runs: median {:.4g} s, min {:.4g} s, max {:.4g} s\n", runs, median,
                             sorted.front(), sorted.back());
  nlohmann::ordered_json rows;
  if (o.profile) r.summary += profile_table(r.stats, rows);
  if (!o.trace.empty())
    r.summary += fmt::format("wrote a trace of the last run's {} nodes to {}\n",
                             r.stats.timeline.size(), o.trace.string());
  if (!o.outputs.empty())
    r.summary += fmt::format("wrote {} output{} to {}\n", outs.size(), outs.size() == 1 ? "" : "s",
                             o.outputs.string());
  else
    for (const auto& t : outs)
      r.summary += "  " + exec::format_summary(exec::summarize_tensor(t)) + "\n";
  nlohmann::ordered_json j{{"mode", "model"},
                           {"backend", p.backends.primary->name()},
                           {"dtype", open_options.empty() ? "f32" : "bf16"},
                           {"nodes", r.stats.nodes},
                           {"step_seconds", secs},
                           {"median_seconds", median},
                           {"peak_bytes", r.stats.peak_bytes},
                           {"outputs", outputs_json(outs)}};
  if (o.profile) j["profile"] = rows;
  if (!o.trace.empty()) j["trace"] = o.trace.string();
  if (!o.outputs.empty()) j["outputs_dir"] = o.outputs.string();
  r.json = j.dump();
  return r;
}

}  // namespace hp::job
