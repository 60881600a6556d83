// `hp plan` as one library call (run_command): the options resolved into a model and a cluster as
// the command line means them, then the summary, the sweep or the plan, rendered. The app binds the
// flags, prints what comes back and writes its files.
#include <algorithm>
#include <optional>
#include <system_error>
#include <utility>

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "hp/core/checked.h"
#include "hp/model/plan_options.h"
#include "hp/planner/planner.h"
#include "hp/recipe/presets.h"
#include "pricing.h"

namespace hp::planner {
namespace {

namespace fs = std::filesystem;

constexpr const char* kBundledModel = "tiny-gpt2.onnx";

// The model `hp plan` plans when none is named: the first of `dirs` that holds it.
Expected<std::string> bundled_model(const std::vector<fs::path>& dirs) {
  std::error_code ec;
  for (const auto& d : dirs)
    if (fs::is_regular_file(d / kBundledModel, ec))
      return (d / kBundledModel).lexically_normal().string();
  return Error(Errc::bad_input, "the bundled model tiny-gpt2.onnx was not found",
               dirs.empty() ? std::string() : (dirs.front() / kBundledModel).string(),
               "pass a model file: hp plan MODEL.onnx");
}

// --cluster (a preset name, or a file relative to the working directory) at --nodes; nullopt when
// no cluster is named. Resolved before the model is read, so a bad cluster is reported whatever
// else is asked.
Expected<std::optional<recipe::Cluster>> named_cluster(const PlanOptions& opts) {
  if (opts.cluster.empty()) {
    if (opts.nodes > 0)
      return Error(Errc::usage, "--nodes needs --cluster", "",
                   "name a preset, e.g. --cluster dgx-h100");
    return std::optional<recipe::Cluster>();
  }
  recipe::Recipe ref;
  ref.cluster = opts.cluster;
  ref.nodes = opts.nodes;  // 0: the cluster file's own
  HP_ASSIGN_OR_RETURN(recipe::Cluster cluster,
                      recipe::cluster_for(ref, fs::current_path(), opts.preset_dirs));
  return std::optional<recipe::Cluster>(std::move(cluster));
}

std::string describe_cluster(const recipe::Cluster& c) {
  const auto* dev = c.rank_device_type();
  return fmt::format("{}: {} node(s) x {} {} = {} ranks", c.name, c.nodes, c.ranks_per_node(),
                     dev ? dev->name : c.rank_device, c.ranks());
}

// --summary: the model summarised at the bound dims, as a table or JSON, printed or written to -o.
Expected<PlanOutput> summary_output(const PlanOptions& opts, const model::DimBindings& dims,
                                    std::optional<recipe::Cluster> cluster) {
  HP_ASSIGN_OR_RETURN(model::ModelSummary summary,
                      model::summarize_model({opts.model, dims, opts.require_data}));
  PlanOutput out;
  out.model = opts.model;
  out.warnings = summary.warnings;
  const SummaryReport report{std::move(summary), std::move(cluster)};
  std::string text = opts.json ? format_summary_json(report) : format_summary_text(report);
  if (opts.output.empty())
    out.text = std::move(text);
  else
    out.files.push_back({opts.output, std::move(text)});
  return out;
}

// The recipe -o writes: the best plan that passes opts.check_plan (hp shard's own check, passed in
// by the app), so that hp never writes a recipe its next command refuses. Passing over a better
// plan is a warning; none passing is an error with each plan's reason.
Expected<recipe::Recipe> checked_recipe(const PlanOptions& opts, const PlanReport& report,
                                        std::vector<std::string>& warnings) {
  if (!opts.check_plan) return plan_to_recipe(report, opts.output);
  std::vector<Diagnostic> refused;
  for (std::size_t i = 0; i < report.plans.size(); ++i) {
    recipe::Recipe r = plan_to_recipe(report, opts.output, i);
    const Status ok = opts.check_plan(r, opts.output);
    if (ok) {
      for (const auto& d : refused) warnings.push_back(d.message + "; " + d.hint);
      if (i > 0)
        warnings.push_back(fmt::format("wrote plan {} ({}) to {}", i + 1,
                                       short_config(report.plans[i].config), opts.output));
      return r;
    }
    refused.push_back({ok.error().where(),
                       fmt::format("plan {} ({}) cannot be sharded: {}", i + 1,
                                   short_config(report.plans[i].config), ok.error().message()),
                       "it is not written"});
  }
  Error e = collect_errors(Errc::infeasible, std::move(refused));
  e.what.hint = "plan with other --fix values, or raise --top-k to consider more plans";
  return e;
}

// --explain NAME: the tensor as hp shard would lay it out under the best plan's recipe (placed in
// the working directory, or at -o), so that a name can be checked before anything is written.
Expected<std::string> explain_output(const PlanOptions& opts, const PlanReport& report) {
  if (!opts.explain_tensor)
    return Error(Errc::not_implemented, "--explain needs hp shard, which this build lacks");
  const fs::path at =
      opts.output.empty() ? fs::current_path() / "plan.toml" : fs::path(opts.output);
  HP_ASSIGN_OR_RETURN(std::string text,
                      opts.explain_tensor(plan_to_recipe(report, at), at, opts.explain, opts.json));
  if (opts.json) return text;
  return fmt::format("under plan 1 ({})\n{}", short_config(report.plans.front().config), text);
}

// A sweep fails (exit 4) when any point is infeasible, so that CI notices a configuration that
// stopped fitting; the rows are printed first. The message names the points.
Error sweep_failure(const SweepResult& swept) {
  const std::size_t shown = std::min<std::size_t>(swept.infeasible.size(), 4);
  std::string points;
  for (std::size_t i = 0; i < shown; ++i) points += (i ? "; " : "") + swept.infeasible[i];
  if (shown < swept.infeasible.size())
    points += fmt::format("; {} more", swept.infeasible.size() - shown);
  return Error(Errc::infeasible,
               fmt::format("{} of {} sweep points are infeasible ({}); their rows say why",
                           swept.infeasible.size(), swept.points, points),
               "", "--allow-infeasible prints the same rows and exits 0");
}

// The plan (or one per --sweep value) on `cluster`, with the files --schedule-svg and -o write.
Expected<PlanOutput> plan_output(const PlanOptions& opts, const recipe::Cluster& cluster) {
  PlanOutput out;
  out.model = opts.model;
  if (!opts.sweep.empty()) {
    if (!opts.output.empty() || !opts.schedule_svg.empty() || opts.compare || !opts.explain.empty())
      return Error(Errc::usage,
                   "--sweep prints one row per value: it takes no -o, --schedule-svg, --compare "
                   "or --explain",
                   "", "run the value you want without --sweep");
    HP_ASSIGN_OR_RETURN(SweepResult swept, run_sweep(opts, cluster));
    out.text = std::move(swept.text);
    if (!swept.infeasible.empty() && !opts.allow_infeasible) out.failure = sweep_failure(swept);
    return out;
  }
  if (opts.timing || opts.allow_infeasible)
    return Error(
        Errc::usage,
        fmt::format("{} goes with --sweep", opts.timing ? "--timing" : "--allow-infeasible"), "",
        "a single plan reports its search time in the table and JSON");
  HP_ASSIGN_OR_RETURN(const PlanReport report, run(opts, cluster));
  out.warnings = report.warnings;
  if (!opts.explain.empty()) {
    HP_ASSIGN_OR_RETURN(out.text, explain_output(opts, report));
  } else {
    out.text = opts.json ? format_plan_json(report) : format_plan_text(report);
  }
  if (!opts.schedule_svg.empty()) out.files.push_back({opts.schedule_svg, schedule_svg(report)});
  if (!opts.output.empty()) {
    HP_ASSIGN_OR_RETURN(const recipe::Recipe written, checked_recipe(opts, report, out.warnings));
    out.files.push_back({opts.output, recipe::format_recipe(written)});
  }
  return out;
}

}  // namespace

std::string format_summary_text(const SummaryReport& r) {
  std::string text = model::format_summary_text(r.model);
  return r.cluster ? fmt::format("{:<13} {}\n", "cluster", describe_cluster(*r.cluster)) + text
                   : text;
}

std::string format_summary_json(const SummaryReport& r) {
  // libs/model renders its summary as JSON text only, so the cluster entry is added to that object
  // (nlohmann::json keeps its keys sorted) instead of rendering the summary a second way.
  auto j = nlohmann::json::parse(model::format_summary_json(r.model));
  if (r.cluster) {
    const auto* dev = r.cluster->rank_device_type();
    j["cluster"] = {{"name", r.cluster->name},
                    {"nodes", r.cluster->nodes},
                    {"ranks", r.cluster->ranks()},
                    {"rank_device", dev ? dev->name : r.cluster->rank_device}};
  }
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// Numbers the search enumerates over (divisors of the batch and of the rank count, micro-batch
// counts) are refused up front when absurd: --global-batch 9223372036854775807 kept the planner
// busy for minutes. The bounds sit far above any real job (docs/hardening.md, "Bad files").
static Status check_plan_numbers(const PlanOptions& opts) {
  constexpr std::int64_t kMaxGlobalBatch = std::int64_t{1} << 24;
  constexpr std::int64_t kMaxNodes = std::int64_t{1} << 20;
  if (opts.global_batch > kMaxGlobalBatch)
    return Error(Errc::usage, fmt::format("--global-batch {} is above hp's limit of {} sequences",
                                          opts.global_batch, kMaxGlobalBatch));
  if (opts.seq > kMaxDim)
    return Error(Errc::usage, fmt::format("--seq {} is above hp's limit for a dim, 2^40 ({})",
                                          opts.seq, kMaxDim));
  if (opts.nodes > kMaxNodes)
    return Error(Errc::usage,
                 fmt::format("--nodes {} is above hp's limit of {}", opts.nodes, kMaxNodes));
  if (opts.top_k > 1000)
    return Error(Errc::usage, fmt::format("--top-k {} is above hp's limit of 1000", opts.top_k));
  return Status::success();
}

Expected<PlanOutput> run_command(const PlanOptions& given) {
  HP_TRY(check_plan_numbers(given));
  PlanOptions opts = given;
  HP_ASSIGN_OR_RETURN(model::DimBindings dims, model::parse_dim_bindings(opts.dim_args));
  if (opts.seq > 0) dims.emplace("seq", opts.seq);  // --seq also binds a "seq" dim unless --dim did
  HP_ASSIGN_OR_RETURN(std::optional<recipe::Cluster> cluster, named_cluster(opts));
  if (opts.model.empty()) {
    HP_ASSIGN_OR_RETURN(opts.model, bundled_model(opts.model_dirs));
  }
  if (opts.summary && !opts.explain.empty())
    return Error(Errc::usage, "--explain shows a tensor under a plan: it takes no --summary", "",
                 "'hp plan MODEL --summary' lists the layers; drop one of the two");
  if (opts.summary) return summary_output(opts, dims, std::move(cluster));
  if (!cluster) {
    opts.cluster = "local-cpu";  // also what the report and the recipe name as the cluster
    HP_ASSIGN_OR_RETURN(cluster, named_cluster(opts));
  }
  return plan_output(opts, *cluster);
}

}  // namespace hp::planner
