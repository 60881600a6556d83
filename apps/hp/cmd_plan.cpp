// hp plan [MODEL] [--summary [--json]] [--dim NAME=VALUE ...] [--explain NAME] [planner options]
//
// The flags fill hp::planner::PlanOptions; hp::planner::run_command resolves the model (the bundled
// tiny-gpt2 when none is named) and the cluster (local-cpu when none is named), then summarises the
// model (--summary) or plans it, and returns what to print and the files to write (-o,
// --schedule-svg).
#include <fmt/core.h>

#include <filesystem>

#include "commands.h"
#include "hp/core/fs.h"
#include "hp/planner/planner.h"
#include "hp/recipe/presets.h"
#include "hp/shard/shard.h"

namespace hp::cli {
namespace {

int run_plan(const planner::PlanOptions& opts) {
  auto out = planner::run_command(opts);
  if (!out) return report_error(out.error());
  for (const auto& w : out->warnings) report_warning(out->model, w);
  fmt::print("{}", out->text);
  for (const auto& f : out->files)
    if (auto written = write_file_atomic(f.path, f.contents); !written)
      return report_error(written.error());
  return out->failure ? report_error(*out->failure) : 0;
}

// --explain: hp shard's explanation of a tensor under a recipe not written yet.
Expected<std::string> explain_in_recipe(const recipe::Recipe& r, const std::filesystem::path& at,
                                        const std::string& name, bool json) {
  HP_ASSIGN_OR_RETURN(auto prepared, shard::prepare(r, recipe::SourceMap(at.string()), at));
  return shard::explain(*prepared, name, json);
}

}  // namespace

void add_plan_command(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<planner::PlanOptions>();
  CLI::App* sub =
      app.add_subcommand("plan", "plan a parallel execution of a model (--summary: describe it)");
  sub->add_option("model", opts->model, "ONNX model (default: the bundled tiny-gpt2)");
  sub->add_flag("--summary", opts->summary,
                "print parameters, FLOPs, layers and ops instead of planning");
  sub->add_flag("--json", opts->json, "print the summary as one JSON object");
  sub->add_option("--dim", opts->dim_args, "bind a symbolic input dim, NAME=VALUE (repeatable)")
      ->allow_extra_args(false);
  sub->add_flag("--require-data", opts->require_data, "fail when external weight files are absent");
  sub->add_option("--cluster", opts->cluster, "cluster preset name or cluster TOML file");
  sub->add_option("--nodes", opts->nodes, "number of cluster nodes (default: the cluster file's)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--global-batch", opts->global_batch, "sequences per training step")
      ->check(CLI::PositiveNumber);
  sub->add_option("--seq", opts->seq, "sequence length (also binds dim 'seq')")
      ->check(CLI::PositiveNumber);
  sub->add_option("--dtype", opts->dtype, "compute dtype")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16", "fp8"}));
  sub->add_option("--optimizer", opts->optimizer, "optimizer whose states are planned for")
      ->check(CLI::IsMember({"adam", "adamw", "sgd", "none"}));
  CLI::Option* mode =
      sub->add_option("--mode", opts->mode, "train or infer (train: -o also writes [train])")
          ->check(CLI::IsMember({"train", "infer"}));
  sub->add_option("-o,--output", opts->output,
                  "file to write (the recipe; with --summary, the summary)");
  sub->add_option("--fix", opts->fix_args,
                  "pin KEY=VALUE (dp, tp, pp, ep, optimizer_shard, shard_group, micro_batch_size, "
                  "micro_batches, schedule, virtual_stages, sequence_parallel, recompute; aliases: "
                  "data, tensor, pipeline, expert, zero, zero_stage, mbs, sp); repeatable")
      ->allow_extra_args(false);
  sub->add_flag("--compare", opts->compare,
                "also plan with a DP x TP-only planner and a greedy one-axis-at-a-time "
                "expert, and print the best plan's speedup over each");
  sub->add_option("--sweep", opts->sweep,
                  "plan once per value: nodes=1,2,4,8, global-batch=64,128 or seq=1024,2048; "
                  "repeat for more axes (every combination, first axis outermost); CSV, or JSON "
                  "lines with --json; exits 4 when any point is infeasible")
      ->allow_extra_args(false);
  sub->add_flag("--allow-infeasible", opts->allow_infeasible,
                "with --sweep: exit 0 even when some points are infeasible");
  sub->add_flag("--timing", opts->timing,
                "with --sweep: add the search_seconds column (differs between runs)");
  sub->add_option("--schedule-svg", opts->schedule_svg,
                  "draw the best plan's pipeline schedule into this SVG file");
  sub->add_option("--explain", opts->explain,
                  "print one tensor's layout and slices under the best plan (ONNX or PyTorch "
                  "parameter name; see hp shard --explain)");
  sub->add_option("--top-k", opts->top_k, "number of ranked plans to report")
      ->check(CLI::PositiveNumber);
  sub->footer(
      "Exit status: 0 a plan was found (a --sweep: every point has one, or --allow-infeasible);\n"
      "2 bad command line (a malformed --sweep or --fix); 3 bad input; 4 infeasible: no plan fits\n"
      "(a --sweep prints every row, then exits 4 when any point is infeasible). See hp-plan(1).");
  auto list_clusters = std::make_shared<bool>(false);
  sub->add_flag("--list-clusters", *list_clusters,
                "list the cluster presets --cluster takes (with --json: a JSON array) and exit");
  sub->callback([opts, mode, list_clusters, &ctx] {
    if (*list_clusters) {
      fmt::print("{}", recipe::format_presets(recipe::describe_presets(recipe::preset_dirs(
                                                  executable_dir(), HP_SOURCE_DIR)),
                                              opts->json));
      return;
    }
    opts->train_table = mode->count() > 0 && opts->mode == "train";
    opts->preset_dirs = recipe::preset_dirs(executable_dir(), HP_SOURCE_DIR);
    opts->command = ctx.command_line;
    opts->check_plan = shard::check_shardable;
    opts->explain_tensor = explain_in_recipe;
    opts->model_dirs = {executable_dir() / ".." / HP_INSTALL_DATA_DIR / "recipes" / "models",
                        std::filesystem::path(HP_SOURCE_DIR) / "recipes" / "models"};
    ctx.exit_code = run_plan(*opts);
  });
}

}  // namespace hp::cli
