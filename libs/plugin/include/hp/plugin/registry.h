// Plugin discovery: where hp looks for backends, what it found, and why it rejected what it
// rejected.
//
// Search order (first match of a backend name wins; later files with the same name are recorded as
// shadowed):
//   1. every --plugin-path entry (a directory, or a plugin file given directly)
//   2. $HP_PLUGIN_PATH, a colon-separated list of directories
//   3. the install dir, <exe_dir>/../lib/hp/plugins
//   4. the build tree's plugin dir (compile definition HP_BUILD_PLUGIN_DIR)
// In a directory, files named libhp-backend-<name>.so are candidates. Each is dlopen'ed with
// RTLD_NOW|RTLD_LOCAL (missing symbols fail at load, not later), its entry symbol is looked up, the
// ABI major checked, the table's mandatory members checked, then the plugin is opened and its
// devices enumerated. Libraries are never dlclose'd: a backend may own threads (oneDNN, cudart)
// that would run unmapped code after an unload.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/plugin/backend.h"

namespace hp::plugin {

/// Where to search and how to open. Defaults give hp's documented search order.
struct SearchOptions {
  std::vector<std::filesystem::path> plugin_paths;  ///< --plugin-path entries (dirs or files)
  bool use_env = true;                              ///< read $HP_PLUGIN_PATH
  bool use_install_dir = true;                      ///< <exe_dir>/../lib/hp/plugins
  bool use_build_dir = true;                        ///< the build-tree dir baked in at compile time
  std::filesystem::path build_dir;  ///< overrides the compiled-in build-tree dir when not empty
  std::vector<std::string> open_options;  ///< "key=value" strings passed to every plugin's open
  /// Backend names to load from the search directories; empty = all of them. A run that names its
  /// backend loads only that one (and cpu, the reference), so a broken plugin it does not use
  /// cannot take it down. Files named with --plugin-path FILE are always tried.
  std::vector<std::string> only;
  /// Try each candidate in a forked child first and load it here only when the child survived:
  /// `hp devices` and auto-selection probe every plugin, and one that crashes while loading is
  /// reported (Verdict::crashed) instead of killing hp.
  bool isolate = false;
};

/// Why a candidate file did not become a usable backend.
enum class Verdict {
  loaded,        ///< opened, with at least one device
  not_library,   ///< dlopen failed: not a shared library, wrong architecture, missing symbols
  not_backend,   ///< no hp_backend_entry_v1 symbol
  abi_mismatch,  ///< the table's major differs from the host's, or the entry returned NULL
  bad_table,     ///< a mandatory member is missing or the table is too small
  unavailable,   ///< vendor runtime / driver / device missing (dlopen dependency or open)
  open_failed,   ///< open failed for another reason
  no_devices,    ///< opened but reports zero devices
  crashed,       ///< the process trying it died (SIGSEGV, abort, exit) while loading or opening
};

const char* verdict_name(Verdict v);  ///< "loaded", "not a shared library", ...

/// One file that was examined.
struct PluginRecord {
  std::filesystem::path path;
  std::string origin;  ///< "--plugin-path", "HP_PLUGIN_PATH", "install dir", "build tree"
  bool named = false;  ///< the file itself was given (--plugin-path FILE), not found in a directory
  std::string name;    ///< from the file name (libhp-backend-<name>.so), then the table
  std::string version;
  int abi_major = 0, abi_minor = 0;
  int probe_score = -1;  ///< hp_backend_probe's result, -1 when the plugin has none
  Verdict verdict = Verdict::not_library;
  std::string reason;    ///< why it was rejected (empty when loaded)
  hp_code code = HP_OK;  ///< the plugin's status code when open or a device query failed
  std::vector<DeviceInfo> devices;
  std::shared_ptr<Backend> backend;  ///< set when loaded
  bool ok() const { return verdict == Verdict::loaded; }
};

/// The outcome of discovery.
struct Registry {
  std::vector<PluginRecord> plugins;  ///< in search order, loaded and rejected alike
  std::vector<std::string> trace;     ///< every path tried and what happened (for -v)

  /// Loaded backends, best probe score first, cpu last (the fallback).
  std::vector<std::shared_ptr<Backend>> loaded() const;
  /// The loaded backend of that name, or nullptr.
  std::shared_ptr<Backend> find(const std::string& name) const;
  /// The record of that name (loaded or not), or nullptr.
  const PluginRecord* record(const std::string& name) const;
};

/// The directories searched, in order, with their origin label ("--plugin-path", ...).
std::vector<std::pair<std::filesystem::path, std::string>> search_dirs(const SearchOptions& opts);

/// Runs discovery. Fails only on a bad request (a --plugin-path entry that does not exist);
/// rejected plugins are data in the Registry.
Expected<Registry> discover(const SearchOptions& opts);

/// Examines one file (the per-candidate step of discover), appending to `trace`.
PluginRecord load_plugin(const std::filesystem::path& file, const std::string& origin,
                         const std::vector<std::string>& open_options,
                         std::vector<std::string>& trace);

/// True when a dlopen error names a missing dependency of `file` rather than `file` itself: the
/// plugin links a vendor library that is not installed, which is "unavailable", not a broken
/// plugin.
bool is_missing_dependency(const std::string& dlerror_text, const std::string& file);

}  // namespace hp::plugin
