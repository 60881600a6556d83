// `hp devices`: what backends this machine has. The command file parses into DevicesOptions and calls
// list_devices(); the renderers turn the registry into text or one JSON object.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/plugin/registry.h"

namespace hp::plugin {

struct DevicesOptions {
  std::vector<std::filesystem::path> plugin_paths;  ///< --plugin-path (repeatable)
  bool json = false;     ///< --json
  bool verbose = false;  ///< global -v: include the paths tried
};

/// Discovers plugins along the documented search order plus opts.plugin_paths. Fails only on a bad
/// request (a --plugin-path that does not exist); rejections are data in the registry.
Expected<Registry> list_devices(const DevicesOptions& opts);

/// Errc::unavailable when no plugin loaded (the message lists every rejection), else success.
Status check_any_loaded(const Registry& reg);

/// Human-readable listing: plugins found, plugins rejected with reasons, devices and figures.
std::string render_devices_text(const Registry& reg, bool verbose);
/// One JSON object: {"plugins":[...], "rejected":[...], "trace":[...] (verbose only)}.
std::string render_devices_json(const Registry& reg, bool verbose);

}  // namespace hp::plugin
