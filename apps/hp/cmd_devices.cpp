// `hp devices`: which backend plugins this machine has, which were rejected and why, and what each
// device offers (memory, peak FLOP/s, bandwidths, each with its provenance). Discovery and
// rendering live in libs/plugin (hp/plugin/devices.h); this file binds flags and maps the outcome
// to exit codes: 0 when at least one plugin loads, 7 (unavailable) when none does, and an error
// located at the file when a plugin file named with --plugin-path is rejected (3 for a bad file, 7
// for a missing runtime). `--measure` instead measures one backend's GEMM rate and copy bandwidth
// and with `--cluster-out` writes a cluster file of them (libs/offload,
// hp/offload/local_cluster.h).
#include <fmt/core.h>

#include <memory>

#include "commands.h"
#include "hp/offload/local_cluster.h"
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
  auto m = std::make_shared<offload::LocalClusterOptions>();
  auto on = std::make_shared<bool>(false);
  CLI::Option* measure = sub->add_flag("--measure", *on,
                                       "measure a backend's f32 GEMM rate and copy bandwidth "
                                       "instead of listing (a CPU's --ranks all at once)");
  sub->add_option("--backend", m->backend, "the backend --measure probes")
      ->default_str("cpu")
      ->needs(measure);
  sub->add_option("--ranks", m->ranks, "ranks the machine will run (the cluster's per_node)")
      ->default_str("1")
      ->needs(measure);
  sub->add_option("--threads", m->threads, "threads per rank (default: the cores / --ranks)")
      ->needs(measure);
  sub->add_flag("--alone", m->alone,
                "probe one rank by itself, not a CPU's --ranks at once (figures without the "
                "ranks' contention)")
      ->needs(measure);
  sub->add_option(
         "--cluster-out", m->out,
         "write a cluster TOML of the measured figures (for hp plan --cluster and recipes)")
      ->type_name("FILE")
      ->needs(measure);
  sub->callback([opts, m, on, &ctx] {
    if (*on) {
      m->json = opts->json;
      m->plugin_paths = opts->plugin_paths;
      auto r = offload::measure_local_cluster(*m);
      if (!r) {
        ctx.exit_code = report_error(r.error());
        return;
      }
      fmt::print("{}", offload::render_local_cluster(*r, m->json));
      std::fflush(stdout);
      ctx.exit_code = 0;
      return;
    }
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
