// hp offload-profile: memory timelines, host-pool offload and prefetch schedules (issue #7).
#pragma once

#include <filesystem>
#include <string>

#include "hp/core/expected.h"

namespace hp::offload {

struct OffloadOptions {
  std::filesystem::path recipe;
  std::string hbm;        ///< device-memory budget override ("64GiB"); empty: the device's memory
  bool measure = false;   ///< run the backend's bandwidth probes
  bool json = false;
};

struct OffloadReport {
  std::string summary;
};

/// Not implemented yet: returns Errc::not_implemented.
Expected<OffloadReport> run(const OffloadOptions& options);

}  // namespace hp::offload
