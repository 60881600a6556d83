// hp shard RECIPE.toml -o DIR | --explain TENSOR [--json]: --json prints the report of what -o
// wrote (hp::shard::ShardReport::json) or the explanation as one JSON object.
#include <fmt/core.h>

#include "commands.h"
#include "hp/core/fs.h"
#include "hp/recipe/presets.h"
#include "hp/shard/shard.h"

namespace hp::cli {

void add_shard_command(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<shard::ShardOptions>();
  CLI::App* sub =
      app.add_subcommand("shard", "derive per-rank slices and write per-rank model partitions");
  sub->add_option("recipe", opts->recipe, "recipe to partition")->required();
  sub->add_option("-o,--output", opts->out_dir,
                  "output directory (written atomically; replaces only an earlier hp shard "
                  "output)");
  sub->add_flag("--force", opts->force,
                "let -o replace a directory that is not an earlier hp shard output (never the "
                "recipe, the model or the working directory)");
  sub->add_option("--explain", opts->explain,
                  "print one tensor's layout, every rank's slice and its redistributions");
  sub->add_flag("--json", opts->json,
                "print one JSON object: the files written (-o) or the explanation (--explain)");
  sub->callback([opts, &ctx] {
    opts->preset_dirs = recipe::preset_dirs(executable_dir(), HP_SOURCE_DIR);
    auto report = shard::run(*opts);
    if (!report) {
      ctx.exit_code = report_error(report.error());
      return;
    }
    fmt::print("{}", report->summary);
  });
}

}  // namespace hp::cli
