// hp verify RECIPE.toml: static checks of a recipe (its keys, its cluster, its model file), and later
// (issue #3) sharded-vs-unsharded output comparison. Thin: flags -> hp::recipe::VerifyOptions ->
// check_recipe() -> summary or errors. See hp-verify(1).
#include <cstdio>
#include <memory>

#include <fmt/core.h>

#include "commands.h"
#include "hp/core/fs.h"
#include "hp/recipe/presets.h"
#include "hp/recipe/verify.h"

namespace hp::cli {

void add_verify_command(CLI::App& app, Context& ctx) {
  struct Flags {
    recipe::VerifyOptions opts;
    std::string recipe, inputs, expected;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand("verify", "check a recipe (and, with --inputs, its outputs)");
  sub->add_option("recipe", f->recipe, "the recipe file (.toml)")->required();
  sub->add_option("--inputs", f->inputs, "directory of input tensors to run the model on (issue #3)");
  sub->add_option("--expected", f->expected, "directory of expected output tensors (issue #3)");
  sub->add_option("--rtol", f->opts.rtol, "relative tolerance of the output comparison")->capture_default_str();
  sub->add_option("--atol", f->opts.atol, "absolute tolerance of the output comparison")->capture_default_str();
  sub->add_option("--backend", f->opts.backend, "plugin to run on (cpu, cuda, ascend)")->capture_default_str();
  sub->add_flag("--json", f->json, "print one JSON object (ok, errors with where/message/hint) on stdout");
  sub->callback([f, &ctx] {
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
