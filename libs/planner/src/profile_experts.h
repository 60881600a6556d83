// Private (profile.cpp): mixture-of-experts layers written as a ModuleList, which the planner finds
// without names: stacked with torch.stack, or added into a sum by a loop.
#pragma once

#include <cstdint>

#include "hp/model/graph.h"
#include "hp/model/layers.h"

namespace hp::planner {

/// What a block's experts cost: their count (per layer), their parameters, and (a torch.stack of
/// them) their forward FLOPs on every token.
struct ListExperts {
  std::int64_t experts = 0;
  double parameters = 0, flops = 0;
};

/// Experts of a ModuleList stacked with torch.stack (a Concat of Unsqueezes over branches with
/// nodes and weights of their own, at least one a matmul): their forward FLOPs on every token.
ListExperts module_list_experts(const model::Graph& g, const model::Block& b);

/// Experts added into a sum by a loop (libs/train/src/expert_accumulate.h); `extra` gets the FLOPs
/// of Mixtral-style routed rows that the block's shapes leave out, at top_k / E of its rows.
ListExperts summed_experts(const model::Graph& g, const model::Block& b, std::int64_t top_k,
                           double& extra);

}  // namespace hp::planner
