// hp verify RECIPE.toml: static checks of a recipe (its keys, its cluster, its model file:
// hp::recipe::check_recipe), then the sharded job against the unsharded model
// (hp::job::verify_recipe_run; --simulate runs the ranks in-process, --static skips it).
// hp verify MODEL.onnx --inputs DIR --expected DIR: runs the model and compares its outputs
// (hp::job::verify_model). Exit 6 on a mismatch. The file's extension picks the mode.
// Thin: flags -> options struct -> one library call per step -> summary or errors. See hp-verify(1).
#include <cstdio>
#include <memory>

#include <fmt/core.h>

#include "commands.h"
#include "hp/core/fs.h"
#include "hp/recipe/presets.h"
#include "hp/recipe/verify.h"
#include "hp/job/group_flow.h"
#include "hp/job/launch.h"
#include "hp/job/verify_run.h"

namespace hp::cli {

void add_verify_command(CLI::App& app, Context& ctx) {
  struct Flags {
    recipe::VerifyOptions opts;
    std::string recipe, inputs, expected;
    job::RecipeRunOptions run;
    int threads = 0;
    bool json = false, static_only = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand("verify", "check a recipe (and, with --inputs, its outputs)");
  sub->add_option("recipe", f->recipe, "the recipe file (.toml), or a model (.onnx) to run and compare")->required();
  sub->add_option("--inputs", f->inputs, "directory of input_K.pb tensors to run the model on");
  sub->add_option("--expected", f->expected, "directory of expected output_K.pb tensors");
  sub->add_option("--rtol", f->opts.rtol, "relative tolerance of the output comparison")->capture_default_str();
  sub->add_option("--atol", f->opts.atol, "absolute tolerance of the output comparison")->capture_default_str();
  sub->add_option("--backend", f->opts.backend, "plugin to run on (cpu, cuda, ascend)")->capture_default_str();
  sub->add_option("--threads", f->threads, "CPU threads when running a model (default: the cores available)");
  sub->add_flag("--json", f->json, "print one JSON object (ok, errors with where/message/hint) on stdout");
  sub->add_flag("--static", f->static_only, "RECIPE: the static checks only; do not run the sharded job");
  sub->add_flag("--simulate", f->run.simulate, "RECIPE: run all ranks in this process (no MPI)");
  sub->add_option("--seed", f->run.seed, "RECIPE: seed of the generated inputs (without --inputs)")->capture_default_str();
  sub->add_option("--shard-dir", f->run.shard_dir, "RECIPE: verify these hp shard partitions instead of fresh ones");
  sub->add_option("--timeout", f->run.timeout_s, "RECIPE: stop the MPI job after this many seconds");
  sub->add_flag("--allow-run-as-root", f->run.allow_run_as_root, "RECIPE: let Open MPI start ranks as root");
  sub->callback([f, &ctx, sub] {
    if (std::filesystem::path(f->recipe).extension() == ".onnx") {
      job::ModelVerifyOptions mo;
      mo.model = f->recipe;
      mo.inputs = f->inputs;
      mo.expected = f->expected;
      mo.rtol = f->opts.rtol;
      mo.atol = f->opts.atol;
      mo.backend = sub->count("--backend") ? f->opts.backend : std::string();  // default: the best
      mo.threads = f->threads;
      auto report = job::verify_model(mo);
      if (!report) { ctx.exit_code = report_error(report.error()); return; }
      fmt::print("{}", report->format());
      ctx.exit_code = report->ok() ? 0
                                   : report_error(Error(Errc::mismatch, "outputs differ from the expected ones beyond "
                                                        "the tolerance", f->recipe, "see the per-output errors above"));
      return;
    }
    if (!f->expected.empty()) {
      ctx.exit_code = report_error(Error(Errc::usage, "--expected applies to MODEL.onnx; a recipe's outputs are "
                                                      "compared with its unsharded model's"));
      return;
    }
    f->opts.recipe = f->recipe;
    // Presets: the install's share/hp first, then this build's source tree.
    f->opts.preset_dirs = recipe::preset_dirs(executable_dir(), HP_SOURCE_DIR);
    auto result = recipe::check_recipe(f->opts);
    // [[groups]] that exchange tensors: every flow's producer and consumers agree (group_flow.h).
    if (result)
      if (Status flows = job::check_group_flows(f->opts.recipe); !flows.ok()) result = std::move(flows).error();
    if (!result || f->static_only) {
      if (f->json) fmt::print("{}\n", recipe::format_verify_json(f->opts.recipe, result));
      else if (result) fmt::print("{}", recipe::format_verify_summary(*result));
      ctx.exit_code = result ? 0 : report_error(result.error());
      return;
    }
    f->run.recipe = f->recipe;
    f->run.inputs = f->inputs;
    f->run.rtol = f->opts.rtol;
    f->run.atol = f->opts.atol;
    f->run.backend = sub->count("--backend") ? f->opts.backend : std::string();
    f->run.threads = f->threads;
    auto run = job::verify_recipe_run(f->run);
    if (f->json) fmt::print("{}\n", job::add_run_json(recipe::format_verify_json(f->opts.recipe, result), run));
    else fmt::print("{}", recipe::format_verify_summary(*result));
    if (!run) {
      ctx.exit_code = report_error(run.error());
      return;
    }
    if (!f->json) fmt::print("{}", run->format());
    ctx.exit_code = run->ok() ? 0
                              : report_error(Error(Errc::mismatch, "the sharded job's outputs differ from the unsharded "
                                                   "model's beyond the tolerance", f->recipe,
                                                   "see the per-output errors above"));
  });
}

}  // namespace hp::cli
