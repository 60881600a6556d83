// Reading a cluster file. A cluster names its device types (peak FLOP/s per dtype, memory, memory
// and host-link bandwidth, how many per node), which of them are ranks, and the network tiers from
// the innermost (die, node) to the outermost (scale-out). The planner and libs/topology only ever
// see the struct; this file turns TOML into it and records where every key was, and
// cluster_validate.cpp checks the numbers against each other.
//
// Sizes, bandwidths and latencies may be written as plain numbers (bytes, bytes/s, seconds) or as
// strings with units ("80 GiB", "450 GB/s", "2us"); presets use the strings because a reviewer can
// then compare them against a datasheet at a glance. The writer emits plain numbers.
#include <fmt/core.h>

#include "hp/core/fs.h"
#include "hp/recipe/cluster.h"
#include "toml_reader.h"

namespace hp::recipe {
namespace {

using detail::TomlReader;

std::optional<DeviceKind> parse_kind(std::string_view s) {
  if (s == "cpu") return DeviceKind::cpu;
  if (s == "gpu") return DeviceKind::gpu;
  if (s == "npu") return DeviceKind::npu;
  return std::nullopt;
}

void read_peak(TomlReader& rd, const toml::table& t, const std::string& path, PeakFlops& p) {
  rd.check_keys(t, path, {"fp32", "tf32", "bf16", "fp16", "fp8", "int8"});
  auto get = [&](std::string_view key, double& out) {
    if (auto v = rd.get_number(t, key, path, false)) out = *v;
  };
  get("fp32", p.fp32), get("tf32", p.tf32), get("bf16", p.bf16);
  get("fp16", p.fp16), get("fp8", p.fp8), get("int8", p.int8);
}

void read_device(TomlReader& rd, const toml::table& t, const std::string& path, DeviceType& d) {
  rd.check_keys(t, path,
                {"name", "kind", "per_node", "peak_flops", "sustained_flops", "memory",
                 "memory_bandwidth", "h2d_bandwidth", "d2h_bandwidth"});
  if (auto v = rd.get_string(t, "name", path, true)) d.name = *v;
  if (auto v = rd.get_string(t, "kind", path, true)) {
    if (auto k = parse_kind(*v)) {
      d.kind = *k;
    } else {
      rd.error(rd.loc(t.get("kind")->source()),
               fmt::format("'{}.kind' must be cpu, gpu or npu, got '{}'", path, *v),
               detail::did_you_mean(*v, {"cpu", "gpu", "npu"}));
    }
  }
  if (auto v = rd.get_int(t, "per_node", path, true)) d.per_node = *v;
  if (auto p = rd.get_table(t, "peak_flops", path, true))
    read_peak(rd, *p, TomlReader::join(path, "peak_flops"), d.peak_flops);
  if (auto p = rd.get_table(t, "sustained_flops", path, false))
    read_peak(rd, *p, TomlReader::join(path, "sustained_flops"), d.sustained_flops);
  if (auto v = rd.get_bytes(t, "memory", path, true)) d.memory = *v;
  if (auto v = rd.get_rate(t, "memory_bandwidth", path, true)) d.memory_bandwidth = *v;
  if (auto v = rd.get_rate(t, "h2d_bandwidth", path, true)) d.h2d_bandwidth = *v;
  if (auto v = rd.get_rate(t, "d2h_bandwidth", path, true)) d.d2h_bandwidth = *v;
}

void read_tier(TomlReader& rd, const toml::table& t, const std::string& path, Tier& tier) {
  rd.check_keys(t, path, {"name", "size", "bandwidth", "latency"});
  if (auto v = rd.get_string(t, "name", path, true)) tier.name = *v;
  if (auto v = rd.get_int(t, "size", path, false)) tier.size = *v;
  if (auto v = rd.get_rate(t, "bandwidth", path, true)) tier.bandwidth = *v;
  if (auto v = rd.get_seconds(t, "latency", path, true)) tier.latency = *v;
}

// Reads [[key]] as an array of tables, calling `each(table, path, index)`.
template <class F>
void read_table_array(TomlReader& rd, const toml::table& root, std::string_view key, bool required,
                      F each) {
  const toml::array* a = rd.get_array(root, key, "", required);
  if (!a) return;
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::string path = fmt::format("{}[{}]", key, i);
    const toml::node& n = *a->get(i);
    if (auto t = n.as_table()) {
      each(*t, path, i);
    } else {
      rd.error(rd.loc(n.source()),
               fmt::format("'{}' must be a table, got {}", path, detail::type_phrase(n.type())),
               fmt::format("write each entry as a [[{}]] section", key));
    }
  }
}

}  // namespace

ClusterDocument parse_cluster(std::string_view text, const std::string& display_path) {
  ClusterDocument doc{Cluster{}, SourceMap(display_path), {}};
  auto root = detail::parse_toml(text, display_path, doc.problems);
  if (!root) return doc;
  TomlReader rd(doc.where, doc.problems);
  Cluster& c = doc.cluster;

  rd.check_keys(*root, "", {"cluster", "device_types", "tiers"});
  const toml::table* head = rd.get_table(*root, "cluster", "", true);
  if (!head) return doc;
  // The version decides how to read everything else, so an unsupported one stops here.
  if (auto v = rd.get_int(*head, "version", "cluster", true)) {
    if (*v != kClusterVersion) {
      rd.error(doc.where.at("cluster.version"), fmt::format("unsupported cluster version {}", *v),
               fmt::format("this hp reads cluster version {}; use a newer hp or rewrite the file",
                           kClusterVersion));
      return doc;
    }
    c.version = static_cast<int>(*v);
  }
  rd.check_keys(*head, "cluster", {"version", "name", "description", "nodes", "rank_device"});
  if (auto v = rd.get_string(*head, "name", "cluster", true)) c.name = *v;
  if (auto v = rd.get_string(*head, "description", "cluster", false)) c.description = *v;
  if (auto v = rd.get_int(*head, "nodes", "cluster", false)) c.nodes = *v;
  auto rank_device = rd.get_string(*head, "rank_device", "cluster", false);

  read_table_array(rd, *root, "device_types", true,
                   [&](const toml::table& t, const std::string& path, std::size_t) {
                     c.device_types.emplace_back();
                     read_device(rd, t, path, c.device_types.back());
                   });
  read_table_array(rd, *root, "tiers", true,
                   [&](const toml::table& t, const std::string& path, std::size_t) {
                     c.tiers.emplace_back();
                     read_tier(rd, t, path, c.tiers.back());
                   });
  // rank_device may be left out when there is exactly one device type.
  if (rank_device) {
    c.rank_device = *rank_device;
  } else if (c.device_types.size() == 1) {
    c.rank_device = c.device_types.front().name;
  } else if (c.device_types.size() > 1) {
    rd.error(doc.where.at("cluster"), "missing required key 'cluster.rank_device'",
             "with several device types, say which one runs the ranks");
  }
  detail::append_new(doc.problems, validate_cluster(c, doc.where));
  detail::sort_by_location(doc.problems);
  return doc;
}

Expected<Cluster> load_cluster(const std::filesystem::path& path) {
  HP_ASSIGN_OR_RETURN(auto text, read_file(path));
  ClusterDocument doc = parse_cluster(text, path.string());
  if (!doc.problems.empty()) return collect_errors(Errc::bad_input, std::move(doc.problems));
  return std::move(doc.cluster);
}

}  // namespace hp::recipe
