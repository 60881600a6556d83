// Alpha-beta cost of a redistribution plan on the cluster's topology (docs/shard.md,
// "Redistribution cost"). Costs are PER RANK and in SECONDS: the time one rank spends in the step,
// with every group of the step running at once (the step takes as long as its slowest group). alpha
// = the group's Link latency, beta = 1/bandwidth of the innermost tier spanning the group
// (topology::Topology::group_link), gamma = seconds per byte reduced. n is RedistStep::bytes (AG:
// output bytes, RS: input bytes, AR: the buffer, A2A: the per-rank send buffer, permute: the local
// block):
//
//   all_gather      (p-1) alpha + (p-1)/p n beta
//   reduce_scatter  (p-1) alpha + (p-1)/p n (beta + gamma)
//   all_reduce      ring: 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
//                   recursive doubling: ceil(log2 p) (alpha + n beta + n gamma)
//   all_to_all      (p-1) alpha + (p-1)/p n beta
//   permute         alpha + n beta over the slowest (src, dst) link that moves data
//   local_slice     0
#pragma once

#include <vector>

#include "hp/core/expected.h"
#include "hp/shard/redistribute.h"
#include "hp/topology/topology.h"

namespace hp::shard {

enum class AllReduceAlgo { ring, recursive_doubling, best };

struct CostOptions {
  /// Seconds per reduced byte; < 0 derives it from the rank device: 3 / memory_bandwidth (two reads
  /// and one write per element reduced), 0 when the device gives no memory bandwidth.
  double gamma = -1;
  AllReduceAlgo all_reduce = AllReduceAlgo::ring;  ///< best: the cheaper of the two per step
};

struct PlanCost {
  double seconds = 0;                ///< sum of the steps (they run one after another)
  std::vector<double> step_seconds;  ///< per step of the plan, same order
};

/// Time of one step. Errors (bad_input): a group rank outside the topology.
Expected<double> step_time(const topology::Topology& topo, const RedistStep& step,
                           const CostOptions& opts = {});
/// Time of every step and their sum.
Expected<PlanCost> plan_cost(const topology::Topology& topo, const RedistPlan& plan,
                             const CostOptions& opts = {});

}  // namespace hp::shard
