// Run-time offload in the executor: the settings a rank's executor follows to keep part of its
// tensors in the host pool under a device budget. What the settings mean and how a recipe's
// [offload] section turns into them is in hp/job/offload_run.h; how the executor replans the policy
// over its own nodes is in libs/exec/src/exec_offload.cpp.
#pragma once

#include <cstdint>

namespace hp::exec {

/// What the executor needs to offload (ExecOptions::offload).
struct OffloadConfig {
  bool enabled = false;
  double budget = 0;           ///< device bytes; 0 = the backend's device memory x (1 - margin)
  double margin = 0.1;         ///< used only when budget is 0
  std::int64_t lookahead = 1;  ///< nodes ahead a copy may be issued
  bool weights = true;         ///< "parameters": weights live in the host pool
  bool activations = false;    ///< "activations": may be written back and fetched again
};

}  // namespace hp::exec
