// hp launch: runs a model or recipe on backend plugins, one rank or an MPMD job (issues #3, #6).
#pragma once

#include <filesystem>
#include <string>

#include "hp/core/expected.h"

namespace hp::runtime {

struct LaunchOptions {
  std::filesystem::path target;   ///< RECIPE.toml or MODEL.onnx
  std::filesystem::path inputs;   ///< input_K.pb directory
  std::filesystem::path outputs;  ///< where output_K.pb are written
  std::string backend;            ///< cpu|cuda|ascend; empty: best available
  int threads = 0;                ///< 0: the cores available
  bool dry_run = false;
  std::filesystem::path hostfile;
  double timeout_s = 0;
};

struct LaunchReport {
  std::string summary;
};

/// Not implemented yet: returns Errc::not_implemented.
Expected<LaunchReport> launch(const LaunchOptions& options);

}  // namespace hp::runtime
