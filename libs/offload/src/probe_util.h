// Helpers shared by the backend probes (measure.cpp, local_cluster.cpp).
#pragma once

#include <time.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "hp/core/expected.h"
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

/// The backend `name` alone (a broken plugin it does not measure cannot end the run), opened with
/// "threads=N" when `threads` > 0, `paths` searched first; Errc::unavailable when it is not there.
inline Expected<std::shared_ptr<plugin::Backend>> open_probe_backend(
    const std::string& name, int threads, const std::vector<std::filesystem::path>& paths) {
  plugin::SearchOptions search;
  search.only = {name};
  search.plugin_paths = paths;
  if (threads > 0) search.open_options.push_back(fmt::format("threads={}", threads));
  HP_ASSIGN_OR_RETURN(auto reg, plugin::discover(search));
  auto backend = reg.find(name);
  if (!backend)
    return Error(Errc::unavailable,
                 fmt::format("backend '{}' is not available for --measure", name), "",
                 "run 'hp devices -v' to see which plugins were found");
  return backend;
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
