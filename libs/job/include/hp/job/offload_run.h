// Offload at run time (docs/offload.md, "Offload at run time"): a rank's executor keeps part of its
// tensors in the host pool and copies them onto the device just before use, so that its device
// memory stays under a budget.
//
// The recipe's [offload] section (written by `hp offload-profile -o`) says whether offload is on,
// which state kinds may move (targets), how far ahead a copy is issued (prefetch_lookahead) and the
// device budget the schedule was planned for (device_budget). offload-profile plans a training step
// of planner units; the executor runs ONNX nodes, so it replans the same policy (Belady eviction,
// prefetch with lookahead; hp/offload/node_schedule.h) over its own nodes and tensor sizes at the
// first run (when the input shapes are known) and replays it on every run:
//   - weights ("parameters") stay in host memory and are copied in before the nodes that read them,
//     then dropped after their last reader;
//   - activations ("activations") may be written back to the host when the budget needs their room,
//     and copied in again before their next reader.
// Copies go through the backend's copy_async on the executor's stream and are synchronised before
// the node that needs them: the cpu backend executes synchronously, so on it a prefetch is issued
// early but not overlapped; a backend with a separate copy stream could overlap it (not done yet).
//
// The cpu backend enforces the budget ("device_budget=BYTES" open option): its device memory is
// then an arena of that size, and an allocation past it fails with an error naming the tensor and
// the budget. That is what makes the schedule really exercised on a machine without an accelerator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/offload.h"
#include "hp/recipe/recipe.h"

namespace hp::job {

/// What a rank passes to the backends and the executor for the recipe's [offload] section.
struct OffloadRun {
  exec::OffloadConfig exec;               ///< for exec::ExecOptions::offload
  std::vector<std::string> open_options;  ///< append to plugin::SearchOptions::open_options
  std::vector<std::string> notes;         ///< targets with no run-time effect (optimizer, ...)
};

/// The offload settings of pipeline stage `stage` of `r` on backend `backend` ("" = the default).
/// Without an enabled [offload] section: exec.enabled is false and there are no open options. On
/// the cpu backend the budget is enforced (open option "device_budget=BYTES"; also for backend "",
/// whose default is the cpu backend on a machine without accelerators; where one is found, its cpu
/// fallback is then held to the budget as well). A stage outside [0, parallel.pp) is Errc::usage;
/// device_budget missing on the cpu backend (whose "device" memory is the whole host) is
/// Errc::bad_input: there would be nothing to enforce.
Expected<OffloadRun> offload_run_for(const recipe::Recipe& r, std::int64_t stage,
                                     const std::string& backend);

}  // namespace hp::job
