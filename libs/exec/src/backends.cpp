// open_backends: discover the plugins, pick the primary backend and the cpu reference.
#include "hp/exec/backends.h"

#include <fmt/core.h>

#include <cstdlib>
#include <mutex>

#include "hp/plugin/registry.h"

namespace hp::exec {

Expected<Backends> open_backends(const std::string& name, int threads,
                                 const std::vector<std::filesystem::path>& plugin_paths,
                                 const std::vector<std::string>& open_options) {
  if (threads < 0) return Error(Errc::usage, "--threads must be at least 1");
  // OpenMP's idle workers wait between parallel regions (every op is one). libgomp's default spins
  // about 3 ms before sleeping, which steals the cores from each other (and from MPI ranks) when
  // they are shared: 3x slower 2-thread runs measured on a busy machine. Fully passive waiting
  // costs a futex wake per region instead: the small CNN of tests/bench/executor took 6-9 ms at 2
  // threads against 3.9 ms with a short spin, idle or busy. So workers spin about 0.1 ms (10,000
  // iterations) and then sleep. Set before the plugin loads libgomp; a user's OMP_WAIT_POLICY or
  // GOMP_SPINCOUNT wins. Once per process, and every caller after it is done: the ranks of a
  // simulated run call this on their threads, and one's setenv must not run while another's
  // dlopen starts libgomp, which reads the environment.
  static std::once_flag wait_policy;
  std::call_once(wait_policy, [] {
    if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT"))
      ::setenv("GOMP_SPINCOUNT", "10000", 0);
  });
  plugin::SearchOptions so;
  so.plugin_paths = plugin_paths;
  if (threads > 0) so.open_options.push_back(fmt::format("threads={}", threads));
  so.open_options.insert(so.open_options.end(), open_options.begin(), open_options.end());
  // A named backend loads only itself and cpu (the reference); auto-selection probes every plugin,
  // each in a child process first, so a broken one is skipped instead of ending the run.
  if (name.empty())
    so.isolate = true;
  else
    so.only = {"cpu", name};
  HP_ASSIGN_OR_RETURN(auto reg, plugin::discover(so));
  Backends b;
  b.cpu = reg.find("cpu");
  if (!b.cpu)
    return Error(Errc::unavailable, "the cpu backend plugin was not found or did not load", "",
                 "'hp devices -v' shows where hp looked");
  if (name.empty()) {
    auto loaded = reg.loaded();
    b.primary = loaded.empty() ? b.cpu : loaded.front();
    return b;
  }
  b.primary = reg.find(name);
  if (!b.primary) {
    const plugin::PluginRecord* rec = reg.record(name);
    return Error(Errc::unavailable,
                 rec ? fmt::format("backend '{}' is unavailable: {}", name, rec->reason)
                     : fmt::format("backend '{}' was not found", name),
                 "", "'hp devices' lists the backends found and why any was rejected");
  }
  return b;
}

}  // namespace hp::exec
