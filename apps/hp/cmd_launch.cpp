// hp launch MODEL.onnx --inputs DIR --outputs DIR [--backend B] [--threads N]: runs a model on one rank
// (hp::runtime::launch). RECIPE.toml targets (MPMD jobs) arrive with issue #6. See hp-launch(1).
#include <fmt/core.h>

#include "commands.h"
#include "hp/runtime/launch.h"

namespace hp::cli {

void add_launch_command(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<runtime::LaunchOptions>();
  CLI::App* sub = app.add_subcommand("launch", "run a recipe (MPMD process groups) or a model");
  sub->add_option("target", opts->target, "RECIPE.toml or MODEL.onnx")->required();
  sub->add_option("--inputs", opts->inputs, "directory of input_K.pb tensors");
  sub->add_option("--outputs", opts->outputs, "directory to write output_K.pb tensors (replaced atomically)");
  sub->add_option("--backend", opts->backend, "cpu, cuda or ascend (default: best available)");
  sub->add_option("--threads", opts->threads, "CPU threads (default: the cores available)");
  sub->add_option("--plugin-path", opts->plugin_paths, "extra plugin directory or file (repeatable)");
  sub->add_option("--hostfile", opts->hostfile, "Open MPI hostfile for a multi-node run");
  sub->add_option("--timeout", opts->timeout_s, "stop the job after this many seconds");
  sub->add_flag("--dry-run", opts->dry_run, "print the mpirun command and app file; start nothing");
  sub->callback([opts, &ctx] {
    auto report = runtime::launch(*opts);
    if (!report) { ctx.exit_code = report_error(report.error()); return; }
    fmt::print("{}", report->summary);
  });
}

}  // namespace hp::cli
