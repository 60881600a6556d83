// `hp devices` as a library call: discovery plus two renderers. Rejected plugins are listed beside
// the loaded ones, each with its reason, because on a CPU-only machine the interesting output is
// exactly why cuda and ascend did not load.
#include "hp/plugin/devices.h"

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "hp/core/units.h"

namespace hp::plugin {

Expected<Registry> list_devices(const DevicesOptions& opts) {
  SearchOptions search;
  search.plugin_paths = opts.plugin_paths;
  search.isolate = true;  // every plugin is probed; one that crashes is listed as such
  return discover(search);
}

Status check_any_loaded(const Registry& reg) {
  if (!reg.loaded().empty()) return Status::success();
  std::vector<Diagnostic> diags;
  diags.push_back(
      {"", "no backend plugin could be loaded",
       "build the cpu plugin, or point --plugin-path / HP_PLUGIN_PATH at a directory holding "
       "libhp-backend-<name>.so files; run 'hp -v devices' to see the paths tried"});
  for (const auto& r : reg.plugins)
    diags.push_back(
        {r.path.string(), fmt::format("{}: {}", verdict_name(r.verdict), r.reason), ""});
  return collect_errors(Errc::unavailable, std::move(diags));
}

Status check_named_plugins(const Registry& reg) {
  std::vector<Diagnostic> diags;
  Errc code = Errc::bad_input;
  for (const auto& r : reg.plugins) {
    if (!r.named || r.ok()) continue;
    if (diags.empty()) {
      if (r.verdict == Verdict::unavailable || r.verdict == Verdict::no_devices)
        code = Errc::unavailable;
      else if (r.verdict == Verdict::open_failed)
        code = Errc::runtime;
    }
    diags.push_back({r.path.string(), fmt::format("{}: {}", verdict_name(r.verdict), r.reason),
                     diags.empty()
                         ? "--plugin-path names this file, so hp treats its rejection as an error"
                         : ""});
  }
  return diags.empty() ? Status::success() : Status(collect_errors(code, std::move(diags)));
}

namespace {

std::string figure_text(const Figure& f, std::string_view unit) {
  if (f.prov == HP_PROV_UNKNOWN || f.value <= 0) return "unknown";
  return fmt::format("{} ({})", format_rate(f.value, unit), prov_name(f.prov));
}

void render_device(std::string& out, const DeviceInfo& d) {
  out += fmt::format("    device {} ({}): {}\n", d.index, kind_name(d.kind), d.name);
  out += fmt::format("      memory        {} total, {} free\n", format_bytes(double(d.mem_total)),
                     format_bytes(double(d.mem_free)));
  std::string clock = d.clock_hz > 0 ? fmt::format(" @ {:.2f} GHz", d.clock_hz / 1e9) : "";
  std::string units =
      d.compute_units > 0 ? fmt::format("{} units", d.compute_units) : "unknown units";
  out += fmt::format("      compute       {}{}, {}\n", units, clock, d.arch);
  for (int t = 0; t < HP_DTYPE_COUNT; ++t) {
    const Figure& f = d.peak_flops[t];
    if (f.prov == HP_PROV_UNKNOWN && t != HP_F32) continue;
    out += fmt::format("      peak {:<8} {}\n", dtype_name(t), figure_text(f, "FLOP"));
  }
  out += fmt::format("      memory bw     {}\n", figure_text(d.mem_bw, "B"));
  out += fmt::format("      h2d bw        {}\n", figure_text(d.h2d_bw, "B"));
  out += fmt::format("      d2h bw        {}\n", figure_text(d.d2h_bw, "B"));
  out += fmt::format("      peer bw       {}\n", figure_text(d.peer_bw, "B"));
  if (!d.note.empty()) out += fmt::format("      note          {}\n", d.note);
}

nlohmann::json figure_json(const Figure& f) {
  return {{"value", f.value}, {"provenance", prov_name(f.prov)}};
}

nlohmann::json device_json(const DeviceInfo& d) {
  nlohmann::json peak = nlohmann::json::object();
  for (int t = 0; t < HP_DTYPE_COUNT; ++t)
    if (d.peak_flops[t].prov != HP_PROV_UNKNOWN) peak[dtype_name(t)] = figure_json(d.peak_flops[t]);
  return {{"index", d.index},
          {"kind", kind_name(d.kind)},
          {"name", d.name},
          {"arch", d.arch},
          {"bus_id", d.bus_id},
          {"memory_bytes", d.mem_total},
          {"memory_free_bytes", d.mem_free},
          {"compute_units", d.compute_units},
          {"clock_hz", d.clock_hz},
          {"peak_flops", peak},
          {"memory_bandwidth", figure_json(d.mem_bw)},
          {"h2d_bandwidth", figure_json(d.h2d_bw)},
          {"d2h_bandwidth", figure_json(d.d2h_bw)},
          {"peer_bandwidth", figure_json(d.peer_bw)},
          {"caps", d.caps},
          {"note", d.note}};
}

}  // namespace

std::string render_devices_text(const Registry& reg, bool verbose) {
  std::string out = "plugins:\n";
  int n_loaded = 0;
  for (const auto& r : reg.plugins) {
    if (!r.ok()) continue;
    ++n_loaded;
    out += fmt::format("  {} {} (abi {}.{}) {} [{}]\n", r.name, r.version, r.abi_major, r.abi_minor,
                       r.path.string(), r.origin);
    for (const auto& d : r.devices) render_device(out, d);
  }
  if (n_loaded == 0) out += "  (none)\n";
  bool any_rejected = false;
  for (const auto& r : reg.plugins) {
    if (r.ok()) continue;
    if (!any_rejected) out += "not loaded:\n";
    any_rejected = true;
    out += fmt::format("  {} {} [{}]\n    {}: {}\n", r.name, r.path.string(), r.origin,
                       verdict_name(r.verdict), r.reason);
  }
  if (verbose) {
    out += "paths tried:\n";
    for (const auto& line : reg.trace) out += "  " + line + "\n";
  }
  return out;
}

std::string render_devices_json(const Registry& reg, bool verbose) {
  nlohmann::json plugins = nlohmann::json::array(), rejected = nlohmann::json::array();
  for (const auto& r : reg.plugins) {
    nlohmann::json j = {{"name", r.name}, {"path", r.path.string()}, {"origin", r.origin}};
    if (r.ok()) {
      j["version"] = r.version;
      j["abi"] = fmt::format("{}.{}", r.abi_major, r.abi_minor);
      j["probe_score"] = r.probe_score;
      nlohmann::json devs = nlohmann::json::array();
      for (const auto& d : r.devices) devs.push_back(device_json(d));
      j["devices"] = devs;
      plugins.push_back(j);
    } else {
      j["verdict"] = verdict_name(r.verdict);
      j["reason"] = r.reason;
      if (r.code != HP_OK) j["code"] = code_name(r.code);
      rejected.push_back(j);
    }
  }
  nlohmann::json root = {{"plugins", plugins}, {"rejected", rejected}};
  if (verbose) root["trace"] = reg.trace;
  return root.dump(2) + "\n";
}

}  // namespace hp::plugin
