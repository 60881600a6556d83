// File helpers. Writes are atomic: a temp file in the destination directory, then rename(2), so a
// crash or error never leaves a half-written recipe or report behind.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "hp/core/expected.h"

namespace hp {

/// Reads a whole file; errors name the path and the OS reason.
Expected<std::string> read_file(const std::filesystem::path& path);

/// Writes `contents` to `path` atomically (temp file + fsync + rename).
Status write_file_atomic(const std::filesystem::path& path, std::string_view contents);

/// Directory holding the running executable (for install-relative lookups).
std::filesystem::path executable_dir();

}  // namespace hp
