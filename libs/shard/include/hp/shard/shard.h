// hp shard: HyperShard layouts, redistribution plans and per-rank partitions (issue #5).
#pragma once

#include <filesystem>
#include <string>

#include "hp/core/expected.h"

namespace hp::shard {

struct ShardOptions {
  std::filesystem::path recipe;   ///< recipe to partition
  std::filesystem::path out_dir;  ///< where the per-rank ONNX files and manifest go
};

struct ShardReport {
  std::string summary;
};

/// Partitions the recipe's model into per-rank programs. Not implemented yet: returns
/// Errc::not_implemented so scripts can tell "missing feature" from "bad input".
Expected<ShardReport> run(const ShardOptions& options);

}  // namespace hp::shard
