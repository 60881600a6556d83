// hp offload-profile RECIPE.toml [--hbm BYTES] [--measure] [--json]
#include <fmt/core.h>

#include "commands.h"
#include "hp/offload/offload.h"

namespace hp::cli {

void add_offload_profile_command(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<offload::OffloadOptions>();
  CLI::App* sub = app.add_subcommand("offload-profile",
                                     "memory timeline, host-pool offload and prefetch schedule");
  sub->add_option("recipe", opts->recipe, "recipe to profile")->required();
  sub->add_option("--hbm", opts->hbm, "device-memory budget, e.g. 64GiB");
  sub->add_flag("--measure", opts->measure, "measure bandwidths with the backend plugin's probes");
  sub->add_flag("--json", opts->json, "print one JSON object");
  sub->callback([opts, &ctx] {
    auto report = offload::run(*opts);
    if (!report) { ctx.exit_code = report_error(report.error()); return; }
    fmt::print("{}", report->summary);
  });
}

}  // namespace hp::cli
