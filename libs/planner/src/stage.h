// Private to libs/planner: the per-configuration cost table and the evaluation of one pipeline
// rank's share (its blocks, with the recompute choice that fits its memory at the least time).
#pragma once

#include <cstdint>
#include <vector>

#include "hp/planner/cost.h"

namespace hp::planner {

/// block_cost() of every block of a model under one configuration.
struct CostTable {
  std::vector<BlockCost> blocks;
  BlockCost prologue, epilogue;
};
CostTable cost_table(const ModelProfile& m, const Config& c, const Workload& w, const Machine& mc,
                     const AxisLinks& links);

/// Everything evaluate_stage needs, bundled so the search passes one reference.
struct StageContext {
  const ModelProfile& model;
  const Config& config;
  const Workload& work;
  const Machine& machine;
  const AxisLinks& links;
  const CostTable& costs;
};

/// The cost of pipeline rank `stage` holding `blocks`: picks per-block recomputation greedily by
/// memory saved per second added until the rank fits (exact when the rank's blocks are identical).
/// `feasible` is false when even full
/// recomputation of every block does not fit.
StagePlan evaluate_stage(const StageContext& ctx, std::int64_t stage,
                         std::vector<std::int64_t> blocks);

/// The cost of rank `stage` holding `blocks` with the given recompute choice per block.
StagePlan cost_stage(const StageContext& ctx, std::int64_t stage, std::vector<std::int64_t> blocks,
                     std::vector<recipe::Recompute> recompute);

/// The factor on the pipeline time's bubble term (sum t - max t, stage.cpp): bubble_seconds of the
/// schedule over 1F1B's, for a step whose forwards take `fwd` of its `all` compute seconds and
/// whose backward splits evenly into input and weight gradients. 1/v interleaved, fwd/all for ZB-H1
/// in training with m >= p (more with fewer micro-batches), 1 otherwise.
double bubble_scale(const Config& c, bool train, double fwd, double all);

/// The blocks of every pipeline rank when rank k holds counts[k] blocks in v chunks (sizes as even
/// as the count allows): chunk j = round * pp + rank, in model order; v = 1 is the contiguous
/// split.
/// The block indices a, a+1, ..., b-1.
std::vector<std::int64_t> block_range(std::int64_t a, std::int64_t b);

std::vector<std::vector<std::int64_t>> interleaved_layout(const std::vector<std::int64_t>& counts,
                                                          std::int64_t v);

}  // namespace hp::planner
