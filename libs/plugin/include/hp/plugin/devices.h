// `hp devices`: what backends this machine has. The command file parses into DevicesOptions and
// calls list_devices(); the renderers turn the registry into text or one JSON object;
// check_named_plugins and check_any_loaded decide the exit status (0 when a plugin loads and every
// named file loaded).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/plugin/registry.h"

namespace hp::plugin {

struct DevicesOptions {
  std::vector<std::filesystem::path> plugin_paths;  ///< --plugin-path (repeatable)
  bool json = false;                                ///< --json
  bool verbose = false;                             ///< global -v: include the paths tried
};

/// Discovers plugins along the documented search order plus opts.plugin_paths. Fails only on a bad
/// request (a --plugin-path that does not exist); rejections are data in the registry.
Expected<Registry> list_devices(const DevicesOptions& opts);

/// Errc::unavailable when no plugin loaded (the message lists every rejection), else success.
Status check_any_loaded(const Registry& reg);

/// A plugin file named explicitly (--plugin-path FILE) that was rejected is an error, located at
/// the file: bad input (exit 3) when it is not a library, not an hp backend, has the wrong ABI or a
/// malformed table; unavailable (exit 7) when its runtime or devices are missing; runtime (exit 5)
/// when open failed otherwise. Plugins found by scanning directories are only listed.
Status check_named_plugins(const Registry& reg);

/// Human-readable listing: plugins found, plugins rejected with reasons, devices and figures.
std::string render_devices_text(const Registry& reg, bool verbose);
/// One JSON object: {"plugins":[...], "rejected":[...], "trace":[...] (verbose only)}.
std::string render_devices_json(const Registry& reg, bool verbose);

}  // namespace hp::plugin
