// File helpers. Writes are atomic: a temp file in the destination directory, then rename(2), so a
// crash or error never leaves a half-written recipe or report behind.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "hp/core/expected.h"

namespace hp {

/// Reads a whole file; errors name the path and the OS reason.
Expected<std::string> read_file(const std::filesystem::path& path);

/// Writes `contents` to `path` atomically (temp file + fsync + rename).
Status write_file_atomic(const std::filesystem::path& path, std::string_view contents);

/// The marker file hp writes into every output directory it creates (docs/hardening.md, "Output
/// directories and signals"): its first line is `hp-output <version>`, then `writer <command>` and
/// one `file <name>` line per entry hp wrote beside it.
inline constexpr const char* kOutputMarker = ".hp-output";
inline constexpr int kOutputMarkerVersion = 1;

/// What replace_output_dir may replace and what it must never touch.
struct OutputDirOptions {
  std::string writer;                          ///< recorded in the marker: "hp launch", "hp shard"
  std::vector<std::filesystem::path> inputs;   ///< never replaced, contained or written into
  std::vector<std::filesystem::path> protect;  ///< never replaced or contained (a run directory)
  /// Names (fnmatch patterns) of what an older hp wrote without a marker: a marker-less directory
  /// whose every entry matches one is recognised as hp's own.
  std::vector<std::string> legacy;
  bool force = false;  ///< replace a directory that is not hp's (never an input or the cwd)
};

/// Whether `target` may be replaced: it is absent, an empty directory, or hp's own output (a valid
/// marker listing every entry; or every entry matches `legacy`), and it neither is, contains nor
/// lies inside an input, nor is or contains a `protect` path or the working directory.
/// Errc::bad_input naming the first foreign entry (or the input) otherwise; `force` lifts only the
/// foreign-content rule.
Status check_output_dir(const std::filesystem::path& target, const OutputDirOptions& o);

/// Replaces the directory `target` safely: checks it (check_output_dir), removes stale temporaries
/// of dead processes beside it, lets `fill` write the new content into a fresh temporary sibling
/// `.<name>.hp-tmp-<pid>` (registered for removal on SIGINT/SIGTERM), writes the marker there,
/// then renames the old directory aside, the new one into place, and only then removes the old.
/// A failure before the swap leaves `target` untouched.
Status replace_output_dir(const std::filesystem::path& target,
                          const std::function<Status(const std::filesystem::path& tmp)>& fill,
                          const OutputDirOptions& o);

/// Writes `dir`/.hp-output listing every entry of `dir` (what hp just wrote there).
Status write_output_marker(const std::filesystem::path& dir, const std::string& writer);

/// Removes `.<name>.hp-tmp-<pid>` and `.<name>.hp-old-<pid>` entries of `parent` whose process is
/// gone (kill(pid, 0) fails with ESRCH); an `hp-old` copy whose target is missing is renamed back
/// instead (a crash between the two renames of a swap). Returns how many were removed or restored.
int remove_stale_temporaries(const std::filesystem::path& parent);

/// Whether the process `pid` is gone (kill(pid, 0) fails with ESRCH).
bool process_gone(long pid);

/// Directory holding the running executable (for install-relative lookups).
std::filesystem::path executable_dir();

}  // namespace hp
