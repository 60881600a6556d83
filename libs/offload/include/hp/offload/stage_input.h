// From a recipe with a plan to the per-rank inputs of the timeline: every pipeline rank's units
// (its blocks in schedule order, plus the prologue on the first rank and the epilogue on the last),
// each with the bytes and seconds of the planner's cost model (planner::block_cost), so
// offload-profile and `hp plan` agree on what a unit costs. Model states follow the ZeRO formulas
// (formulas.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hp/core/dtype.h"
#include "hp/core/expected.h"
#include "hp/core/optimizer.h"
#include "hp/offload/capacity.h"
#include "hp/offload/timeline.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/recipe.h"

namespace hp::offload {

struct StageBuildOptions {
  std::filesystem::path model;  ///< resolved ONNX path
  bool train = true;
  DType dtype = DType::bf16;  ///< compute dtype: weights, gradients, activations
  Optimizer optimizer = Optimizer::adam;
  std::int64_t heads = 0, kv_heads = 0;  ///< GQA ratio for the KV cache; 0 = multi-head
};

struct BuiltStages {
  recipe::DeviceType device;
  std::int64_t seq = 0;
  std::vector<StageInput> stages;  ///< one per pipeline rank
  double predicted_step = 0;       ///< planner::predict's iteration time for this plan
  CapacityInput capacity;          ///< stages, context and batch (inference)
};

Expected<BuiltStages> build_stages(const recipe::Recipe& r, const recipe::Cluster& cluster,
                                   const StageBuildOptions& o);

}  // namespace hp::offload
