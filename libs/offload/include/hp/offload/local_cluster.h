// `hp devices --measure`: this machine's figures measured through a backend plugin, and a cluster
// file built from them for hp plan and the plan's prediction beside a run (`--cluster-out`).
//
// The compute probe multiplies square float32 matrices through the plugin's gemm entry, opened
// with the thread count one rank will use, and keeps the median rate per size; the median over the
// sizes is the device type's `sustained_flops.fp32`, which hp plan then prices matrix products at
// instead of peak x its calibrated efficiency (docs/planner.md, "Calibration"). The bandwidth
// probes are measure.h's. On a CPU of several ranks the probes run in every rank's place at once
// (one thread each, opening its own plugin instance with the rank's threads, waiting for the others
// before each size): the ranks of a job share the memory bandwidth and the caches, and a figure
// measured alone would price a two-rank copy at twice what it gets. The slowest rank's figures go
// into the cluster, since a synchronous step waits for it. `alone` measures one rank by itself.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/offload/measure.h"
#include "hp/recipe/cluster.h"

namespace hp::offload {

struct GemmProbe {
  std::int64_t n = 0;  ///< n x n times n x n
  double flops = 0;    ///< median FLOP/s (2 per multiply-accumulate)
};

struct ComputeReport {
  std::string backend, device, date;
  int threads = 0;  ///< what the plugin was opened with (0 = its default)
  int repeats = 0;
  std::vector<GemmProbe> sizes;  ///< ascending
  double fp32 = 0;               ///< the median over the sizes
  double table_peak_fp32 = 0;    ///< the plugin's own peak for the threads used (0 = unknown)
};

struct ComputeOptions {
  std::string backend = "cpu";
  std::vector<std::filesystem::path> plugin_paths;  ///< searched first (hp devices --plugin-path)
  int threads = 0;  ///< plugin "threads=N"; 0 = the plugin's default
  std::vector<std::int64_t> sizes = {256, 512, 1024};
  int repeats = 5;
  /// Called before each size's timed repeats (MeasureOptions::together).
  std::function<void()> together;
};

/// Runs the GEMM probe. A backend that is not installed or has no f32 gemm is Errc::unavailable.
Expected<ComputeReport> measure_gemm(const ComputeOptions& opt);

struct LocalClusterOptions {
  std::string backend = "cpu";
  std::vector<std::filesystem::path> plugin_paths;  ///< searched first (hp devices --plugin-path)
  int ranks = 1;              ///< ranks on this machine (the cluster's per_node)
  int threads = 0;            ///< threads per rank; 0 = the device's cores / ranks (at least 1)
  bool alone = false;         ///< a CPU's ranks probed one alone, not all at once
  std::filesystem::path out;  ///< --cluster-out; empty = measure and report only
  bool json = false;
  ComputeOptions compute;  ///< sizes and repeats (backend and threads are set from the above)
  MeasureOptions copies;   ///< the bandwidth probe's sizes and repeats
};

struct LocalCluster {
  ComputeReport compute;
  BandwidthReport bandwidth;
  recipe::Cluster cluster;  ///< "local-measured": one node of `ranks` ranks
  int ranks = 1, threads = 1;
  int at_once = 1;      ///< ranks probed at the same time (the figures are the slowest one's)
  std::string written;  ///< the file written, if any
};

/// Measures, builds the cluster and, with `out`, writes it atomically (a temp file renamed).
Expected<LocalCluster> measure_local_cluster(const LocalClusterOptions& opt);

/// The report `hp devices --measure` prints: text, or one JSON object.
std::string render_local_cluster(const LocalCluster& c, bool json);

}  // namespace hp::offload
