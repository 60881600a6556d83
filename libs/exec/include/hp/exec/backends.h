// Opening the backend plugins a run uses: the primary one (by name, or the best available) and the
// cpu backend, which is always loaded as the reference and the fallback for unsupported ops.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/plugin/backend.h"

namespace hp::exec {

/// The backends a run uses, opened with "threads=N" when threads > 0.
struct Backends {
  std::shared_ptr<plugin::Backend> primary, cpu;
};
/// `open_options` are appended to every plugin's open options (e.g. "device_budget=BYTES" from the
/// recipe's [offload] section, offload_run.h).
Expected<Backends> open_backends(const std::string& name, int threads,
                                 const std::vector<std::filesystem::path>& plugin_paths,
                                 const std::vector<std::string>& open_options = {});

}  // namespace hp::exec
