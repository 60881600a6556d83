// hp verify RECIPE.toml: static checks of a recipe (its keys, its cluster, its model file), and later
// sharded-vs-unsharded output comparison. hp verify MODEL.onnx --inputs DIR --expected DIR: runs the
// model and compares its outputs (hp::runtime::verify_model), exit 6 on a mismatch. The file's
// extension picks the mode. Thin: flags -> options struct -> one library call -> summary or errors.
// See hp-verify(1).
#include <cstdio>
#include <memory>

#include <fmt/core.h>

#include "commands.h"
#include "hp/core/fs.h"
#include "hp/recipe/presets.h"
#include "hp/recipe/verify.h"
#include "hp/runtime/launch.h"

namespace hp::cli {

void add_verify_command(CLI::App& app, Context& ctx) {
  struct Flags {
    recipe::VerifyOptions opts;
    std::string recipe, inputs, expected;
    int threads = 0;
    bool json = false;
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
  sub->callback([f, &ctx, sub] {
    if (std::filesystem::path(f->recipe).extension() == ".onnx") {
      runtime::ModelVerifyOptions mo;
      mo.model = f->recipe;
      mo.inputs = f->inputs;
      mo.expected = f->expected;
      mo.rtol = f->opts.rtol;
      mo.atol = f->opts.atol;
      mo.backend = sub->count("--backend") ? f->opts.backend : std::string();  // default: the best
      mo.threads = f->threads;
      auto report = runtime::verify_model(mo);
      if (!report) { ctx.exit_code = report_error(report.error()); return; }
      fmt::print("{}", report->format());
      ctx.exit_code = report->ok() ? 0
                                   : report_error(Error(Errc::mismatch, "outputs differ from the expected ones beyond "
                                                        "the tolerance", f->recipe, "see the per-output errors above"));
      return;
    }
    f->opts.recipe = f->recipe;
    f->opts.inputs = f->inputs;
    f->opts.expected = f->expected;
    // Presets: the install's share/hp first, then this build's source tree.
    f->opts.preset_dirs = recipe::preset_dirs(executable_dir(), HP_SOURCE_DIR);
    auto result = recipe::check_recipe(f->opts);
    if (f->json) fmt::print("{}\n", recipe::format_verify_json(f->opts.recipe, result));
    if (!result) {
      ctx.exit_code = report_error(result.error());
      return;
    }
    if (!f->json) fmt::print("{}", recipe::format_verify_summary(*result));
    ctx.exit_code = 0;
  });
}

}  // namespace hp::cli
