// What the two checkpoint formats share (checkpoint.cpp, sharded_checkpoint.cpp): the guard on
// the directory a checkpoint replaces, the names of its siblings, and the swap into place.
#pragma once

#include <filesystem>

#include "hp/core/expected.h"

namespace hp::train::detail {

/// `.<name>.<what>` beside `dir`.
std::filesystem::path checkpoint_aside(const std::filesystem::path& dir, const char* what);
/// check_checkpoint_dir without inputs.
Status check_checkpoint_guard(const std::filesystem::path& dir, bool force);
/// The complete new checkpoint `tmp` replaces `dir`: the old one aside, the new one in, the old
/// one removed; on a failure `dir` keeps the old one and `tmp` is removed.
Status swap_checkpoint_into_place(const std::filesystem::path& tmp,
                                  const std::filesystem::path& dir);

}  // namespace hp::train::detail
