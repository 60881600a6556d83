// Helpers shared by the backend probes (measure.cpp, local_cluster.cpp).
#pragma once

#include <time.h>

#include <algorithm>
#include <ctime>
#include <string>
#include <vector>

#include "hp/plugin/registry.h"

namespace hp::offload::detail {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// Today's date (UTC), YYYY-MM-DD: the provenance of a measured figure.
inline std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

/// Frees plugin memory on every path out.
struct PluginBuffer {
  const plugin::Backend* b = nullptr;
  void* p = nullptr;
  int kind = HP_MEM_DEVICE;
  PluginBuffer(const plugin::Backend* backend, void* ptr, int k) : b(backend), p(ptr), kind(k) {}
  PluginBuffer(const PluginBuffer&) = delete;
  PluginBuffer& operator=(const PluginBuffer&) = delete;
  ~PluginBuffer() {
    if (p) (void)b->free_mem(0, p, kind);
  }
};

}  // namespace hp::offload::detail
