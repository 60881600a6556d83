// Semantic checks of a cluster: the numbers must describe a machine the topology model can use.
// The tier rules are what libs/topology relies on: tiers go from inner to outer, each unit of a
// tier is made of whole units of the tier inside it (sizes divide each other), nodes nest in the
// tiers the same way, and the outermost tier reaches every rank (or has no size, meaning "all of
// them").
#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/core.h>

#include "hp/recipe/cluster.h"

namespace hp::recipe {
namespace {

// Node and device counts are capped so that nodes * per_node cannot overflow.
constexpr std::int64_t kMaxCount = std::int64_t{1} << 20;
constexpr std::int64_t kMaxRanks = std::int64_t{1} << 40;

struct Checker {
  const SourceMap& where;
  std::vector<Diagnostic> out;
  void fail(std::string_view key, std::string message, std::string hint = {}) {
    out.push_back(Diagnostic{where.at(key), std::move(message), std::move(hint)});
  }
};

void check_device(Checker& ck, const DeviceType& d, std::size_t i) {
  std::string p = fmt::format("device_types[{}]", i);
  if (d.name.empty()) ck.fail(p + ".name", fmt::format("'{}.name' must not be empty", p));
  if (d.per_node < 1 || d.per_node > kMaxCount)
    ck.fail(p + ".per_node",
            fmt::format("'{}.per_node' must be 1..{}, got {}", p, kMaxCount, d.per_node));
  if (!(d.memory > 0) || !std::isfinite(d.memory))
    ck.fail(p + ".memory", fmt::format("'{}.memory' must be positive", p), "write e.g. \"80 GiB\"");
  for (auto [key, v] : {std::pair{"memory_bandwidth", d.memory_bandwidth},
                        {"h2d_bandwidth", d.h2d_bandwidth},
                        {"d2h_bandwidth", d.d2h_bandwidth}})
    if (!(v >= 0) || !std::isfinite(v))
      ck.fail(p + "." + key, fmt::format("'{}.{}' must be a finite, non-negative number", p, key));
  // Each per-dtype table: finite, non-negative values; the peak also needs one dtype.
  for (auto [key, f] : {std::pair<const char*, const PeakFlops*>{"peak_flops", &d.peak_flops},
                        {"sustained_flops", &d.sustained_flops}}) {
    const double all[] = {f->fp32, f->tf32, f->bf16, f->fp16, f->fp8, f->int8};
    if (std::any_of(std::begin(all), std::end(all),
                    [](double v) { return !(v >= 0) || !std::isfinite(v); }))
      ck.fail(p + "." + key, fmt::format("'{}.{}' values must be finite and not negative", p, key));
    else if (f == &d.peak_flops &&
             std::all_of(std::begin(all), std::end(all), [](double v) { return v == 0; }))
      ck.fail(p + ".peak_flops",
              fmt::format("device type '{}' has no peak FLOP/s for any dtype", d.name),
              "give at least fp32 (FLOP/s)");
  }
}

void check_tiers(Checker& ck, const Cluster& c) {
  std::set<std::string> names;
  std::int64_t rpn = c.ranks_per_node();
  for (std::size_t i = 0; i < c.tiers.size(); ++i) {
    const Tier& t = c.tiers[i];
    std::string p = fmt::format("tiers[{}]", i);
    if (t.name.empty()) ck.fail(p + ".name", fmt::format("'{}.name' must not be empty", p));
    if (!names.insert(t.name).second)
      ck.fail(p + ".name", fmt::format("tier '{}' appears twice", t.name));
    if (!(t.bandwidth > 0) || !std::isfinite(t.bandwidth))
      ck.fail(p + ".bandwidth", fmt::format("'{}.bandwidth' must be a finite, positive number", p));
    if (!(t.latency >= 0) || !std::isfinite(t.latency))
      ck.fail(p + ".latency", fmt::format("'{}.latency' must be a finite, non-negative number", p));
    bool last = i + 1 == c.tiers.size();
    if (t.size == 0 && !last) {
      ck.fail(p + ".size",
              fmt::format("tier '{}' has no size but is not the outermost tier", t.name),
              "only the last tier may leave 'size' out (it then spans every rank)");
      continue;
    }
    if (t.size < 0 || t.size > kMaxRanks) {
      ck.fail(p + ".size", fmt::format("'{}.size' must be 1..{}, got {}", p, kMaxRanks, t.size));
      continue;
    }
    if (t.size == 0) continue;
    if (i > 0 && c.tiers[i - 1].size > 0) {
      std::int64_t inner = c.tiers[i - 1].size;
      if (t.size <= inner || t.size % inner != 0)
        ck.fail(p + ".size",
                fmt::format("tier '{}' (size {}) must be a larger multiple of tier '{}' (size {})",
                            t.name, t.size, c.tiers[i - 1].name, inner),
                "tiers go from innermost to outermost and each unit holds whole units of the tier "
                "inside");
    }
    if (rpn > 0 && rpn <= kMaxCount && (t.size < rpn ? rpn % t.size != 0 : t.size % rpn != 0))
      ck.fail(p + ".size",
              fmt::format("tier '{}' (size {}) does not nest with nodes of {} ranks", t.name,
                          t.size, rpn),
              "a tier unit must hold whole nodes, or a node whole units of the tier");
  }
  bool counts_ok = c.nodes >= 1 && c.nodes <= kMaxCount && rpn >= 1 && rpn <= kMaxCount;
  if (counts_ok && !c.tiers.empty() && c.tiers.back().size > 0 && c.tiers.back().size < c.ranks())
    ck.fail(
        fmt::format("tiers[{}].size", c.tiers.size() - 1),
        fmt::format("the outermost tier '{}' spans {} ranks but the cluster has {} ({} nodes x {})",
                    c.tiers.back().name, c.tiers.back().size, c.ranks(), c.nodes, rpn),
        "add an outermost [[tiers]] entry without 'size' (e.g. scale-out), or use fewer nodes");
}

}  // namespace

std::vector<Diagnostic> validate_cluster(const Cluster& c, const SourceMap& where) {
  Checker ck{where, {}};
  if (c.name.empty()) ck.fail("cluster.name", "'cluster.name' must not be empty");
  if (c.nodes < 1 || c.nodes > kMaxCount)
    ck.fail("cluster.nodes",
            fmt::format("'cluster.nodes' must be 1..{}, got {}", kMaxCount, c.nodes));
  if (c.device_types.empty())
    ck.fail("device_types", "the cluster has no device types", "add a [[device_types]] section");
  std::set<std::string> names;
  for (std::size_t i = 0; i < c.device_types.size(); ++i) {
    check_device(ck, c.device_types[i], i);
    if (!names.insert(c.device_types[i].name).second)
      ck.fail(fmt::format("device_types[{}].name", i),
              fmt::format("device type '{}' appears twice", c.device_types[i].name));
  }
  if (c.rank_device.empty() && !c.device_types.empty())
    ck.fail("cluster.rank_device", "'cluster.rank_device' is empty",
            "name the device type whose devices are ranks");
  if (!c.rank_device.empty() && !c.rank_device_type()) {
    std::string list;
    for (const auto& d : c.device_types) list += (list.empty() ? "" : ", ") + d.name;
    ck.fail(
        "cluster.rank_device",
        fmt::format("'cluster.rank_device' names '{}', which is not a device type", c.rank_device),
        "device types: " + list);
  }
  if (c.tiers.empty())
    ck.fail("tiers", "the cluster has no topology tiers",
            "add [[tiers]] sections, innermost first");
  check_tiers(ck, c);
  return std::move(ck.out);
}

}  // namespace hp::recipe
