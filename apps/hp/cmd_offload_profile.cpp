// hp offload-profile RECIPE.toml [--hbm BYTES] [--mode train|infer] [--offload KIND,...]
// [--measure]
//                               [--json] [--svg FILE] [-o RECIPE.toml] [...]
//
// The flags fill hp::offload::OffloadOptions; hp::offload::run simulates every stage's memory over
// one step, plans offload under the budget, writes --svg / -o, and the report prints as text or
// JSON. Exit codes: 0 ok; 2 usage (malformed --hbm or --latency-budget, unknown state kind in
// --offload, bad --mode); 3 bad input (unreadable or invalid recipe, a recipe without a plan, a
// model or cluster that does not match it); 4 infeasible (the budget is below what any offload
// schedule needs; the message says how much is needed); 7 unavailable (--measure without the
// backend plugin).
#include <fmt/core.h>

#include "commands.h"
#include "hp/core/fs.h"
#include "hp/offload/offload.h"
#include "hp/recipe/presets.h"

namespace hp::cli {

void add_offload_profile_command(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<offload::OffloadOptions>();
  CLI::App* sub = app.add_subcommand("offload-profile",
                                     "memory timeline, host-pool offload and prefetch schedule");
  sub->add_option("recipe", opts->recipe, "recipe with a plan ([parallel], [[stages]])")
      ->required();
  sub->add_option("--hbm", opts->hbm,
                  "device-memory budget, e.g. 64GiB (default: device memory x (1 - margin))");
  sub->add_option("--mode", opts->mode,
                  "train | infer (default: the recipe's [workload] mode, else train)");
  sub->add_option("--offload", opts->targets,
                  "state kinds that may move to the host: parameters, gradients, optimizer, "
                  "activations, kv_cache")
      ->delimiter(',');
  sub->add_option("--lookahead", opts->lookahead,
                  "slots ahead a prefetch is issued (-1: as early as compute hides it)");
  sub->add_option("--optimizer-ratio", opts->optimizer_ratio,
                  "host share of the optimizer step, 0..1 (default: chosen)");
  sub->add_option("--dtype", opts->dtype,
                  "compute dtype: bf16 | fp16 | fp32 | fp8 (default: the recipe's [workload] "
                  "dtype, else bf16)");
  sub->add_option("--optimizer", opts->optimizer,
                  "adam | adamw | sgd | none (default: the recipe's [workload] optimizer, else "
                  "adam)");
  sub->add_option("--heads", opts->heads,
                  "attention heads (with --kv-heads: grouped-query KV cache)");
  sub->add_option("--kv-heads", opts->kv_heads,
                  "key/value heads (GQA); default: as many as --heads");
  sub->add_option("--latency-budget", opts->latency_budget,
                  "--mode infer: decode latency per token, e.g. 50ms");
  sub->add_flag("--measure", opts->measure, "measure bandwidths with the backend plugin's probes");
  sub->add_flag("--json", opts->json, "print one JSON object");
  sub->add_option("--svg", opts->svg, "write a memory-over-time plot per stage");
  sub->add_option("-o,--output", opts->output,
                  "write the recipe with the chosen [offload] section");
  sub->callback([opts, &ctx] {
    opts->preset_dirs = recipe::preset_dirs(executable_dir(), HP_SOURCE_DIR);
    auto report = offload::run(*opts);
    if (!report) {
      ctx.exit_code = report_error(report.error());
      return;
    }
    fmt::print("{}", opts->json ? offload::format_json(*report) : offload::format_text(*report));
  });
}

}  // namespace hp::cli
