// `hp devices`: which backend plugins this machine has, which were rejected and why, and what each
// device offers (memory, peak FLOP/s, bandwidths, each with its provenance). Discovery and
// rendering live in libs/plugin (hp/plugin/devices.h); this file binds flags and maps the outcome
// to exit codes: 0 when at least one plugin loads, 7 (unavailable) when none does, and an error
// located at the file when a plugin file named with --plugin-path is rejected (3 for a bad file, 7
// for a missing runtime).
#include <fmt/core.h>

#include <memory>

#include "commands.h"
#include "hp/plugin/devices.h"

namespace hp::cli {

void add_devices_command(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<plugin::DevicesOptions>();
  CLI::App* sub = app.add_subcommand(
      "devices", "list backend plugins, why any was rejected, and their devices");
  sub->add_option("--plugin-path", opts->plugin_paths,
                  "directory (or plugin file) searched before $HP_PLUGIN_PATH, the install dir and "
                  "the build tree")
      ->type_name("DIR");
  sub->add_flag("--json", opts->json, "print one JSON object instead of text");
  sub->callback([opts, &ctx] {
    opts->verbose = ctx.verbose;
    auto reg = plugin::list_devices(*opts);
    if (!reg) {
      ctx.exit_code = report_error(reg.error());
      return;
    }
    fmt::print("{}", opts->json ? plugin::render_devices_json(*reg, opts->verbose)
                                : plugin::render_devices_text(*reg, opts->verbose));
    std::fflush(stdout);
    Status st = plugin::check_named_plugins(*reg);
    if (st) st = plugin::check_any_loaded(*reg);
    ctx.exit_code = st ? 0 : report_error(st.error());
  });
}

}  // namespace hp::cli
