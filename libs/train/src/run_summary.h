// The closing lines of a training run (trainer.cpp, pipeline_run.cpp).
#pragma once

#include <string>
#include <vector>

#include "hp/exec/executor.h"
#include "hp/train/data_parallel.h"
#include "hp/train/trainer.h"

namespace hp::train::detail {

/// The median of the steps' `seconds` (0 without steps).
double median_step_seconds(const std::vector<StepMetrics>& steps);

/// "last step: ... s forward+backward (... s in <collectives>-parallel collectives), ... s gradient
/// reduction (<reduction> parallel, after the backward), ... s optimizer, ... s other; by op: ..."
/// with the eight op types that took most of the executor's time; `collectives` ("tensor",
/// "expert") and `reduction` ("data", "expert and data") empty where the run has none. Empty when
/// the executor timed no op.
std::string last_step_line(const StepMetrics& last, const exec::ExecStats& stats,
                           const std::string& collectives, const std::string& reduction);

/// "ZeRO-3: the <what> held in shards of ... MiB; gradients staged in ... of bucket buffers
/// (whole: ...)" for a sync holding parameters (DataParallelSync::hold_parameters).
std::string zero3_line(DataParallelSync& s, const std::string& what);

/// "ZeRO-3 per-step gathers: ... buckets gathered per step, kept to its end (... at most)" for a
/// run whose StepCache (step_cache.h) gathered `gathered` buckets over `steps` steps.
std::string per_step_line(std::size_t gathered, std::size_t steps, std::int64_t peak_bytes);

/// "expert layers: R of L dispatched by their routing ..., the rest by all-gathering the tokens",
/// and a line for the S of them that are summed loops (expert_accumulate.h) when there are any.
std::string expert_layers_line(int layers, int routed, int summed);

}  // namespace hp::train::detail
