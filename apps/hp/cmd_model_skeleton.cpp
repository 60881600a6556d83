// hp model-skeleton [--arch llama|gpt|moe] [--preset NAME] [--hf-config config.json] [KEY=VALUE...]
//                   -o FILE.onnx
// Writes a weight-less ONNX skeleton that `hp plan` plans like the full model; the generator
// lives in libs/model (hp/model/skeleton.h).
#include <fmt/core.h>
#include <fmt/format.h>

#include <memory>

#include "commands.h"
#include "hp/model/skeleton.h"

namespace hp::cli {

void add_model_skeleton_command(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<model::SkeletonOptions>();
  CLI::App* sub = app.add_subcommand(
      "model-skeleton", "write a weight-less ONNX skeleton of a decoder model for hp plan");
  sub->add_option("settings", opts->settings,
                  "KEY=VALUE overrides: layers, hidden, heads, kv_heads, ffn, vocab, positions, "
                  "tied, bias, dense_layers, dense_ffn, experts, top_k, shared")
      ->type_name("KEY=VALUE");
  sub->add_option("--arch", opts->arch, "llama, gpt or moe (default: the preset's)");
  sub->add_option("--preset", opts->preset,
                  fmt::format("starting sizes: {} (default: the architecture's first)",
                              fmt::join(model::skeleton_presets(), ", ")));
  sub->add_option("--hf-config", opts->hf_config, "a Hugging Face config.json to take sizes from")
      ->type_name("FILE");
  sub->add_option("-o,--output", opts->output, "the .onnx file (written atomically)")
      ->required()
      ->type_name("FILE.onnx");
  sub->callback([opts, &ctx] {
    auto report = model::write_skeleton(*opts);
    if (!report) {
      ctx.exit_code = report_error(report.error());
      return;
    }
    fmt::print("{}", report->summary);
  });
}

}  // namespace hp::cli
