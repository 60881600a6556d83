// open_backends: discover the plugins, pick the primary backend and the cpu reference.
#include "hp/exec/backends.h"

#include <fmt/core.h>

#include <cstdlib>

#include "hp/plugin/registry.h"

namespace hp::exec {

Expected<Backends> open_backends(const std::string& name, int threads,
                                 const std::vector<std::filesystem::path>& plugin_paths,
                                 const std::vector<std::string>& open_options) {
  if (threads < 0) return Error(Errc::usage, "--threads must be at least 1");
  // OpenMP workers that spin between ops steal the cores from each other (and from MPI ranks) when
  // cores are shared: measured 3x slower 2-thread runs on a busy machine. Passive waiting costs
  // nothing measurable on an idle one. Set before the plugin loads libgomp; a user's value wins.
  ::setenv("OMP_WAIT_POLICY", "passive", 0);
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
