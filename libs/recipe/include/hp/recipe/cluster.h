// The cluster description: what devices a machine (or a fleet of identical nodes) has, and the
// topology tiers ranks talk over. Presets live in recipes/clusters/*.toml; every key is documented
// in cluster_keys() (schema_doc.h), the source of the cluster part of hp-recipe(5). The shape:
//
//   [cluster]           version = 1, name, description, nodes = 1, rank_device (the device type
//                       whose devices are ranks; optional with a single device type)
//   [[device_types]]    name, kind = cpu|gpu|npu, per_node, memory ("80 GiB"), memory_bandwidth,
//                       h2d_bandwidth, d2h_bandwidth ("450 GB/s"),
//                       peak_flops = { fp32, tf32, bf16, fp16, fp8, int8 }   (FLOP/s, dense; 0 =
//                       none)
//   [[tiers]]           innermost first: name (die, node, rack, supernode, scale-out, ...),
//                       size (ranks per unit; left out on the outermost tier = every rank),
//                       bandwidth (per rank, one direction), latency ("2us")
//
// Ranks are placed contiguously (rank r is on node r / per_node); tier sizes must nest.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "hp/core/dtype.h"
#include "hp/core/error.h"
#include "hp/core/expected.h"
#include "hp/recipe/source_map.h"

namespace hp::recipe {

/// The newest cluster file version this hp reads and writes.
inline constexpr int kClusterVersion = 1;

enum class DeviceKind { cpu, gpu, npu };
const char* device_kind_name(DeviceKind k);

/// Peak dense throughput per data type in FLOP/s (OP/s for int8); 0 means unsupported or unknown.
struct PeakFlops {
  double fp32 = 0, tf32 = 0, bf16 = 0, fp16 = 0, fp8 = 0, int8 = 0;
  /// The peak for a data type; 0 for one without a field here (f64, i32, ...).
  double of(DType dtype) const;
  /// The same by name or alias (parse_dtype: "bf16", "fp32", "float32", ...); 0 for an unknown
  /// name.
  double of(std::string_view dtype) const;
  friend bool operator==(const PeakFlops&, const PeakFlops&) = default;
};

/// One kind of device found in every node. Bandwidths are bytes/s, memory is bytes.
struct DeviceType {
  std::string name;
  DeviceKind kind = DeviceKind::cpu;
  std::int64_t per_node = 1;  ///< devices of this type in one node
  PeakFlops peak_flops;
  /// Measured dense GEMM throughput per data type (`hp devices --measure`); where nonzero for the
  /// planned dtype, hp plan prices matrix products at it instead of peak x its calibrated
  /// efficiency (docs/planner.md, "Calibration"). 0 = not measured.
  PeakFlops sustained_flops;
  double memory = 0;            ///< device memory, bytes
  double memory_bandwidth = 0;  ///< device memory bandwidth, bytes/s
  double h2d_bandwidth = 0;     ///< host -> device, bytes/s, one direction
  double d2h_bandwidth = 0;     ///< device -> host, bytes/s, one direction
  friend bool operator==(const DeviceType&, const DeviceType&) = default;
};

/// One level of the network, innermost (die, node) to outermost (scale-out). `size` ranks share
/// one unit of the tier; 0 means "every rank of the cluster" (allowed for the outermost tier only).
/// `bandwidth` is per rank and unidirectional (bytes/s) when every rank of a unit sends across
/// the tier at once; `latency` is the one-message latency in seconds.
struct Tier {
  std::string name;
  std::int64_t size = 0;
  double bandwidth = 0;
  double latency = 0;
  friend bool operator==(const Tier&, const Tier&) = default;
};

struct Cluster {
  int version = kClusterVersion;
  std::string name;
  std::string description;
  std::int64_t nodes = 1;   ///< identical nodes described
  std::string rank_device;  ///< the device type whose devices are ranks (one rank each)
  std::vector<DeviceType> device_types;
  std::vector<Tier> tiers;  ///< innermost first

  /// The device type named by rank_device, or nullptr.
  const DeviceType* rank_device_type() const;
  std::int64_t ranks_per_node() const;
  /// nodes * ranks_per_node().
  std::int64_t ranks() const;
  friend bool operator==(const Cluster&, const Cluster&) = default;
};

/// A parsed cluster file, with the locations of its keys and every problem found. `problems` is
/// empty when the file is valid.
struct ClusterDocument {
  Cluster cluster;
  SourceMap where;
  std::vector<Diagnostic> problems;
};

/// Parses and validates cluster TOML text. `display_path` prefixes every location.
ClusterDocument parse_cluster(std::string_view text, const std::string& display_path);

/// Reads, parses and validates a cluster file; every problem is in the returned Error (bad_input).
Expected<Cluster> load_cluster(const std::filesystem::path& path);

/// Semantic checks on a cluster struct (also run by parse_cluster); locations come from `where`.
std::vector<Diagnostic> validate_cluster(const Cluster& c, const SourceMap& where);

/// Deterministic TOML text for `c` (parse_cluster(format_cluster(c)) gives back `c`).
std::string format_cluster(const Cluster& c);
/// Writes format_cluster(c) atomically.
Status write_cluster(const Cluster& c, const std::filesystem::path& path);

/// The same cluster with `nodes` nodes (`hp plan --nodes N`). Fails when nodes < 1 or when no tier
/// spans that many ranks (the outermost tier is bounded and too small).
Expected<Cluster> scale_cluster(const Cluster& c, std::int64_t nodes);

}  // namespace hp::recipe
