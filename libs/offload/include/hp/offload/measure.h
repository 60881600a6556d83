// Bandwidth probes (`--measure`): copies of several sizes through the backend plugin's own alloc
// and copy_async (device <-> pinned host), the median of repeats per size, and a plain memcpy
// between the same two buffers measured in the same run, interleaved with the plugin's copies (in
// alternating order) so both see the same pages, caches and machine load. For the CPU plugin device
// and host memory are the same DRAM, so its figures should match memcpy; a GPU plugin measures its
// host link.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "hp/core/expected.h"

namespace hp::offload {

struct ProbeSize {
  double bytes = 0;
  double h2d = 0, d2h = 0;  ///< plugin copies, median bytes/s
  double memcpy = 0;        ///< plain memcpy loop, median bytes/s
  /// Medians over repeats of (plugin bandwidth / memcpy bandwidth in the same repeat): the
  /// comparison, robust to a repeat slowed down as a whole.
  double h2d_vs_memcpy = 0, d2h_vs_memcpy = 0;
};

struct BandwidthReport {
  std::string backend, device, probe, date;  ///< probe: "<backend>-copy"; date: YYYY-MM-DD
  int repeats = 0;
  std::vector<ProbeSize> sizes;                 ///< ascending
  double h2d = 0, d2h = 0, memcpy = 0;          ///< at the largest size
  double h2d_vs_memcpy = 0, d2h_vs_memcpy = 0;  ///< at the largest size
  /// "measured:<probe> <date>", the provenance written into the recipe.
  std::string source() const { return "measured:" + probe + " " + date; }
};

struct MeasureOptions {
  std::string backend = "cpu";                      ///< plugin name
  std::vector<std::filesystem::path> plugin_paths;  ///< searched first (hp devices --plugin-path)
  std::vector<double> sizes = {4.0 * (1 << 20), 16.0 * (1 << 20), 64.0 * (1 << 20)};
  int repeats = 9;
  /// Called before each size's timed repeats. Probes run at once (local_cluster.h, one per rank of
  /// a shared CPU) wait there for each other, so that their timed copies overlap.
  std::function<void()> together;
};

/// Runs the probes. A backend that is not installed or cannot copy is Errc::unavailable.
Expected<BandwidthReport> measure_bandwidth(const MeasureOptions& opt);

}  // namespace hp::offload
