// Text, JSON and SVG renderings of an OffloadReport. Bytes print with binary units (GiB), rates
// with decimal ones (GB/s), as everywhere in hp.
#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "hp/core/units.h"
#include "hp/offload/offload.h"

namespace hp::offload {
namespace {

std::string breakdown_text(const Breakdown& b) {
  std::string s;
  for (int k = 0; k < kKinds; ++k) {
    if (b[k] <= 0) continue;
    if (!s.empty()) s += ", ";
    s += fmt::format("{} {}", kind_name(static_cast<Kind>(k)), format_bytes(b[k]));
  }
  return s.empty() ? "nothing" : s;
}

nlohmann::json breakdown_json(const Breakdown& b) {
  nlohmann::json j = nlohmann::json::object();
  for (int k = 0; k < kKinds; ++k) j[kind_name(static_cast<Kind>(k))] = b[k];
  return j;
}

std::string targets_text(const std::vector<Target>& ts) {
  std::string s;
  for (auto t : ts) s += (s.empty() ? "" : ", ") + std::string(target_name(t));
  return s;
}

double transfer_exposed(const StageSchedule& s, bool to_device) {
  double e = 0;
  for (const auto& x : s.transfers)
    if (x.to_device == to_device) e += x.exposed;
  return e;
}

double transfer_bytes(const StageSchedule& s, bool to_device) {
  double b = 0;
  for (const auto& x : s.transfers)
    if (x.to_device == to_device) b += x.bytes;
  return b;
}

}  // namespace

std::string format_text(const OffloadReport& r) {
  std::string o;
  o += fmt::format("recipe        {}\n", r.recipe);
  o += fmt::format("cluster       {} ({}, {} per device)\n", r.cluster, r.device,
                   format_bytes(r.device_memory));
  o += fmt::format(
      "plan          dp{} tp{} pp{} optimizer_shard {} mbs{}x{} {} seq {} ({}, {}, {})\n", r.dp,
      r.tp, r.pp, recipe::optimizer_shard_name(r.zero), r.micro_batch_size, r.micro_batches,
      r.schedule, r.seq, r.mode, r.dtype, r.optimizer);
  o += fmt::format("budget        {} ({})\n", format_bytes(r.budget), r.budget_source);
  o += fmt::format("host link     h2d {} [{}], d2h {} [{}]\n", format_rate(r.h2d.value, "B"),
                   r.h2d.source, format_rate(r.d2h.value, "B"), r.d2h.source);
  o += fmt::format("may offload   {}\n", targets_text(r.targets));
  for (const auto& s : r.stages) {
    const Slot& pk = s.timeline.slots[s.timeline.peak];
    o += fmt::format("\nstage {} ({} units, {} slots)\n", s.input.stage, s.input.units.size(),
                     s.timeline.slots.size());
    o +=
        fmt::format("  peak before   {} at {:.4g} s, {} (slot {})\n", format_bytes(s.peak_before()),
                    pk.start, describe_slot(s.input, pk), s.timeline.peak);
    o += fmt::format("                {}\n", breakdown_text(pk.memory));
    if (!s.schedule) {
      o += fmt::format("  fits the budget: no offload\n");
      continue;
    }
    const StageSchedule& sc = *s.schedule;
    const Slot& pa = s.timeline.slots[sc.peak];
    o += fmt::format("  peak after    {} at {}\n", format_bytes(sc.peak_bytes),
                     describe_slot(s.input, pa));
    o += fmt::format("                {}\n", breakdown_text(sc.memory[sc.peak]));
    o += fmt::format("  host pool     {} (peak)\n", format_bytes(sc.host_peak));
    o += fmt::format("  optimizer     {:.0f}% of the step on the host ({} units)\n",
                     100 * sc.optimizer_ratio, sc.host_units);
    o += fmt::format("  transfers     {} h2d ({}), {} d2h ({}); {} evictions, {} fetches\n",
                     format_bytes(transfer_bytes(sc, true)),
                     format_seconds(transfer_exposed(sc, true)) + " exposed",
                     format_bytes(transfer_bytes(sc, false)),
                     format_seconds(transfer_exposed(sc, false)) + " exposed", sc.evictions,
                     sc.fetches);
    o += fmt::format("  exposed       {} of {} stage work\n", format_seconds(sc.exposed),
                     format_seconds(sc.step));
  }
  o += fmt::format("\npeak          {} before, {} after offload (budget {})\n",
                   format_bytes(std::max_element(r.stages.begin(), r.stages.end(),
                                                 [](const StageReport& a, const StageReport& b) {
                                                   return a.peak_before() < b.peak_before();
                                                 })
                                    ->peak_before()),
                   format_bytes(std::max_element(r.stages.begin(), r.stages.end(),
                                                 [](const StageReport& a, const StageReport& b) {
                                                   return a.peak_after() < b.peak_after();
                                                 })
                                    ->peak_after()),
                   format_bytes(r.budget));
  o += fmt::format(
      "step          {} predicted without offload, {} exposed transfers, {} with offload\n",
      format_seconds(r.step_before), format_seconds(r.exposed), format_seconds(r.step_after));
  if (r.capacity) {
    const auto& c = *r.capacity;
    o += fmt::format("\ninference     KV cache {} per token (one sequence, summed over stages)\n",
                     format_bytes(c.kv_per_token));
    o += fmt::format("  at recipe   context {}, batch {}: decode {} per token\n", c.context,
                     c.batch, format_seconds(c.latency_at_recipe));
    for (bool off : {false, true}) {
      const CapacityFigure& f = off ? c.offloaded : c.device;
      o += fmt::format(
          "  KV {:<8} longest context {} (batch {}), largest batch {} (context {}), decode {} per "
          "token\n",
          off ? "offload" : "on device", f.max_context, c.batch, f.max_batch, c.context,
          format_seconds(f.latency));
      if (c.latency_budget > 0)
        o += fmt::format("              within {} per token: longest context {}\n",
                         format_seconds(c.latency_budget), f.max_context_in_latency);
    }
  }
  if (r.measured) {
    const auto& m = *r.measured;
    o += fmt::format("\nmeasured      {} on {}, median of {} ({})\n", m.probe, m.device, m.repeats,
                     m.date);
    for (const auto& s : m.sizes)
      o += fmt::format("  {:>10}  h2d {}  d2h {}  memcpy {}  (vs memcpy: h2d {:.3f}, d2h {:.3f})\n",
                       format_bytes(s.bytes), format_rate(s.h2d, "B"), format_rate(s.d2h, "B"),
                       format_rate(s.memcpy, "B"), s.h2d_vs_memcpy, s.d2h_vs_memcpy);
  }
  for (const auto& n : r.notes) o += fmt::format("note: {}\n", n);
  return o;
}

std::string format_json(const OffloadReport& r) {
  using nlohmann::json;
  json j;
  j["recipe"] = r.recipe;
  j["cluster"] = r.cluster;
  j["device"] = r.device;
  j["mode"] = r.mode;
  j["plan"] = {{"dp", r.dp},
               {"tp", r.tp},
               {"pp", r.pp},
               {"optimizer_shard", recipe::optimizer_shard_name(r.zero)},
               {"micro_batch_size", r.micro_batch_size},
               {"micro_batches", r.micro_batches},
               {"schedule", r.schedule},
               {"seq", r.seq}};
  j["budget"] = {
      {"bytes", r.budget}, {"source", r.budget_source}, {"device_memory", r.device_memory}};
  j["h2d_bandwidth"] = {{"value", r.h2d.value}, {"source", r.h2d.source}};
  j["d2h_bandwidth"] = {{"value", r.d2h.value}, {"source", r.d2h.source}};
  j["host_memory"] = {{"value", r.host_memory.value}, {"source", r.host_memory.source}};
  json targets = json::array();
  for (auto t : r.targets) targets.push_back(target_name(t));
  j["targets"] = targets;
  j["offloaded"] = r.offloaded;
  double before = 0, after = 0;
  json stages = json::array();
  for (const auto& s : r.stages) {
    before = std::max(before, s.peak_before());
    after = std::max(after, s.peak_after());
    const Slot& pk = s.timeline.slots[s.timeline.peak];
    json st = {{"stage", s.input.stage},
               {"units", s.input.units.size()},
               {"slots", s.timeline.slots.size()},
               {"peak_before",
                {{"bytes", s.peak_before()},
                 {"slot", s.timeline.peak},
                 {"time", pk.start},
                 {"at", describe_slot(s.input, pk)},
                 {"breakdown", breakdown_json(pk.memory)}}}};
    if (s.schedule) {
      const auto& sc = *s.schedule;
      st["peak_after"] = {{"bytes", sc.peak_bytes},
                          {"slot", sc.peak},
                          {"at", describe_slot(s.input, s.timeline.slots[sc.peak])},
                          {"breakdown", breakdown_json(sc.memory[sc.peak])}};
      st["host_peak"] = sc.host_peak;
      st["optimizer_ratio"] = sc.optimizer_ratio;
      st["exposed_seconds"] = sc.exposed;
      st["stage_seconds"] = sc.step;
      st["h2d_bytes"] = transfer_bytes(sc, true);
      st["d2h_bytes"] = transfer_bytes(sc, false);
      // Every copy, timed on its link; exposed > 0 marks the ones compute waited for.
      json xs = json::array();
      for (const auto& x : sc.transfers)
        xs.push_back({{"kind", kind_name(x.kind)},
                      {"unit", s.input.units[static_cast<std::size_t>(x.unit)].name},
                      {"micro_batch", x.micro},
                      {"direction", x.to_device ? "h2d" : "d2h"},
                      {"bytes", x.bytes},
                      {"start", x.start},
                      {"end", x.end},
                      {"exposed", x.exposed},
                      {"hidden", x.exposed <= 0}});
      st["transfers"] = xs;
      st["evictions"] = sc.evictions;
      st["fetches"] = sc.fetches;
      st["lower_bound"] = sc.lower_bound;
      double max_mem = 0;
      for (const auto& m : sc.memory) max_mem = std::max(max_mem, sum(m));
      st["max_slot_bytes"] = max_mem;
    }
    stages.push_back(st);
  }
  j["stages"] = stages;
  j["peak_before"] = before;
  j["peak_after"] = after;
  j["step"] = {{"before", r.step_before}, {"exposed", r.exposed}, {"after", r.step_after}};
  if (r.capacity) {
    const auto& c = *r.capacity;
    auto fig = [](const CapacityFigure& f) {
      return json{{"max_context", f.max_context},
                  {"max_batch", f.max_batch},
                  {"latency", f.latency},
                  {"max_context_in_latency", f.max_context_in_latency}};
    };
    j["capacity"] = {{"context", c.context},
                     {"batch", c.batch},
                     {"kv_per_token", c.kv_per_token},
                     {"latency_budget", c.latency_budget},
                     {"latency_at_recipe", c.latency_at_recipe},
                     {"device", fig(c.device)},
                     {"offloaded", fig(c.offloaded)}};
  }
  if (r.measured) {
    const auto& m = *r.measured;
    json sizes = json::array();
    for (const auto& s : m.sizes)
      sizes.push_back({{"bytes", s.bytes},
                       {"h2d", s.h2d},
                       {"d2h", s.d2h},
                       {"memcpy", s.memcpy},
                       {"h2d_vs_memcpy", s.h2d_vs_memcpy},
                       {"d2h_vs_memcpy", s.d2h_vs_memcpy}});
    j["measured"] = {{"backend", m.backend},
                     {"probe", m.probe},
                     {"date", m.date},
                     {"repeats", m.repeats},
                     {"h2d", m.h2d},
                     {"d2h", m.d2h},
                     {"memcpy", m.memcpy},
                     {"h2d_vs_memcpy", m.h2d_vs_memcpy},
                     {"d2h_vs_memcpy", m.d2h_vs_memcpy},
                     {"source", m.source()},
                     {"sizes", sizes}};
  }
  j["notes"] = r.notes;
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

// One panel per pipeline stage, all on the same time and memory scales (a stage whose curve looks
// higher holds more), under a visible legend on a white background. Each panel's texts sit in
// their own bands: the title above the plot, memory ticks left of it, the transfer ticks just
// below it and the time ticks below those, so no two labels share a place.
std::string format_svg(const OffloadReport& r) {
  const double W = 900, H = 230, L = 80, R = 30, head = 62, T = 24, B = 58;
  const double total_h = head + H * static_cast<double>(r.stages.size()) + 10;
  double tmax = 0, ymax = r.budget;
  for (const StageReport& s : r.stages) {
    tmax = std::max({tmax, s.timeline.step, s.schedule ? s.schedule->step : 0.0});
    ymax = std::max(ymax, s.peak_before());
  }
  if (tmax <= 0) tmax = 1;
  if (ymax <= 0) ymax = 1;
  ymax *= 1.05;
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      W, total_h);
  o += "<title>hp offload-profile: device memory over one step per pipeline stage</title>\n";
  o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W,
                   total_h);
  o += fmt::format(
      "<text x=\"{}\" y=\"18\" font-size=\"13\">device memory over one step, per pipeline stage "
      "(every panel on the same time and memory scales)</text>\n",
      L);
  // The legend: line samples for the curves, swatches for the transfer ticks.
  o += "<g class=\"legend\">\n";
  double lx = L;
  const double ly = 40;
  auto key_line = [&](const char* colour, const char* dash, const char* label) {
    o += fmt::format(
        "<line x1=\"{0:.0f}\" x2=\"{1:.0f}\" y1=\"{2:.0f}\" y2=\"{2:.0f}\" stroke=\"{3}\" "
        "stroke-width=\"2\"{4}/>\n",
        lx, lx + 18, ly, colour, dash);
    o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">{}</text>\n", lx + 22, ly + 4, label);
    lx += 30 + 6.2 * static_cast<double>(std::string_view(label).size());
  };
  auto key_box = [&](const char* colour, const char* label) {
    o += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"12\" height=\"6\" fill=\"{}\"/>\n",
                     lx, ly - 3, colour);
    o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">{}</text>\n", lx + 16, ly + 4, label);
    lx += 24 + 6.2 * static_cast<double>(std::string_view(label).size());
  };
  key_line("#888", "", "without offload");
  key_line("#1f6fd0", "", "with offload");
  key_line("#d03030", " stroke-dasharray=\"6,4\"", "budget");
  key_box("#2a9d4a", "h2d (hidden)");
  key_box("#e08a1e", "d2h (hidden)");
  key_box("#d03030", "exposed transfer");
  o += "</g>\n";

  const double tstep = nice_step(tmax / 8);
  // Memory ticks at round numbers of GiB (MiB for small models).
  const double yunit = ymax >= 1024.0 * 1024 * 1024 ? 1024.0 * 1024 * 1024 : 1024.0 * 1024;
  const char* yname = yunit > 1024.0 * 1024 ? "GiB" : "MiB";
  const double ystep = nice_step(ymax / 4 / yunit) * yunit;
  for (std::size_t i = 0; i < r.stages.size(); ++i) {
    const StageReport& s = r.stages[i];
    const double y0 = head + H * static_cast<double>(i);
    const double plot_bottom = y0 + H - B;
    const auto& slots = s.timeline.slots;
    auto X = [&](double t) { return L + (W - L - R) * t / tmax; };
    auto Y = [&](double b) { return y0 + T + (H - T - B) * (1 - b / ymax); };
    o += fmt::format("<g class=\"stage\" data-tmax=\"{:.9g}\" data-ymax=\"{:.9g}\">\n", tmax, ymax);
    o += fmt::format(
        "<text x=\"{}\" y=\"{}\">stage {}: peak {} before, {} after, budget {}</text>\n", L,
        y0 + 16, s.input.stage, format_bytes(s.peak_before()), format_bytes(s.peak_after()),
        format_bytes(r.budget));
    o += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n", L,
        y0 + T, W - L - R, H - T - B);
    // Memory ticks, right-aligned left of the plot.
    for (double b = 0; b <= ymax * (1 + 1e-9); b += ystep) {
      o += fmt::format(
          "<line x1=\"{:.0f}\" x2=\"{:.0f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#999\"/>\n",
          L - 4, L, Y(b), Y(b));
      o += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", L - 6,
                       Y(b) + 4, fmt::format("{:g} {}", b / yunit, yname));
    }
    auto line = [&](const std::vector<std::pair<double, double>>& pts, const char* colour) {
      std::string d;
      for (const auto& [t, b] : pts) d += fmt::format("{:.1f},{:.1f} ", X(t), Y(b));
      return fmt::format(
          "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.2\" points=\"{}\"/>\n", colour,
          d);
    };
    std::vector<std::pair<double, double>> before, after;
    for (std::size_t k = 0; k < slots.size(); ++k) {
      before.emplace_back(slots[k].start, sum(slots[k].memory));
      before.emplace_back(slots[k].start + slots[k].duration, sum(slots[k].memory));
      if (s.schedule) {
        const double st = s.schedule->start[k];
        after.emplace_back(st, sum(s.schedule->memory[k]));
        after.emplace_back(st + slots[k].duration, sum(s.schedule->memory[k]));
      }
    }
    o += line(before, "#888");
    if (s.schedule) o += line(after, "#1f6fd0");
    o += fmt::format(
        "<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#d03030\" "
        "stroke-dasharray=\"6,4\"/>\n",
        L, W - R, Y(r.budget), Y(r.budget));
    // Transfers in a band under the plot: h2d on top, d2h below.
    if (s.schedule)
      for (const auto& x : s.schedule->transfers) {
        const double yy = plot_bottom + (x.to_device ? 3 : 10);
        const char* colour = x.exposed > 0 ? "#d03030" : x.to_device ? "#2a9d4a" : "#e08a1e";
        o += fmt::format(
            "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"5\" fill=\"{}\"/>\n",
            X(x.start), yy, std::max(0.5, X(x.end) - X(x.start)), colour);
      }
    // The time axis under the transfer band; the end label is the step itself.
    const double ay = plot_bottom + 20;
    o += "<g class=\"time-axis\">\n";
    o += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#333\"/>\n", L,
                     W - R, ay, ay);
    double last = -1e9;
    for (double t = 0; t <= tmax * (1 + 1e-9); t += tstep) {
      o += fmt::format(
          "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#333\"/>\n",
          X(t), ay, ay + 4);
      if (X(t) - last < 60 || X(tmax) - X(t) < 50) continue;
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", X(t),
                       ay + 16, format_tick_seconds(t, tstep));
      last = X(t);
    }
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", X(tmax),
                     ay + 16, format_seconds(tmax));
    o += "</g>\n</g>\n";
  }
  o += "</svg>\n";
  return o;
}

}  // namespace hp::offload
