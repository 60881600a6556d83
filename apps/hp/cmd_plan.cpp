// hp plan [MODEL] [--summary [--json]] [--dim NAME=VALUE ...] [planner options]
//
// --summary describes the model (hp::model::summarize_model). Otherwise the flags fill
// hp::planner::PlanOptions, hp::planner::run plans on the resolved cluster (local-cpu when none is
// named), and the report is rendered as a table or JSON; -o writes the best plan as a recipe.
#include <fmt/core.h>

#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "hp/core/fs.h"
#include "hp/model/plan_options.h"
#include "hp/planner/planner.h"
#include "hp/recipe/recipe.h"
#include "hp/model/summary.h"
#include "hp/recipe/presets.h"

namespace hp::cli {
namespace {

namespace fs = std::filesystem;

// The bundled model: beside an installed hp first, then in the source tree of a build.
Expected<std::string> default_model() {
  const fs::path rel = fs::path("recipes") / "models" / "tiny-gpt2.onnx";
  const fs::path candidates[] = {executable_dir() / ".." / HP_INSTALL_DATA_DIR / rel, fs::path(HP_SOURCE_DIR) / rel};
  std::error_code ec;
  for (const auto& c : candidates)
    if (fs::is_regular_file(c, ec)) return c.lexically_normal().string();
  return Error(Errc::bad_input, "the bundled model tiny-gpt2.onnx was not found", candidates[0].string(),
               "pass a model file: hp plan MODEL.onnx");
}

// --cluster (preset name or file) scaled to --nodes. Resolved before the model is read so a bad
// cluster is reported as bad input whatever else is asked; nullopt when no cluster was named.
Expected<std::optional<recipe::Cluster>> resolve_cluster(const planner::PlanOptions& opts) {
  if (opts.cluster.empty()) {
    if (opts.nodes > 0)
      return Error(Errc::usage, "--nodes needs --cluster", "", "name a preset, e.g. --cluster dgx-h100");
    return std::optional<recipe::Cluster>();
  }
  auto dirs = recipe::preset_dirs(executable_dir(), HP_SOURCE_DIR);
  auto cluster = recipe::load_cluster_ref(opts.cluster, fs::current_path(), dirs);
  if (!cluster) return std::move(cluster).error();
  if (opts.nodes == 0) return std::optional<recipe::Cluster>(std::move(*cluster));
  auto scaled = recipe::scale_cluster(*cluster, opts.nodes);
  if (!scaled) return std::move(scaled).error();
  return std::optional<recipe::Cluster>(std::move(*scaled));
}

std::string describe_cluster(const recipe::Cluster& c) {
  const auto* dev = c.rank_device_type();
  return fmt::format("{}: {} node(s) x {} {} = {} ranks", c.name, c.nodes, c.ranks_per_node(),
                     dev ? dev->name : c.rank_device, c.ranks());
}

// The summary text with the cluster it will be planned on, in the same form (table or JSON).
std::string render_summary(const model::ModelSummary& s, const std::optional<recipe::Cluster>& c,
                           bool json) {
  if (!json) {
    std::string text = model::format_summary_text(s);
    return c ? fmt::format("{:<13} {}\n", "cluster", describe_cluster(*c)) + text : text;
  }
  auto j = nlohmann::json::parse(model::format_summary_json(s));
  if (c) {
    const auto* dev = c->rank_device_type();
    j["cluster"] = {{"name", c->name}, {"nodes", c->nodes}, {"ranks", c->ranks()},
                    {"rank_device", dev ? dev->name : c->rank_device}};
  }
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// Plans and renders; -o writes the recipe of the best plan.
int run_planner(const planner::PlanOptions& opts, std::optional<recipe::Cluster> cluster) {
  if (!cluster) {
    planner::PlanOptions local = opts;
    local.cluster = "local-cpu";
    auto c = resolve_cluster(local);
    if (!c) return report_error(c.error());
    cluster = std::move(*c);
  }
  if (!opts.sweep.empty()) {
    if (!opts.output.empty() || !opts.schedule_svg.empty() || opts.compare)
      return report_error(Error(Errc::usage, "--sweep prints one row per value: it takes no -o, --schedule-svg or --compare",
                                "", "run the value you want without --sweep"));
    auto rows = planner::run_sweep(opts, *cluster);
    if (!rows) return report_error(rows.error());
    fmt::print("{}", *rows);
    return 0;
  }
  auto report = planner::run(opts, *cluster);
  if (!report) return report_error(report.error());
  if (report->cluster_ref.empty()) report->cluster_ref = "local-cpu";
  for (const auto& w : report->warnings) report_warning(opts.model, w);
  fmt::print("{}", opts.json ? planner::format_plan_json(*report) : planner::format_plan_text(*report));
  if (!opts.schedule_svg.empty())
    if (auto svg = write_file_atomic(opts.schedule_svg, planner::schedule_svg(*report)); !svg) return report_error(svg.error());
  if (opts.output.empty()) return 0;
  auto written = recipe::write_recipe(planner::plan_to_recipe(*report, opts.output), opts.output);
  return written ? 0 : report_error(written.error());
}

int run_plan(planner::PlanOptions opts) {
  auto dims = model::parse_dim_bindings(opts.dim_args);
  if (!dims) return report_error(dims.error());
  if (opts.seq > 0) dims->emplace("seq", opts.seq);   // --seq also binds a "seq" dim unless --dim did
  auto cluster = resolve_cluster(opts);
  if (!cluster) return report_error(cluster.error());
  if (opts.model.empty()) {
    auto path = default_model();
    if (!path) return report_error(path.error());
    opts.model = *path;
  }
  if (!opts.summary) return run_planner(opts, *cluster);
  auto summary = model::summarize_model({opts.model, *dims, opts.require_data});
  if (!summary) return report_error(summary.error());
  for (const auto& w : summary->warnings) report_warning(opts.model, w);
  std::string text = render_summary(*summary, *cluster, opts.json);
  if (opts.output.empty()) {
    fmt::print("{}", text);
    return 0;
  }
  auto written = write_file_atomic(opts.output, text);
  return written ? 0 : report_error(written.error());
}

}  // namespace

void add_plan_command(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<planner::PlanOptions>();
  CLI::App* sub = app.add_subcommand("plan", "plan a parallel execution of a model (--summary: describe it)");
  sub->add_option("model", opts->model, "ONNX model (default: the bundled tiny-gpt2)");
  sub->add_flag("--summary", opts->summary, "print parameters, FLOPs, layers and ops instead of planning");
  sub->add_flag("--json", opts->json, "print the summary as one JSON object");
  sub->add_option("--dim", opts->dim_args, "bind a symbolic input dim, NAME=VALUE (repeatable)")
      ->allow_extra_args(false);
  sub->add_flag("--require-data", opts->require_data, "fail when external weight files are absent");
  sub->add_option("--cluster", opts->cluster, "cluster preset name or cluster TOML file");
  sub->add_option("--nodes", opts->nodes, "number of cluster nodes (default: the cluster file's)")->check(CLI::PositiveNumber);
  sub->add_option("--global-batch", opts->global_batch, "sequences per training step")->check(CLI::PositiveNumber);
  sub->add_option("--seq", opts->seq, "sequence length (also binds dim 'seq')")->check(CLI::PositiveNumber);
  sub->add_option("--dtype", opts->dtype, "compute dtype")->check(CLI::IsMember({"fp32", "fp16", "bf16", "fp8"}));
  sub->add_option("--optimizer", opts->optimizer, "optimizer whose states are planned for")
      ->check(CLI::IsMember({"adam", "adamw", "sgd", "none"}));
  sub->add_option("--mode", opts->mode, "train or infer")->check(CLI::IsMember({"train", "infer"}));
  sub->add_option("-o,--output", opts->output, "file to write (the recipe; with --summary, the summary)");
  sub->add_option("--fix", opts->fix_args, "pin KEY=VALUE (dp, tp, pp, ep, optimizer_shard, micro_batch_size, micro_batches, "
                                           "schedule, virtual_stages, sequence_parallel, recompute); repeatable")
      ->allow_extra_args(false);
  sub->add_flag("--compare", opts->compare, "also plan with a DP x TP-only planner and a greedy one-axis-at-a-time "
                                           "expert, and print the best plan's speedup over each");
  sub->add_option("--sweep", opts->sweep, "plan once per value: nodes=1,2,4,8 or global-batch=64,128 (CSV; JSON lines "
                                          "with --json)");
  sub->add_option("--schedule-svg", opts->schedule_svg, "draw the best plan's pipeline schedule into this SVG file");
  sub->add_option("--top-k", opts->top_k, "number of ranked plans to report")->check(CLI::PositiveNumber);
  sub->callback([opts, &ctx] { ctx.exit_code = run_plan(*opts); });
}

}  // namespace hp::cli
