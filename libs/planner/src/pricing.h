// Private to libs/planner: what `hp plan` (run) and planner::predict share, so that a configuration
// the search ranks and the same configuration priced on its own cost exactly the same: the workload
// and machine derived from the options, the six axis placements and the ranks of a pipeline stage
// under one of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/planner/cost.h"
#include "hp/topology/topology.h"

namespace hp::planner {

/// Bytes per element of the planned dtype ("fp32", "bf16", ...).
double dtype_bytes(const std::string& dtype);

/// The workload of `global_batch` sequences per step: gradient and optimizer-state bytes per
/// parameter follow the dtype and the optimizer.
Workload workload_for(bool train, const std::string& dtype, const std::string& optimizer,
                      std::int64_t global_batch);

/// Every placement of the three axes, innermost first, in the order the search visits them (so ties
/// between equivalent placements resolve alike everywhere).
inline constexpr Axis kAxisOrders[6][3] = {
    {Axis::tp, Axis::dp, Axis::pp}, {Axis::tp, Axis::pp, Axis::dp}, {Axis::dp, Axis::tp, Axis::pp},
    {Axis::pp, Axis::tp, Axis::dp}, {Axis::dp, Axis::pp, Axis::tp}, {Axis::pp, Axis::dp, Axis::tp}};

/// The global ranks of pipeline rank `pp_index` under c's placement, in stage-mesh order (dp major,
/// tp minor): what a recipe's [[stages]] ranks list.
std::vector<std::int64_t> stage_ranks(const Config& c, std::int64_t pp_index);

}  // namespace hp::planner
