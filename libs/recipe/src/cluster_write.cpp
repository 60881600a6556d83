// Writing clusters back out, the small accessors of the Cluster struct, and scaling a preset to N
// nodes. Scaling only changes `nodes`: presets describe one node (or one supernode) plus the tiers
// above it, so N nodes are the same node repeated, joined by the outer tiers.
#include <fmt/core.h>

#include "hp/core/fs.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/toml_writer.h"

namespace hp::recipe {

const char* device_kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::gpu: return "gpu";
    case DeviceKind::npu: return "npu";
  }
  return "cpu";
}

double PeakFlops::of(DType dtype) const {
  switch (dtype) {
    case DType::f32: return fp32;
    case DType::tf32: return tf32;
    case DType::bf16: return bf16;
    case DType::f16: return fp16;
    case DType::f8: return fp8;
    case DType::i8: return int8;
    default: return 0;
  }
}

double PeakFlops::of(std::string_view dtype) const {
  auto t = parse_dtype(dtype);
  return t ? of(*t) : 0;
}

const DeviceType* Cluster::rank_device_type() const {
  for (const auto& d : device_types)
    if (d.name == rank_device) return &d;
  return nullptr;
}

std::int64_t Cluster::ranks_per_node() const {
  const DeviceType* d = rank_device_type();
  return d ? d->per_node : 0;
}

std::int64_t Cluster::ranks() const { return nodes * ranks_per_node(); }

namespace {

/// `{ fp32 = ..., tf32 = ..., ... }`: every dtype, so the written file says what is unsupported.
std::string flops_table(const PeakFlops& f) {
  return toml_inline_table({{"fp32", toml_float(f.fp32)},
                            {"tf32", toml_float(f.tf32)},
                            {"bf16", toml_float(f.bf16)},
                            {"fp16", toml_float(f.fp16)},
                            {"fp8", toml_float(f.fp8)},
                            {"int8", toml_float(f.int8)}});
}

}  // namespace

std::string format_cluster(const Cluster& c) {
  TomlWriter w;
  w.comment("hp cluster description (see hp-recipe(5)); bandwidths in bytes/s, latencies in s");
  w.table("cluster").integer("version", c.version).string("name", c.name);
  if (!c.description.empty()) w.string("description", c.description);
  w.integer("nodes", c.nodes).string("rank_device", c.rank_device);
  for (const auto& d : c.device_types) {
    w.array_table("device_types")
        .string("name", d.name)
        .string("kind", device_kind_name(d.kind))
        .integer("per_node", d.per_node)
        .number("memory", d.memory)
        .number("memory_bandwidth", d.memory_bandwidth)
        .number("h2d_bandwidth", d.h2d_bandwidth)
        .number("d2h_bandwidth", d.d2h_bandwidth);
    w.value("peak_flops", flops_table(d.peak_flops));
    if (d.sustained_flops != PeakFlops{})
      w.value("sustained_flops", flops_table(d.sustained_flops));
  }
  for (const auto& t : c.tiers) {
    w.array_table("tiers").string("name", t.name);
    if (t.size > 0) w.integer("size", t.size);
    w.number("bandwidth", t.bandwidth).number("latency", t.latency);
  }
  return std::move(w).str();
}

Status write_cluster(const Cluster& c, const std::filesystem::path& path) {
  return write_file_atomic(path, format_cluster(c));
}

Expected<Cluster> scale_cluster(const Cluster& c, std::int64_t nodes) {
  constexpr std::int64_t kMaxNodes = std::int64_t{1} << 20;
  if (nodes < 1 || nodes > kMaxNodes)
    return Error(Errc::bad_input, fmt::format("node count must be 1..{}, got {}", kMaxNodes, nodes),
                 "", "pass --nodes N with N >= 1");
  Cluster out = c;
  out.nodes = nodes;
  if (!out.tiers.empty() && out.tiers.back().size > 0 && out.tiers.back().size < out.ranks()) {
    std::int64_t max_nodes =
        out.ranks_per_node() > 0 ? out.tiers.back().size / out.ranks_per_node() : 0;
    return Error(
        Errc::bad_input,
        fmt::format("cluster '{}' spans at most {} nodes (tier '{}' has {} ranks), {} requested",
                    c.name, max_nodes, out.tiers.back().name, out.tiers.back().size, nodes),
        "",
        "use fewer nodes, or add an outermost scale-out tier without 'size' to the cluster file");
  }
  return out;
}

}  // namespace hp::recipe
