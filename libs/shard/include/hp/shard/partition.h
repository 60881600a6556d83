// Per-rank partitions (docs/shard.md, "Partitions"): one ONNX model per global rank holding its
// pipeline stage's nodes at local shapes, its slices of the weights, and the communication of the
// "hp" domain (hp/core/hp_domain.h) that propagation's redistributions and the pipeline boundaries
// need.
//
// A partition is specialised to the recipe's bound dims: Shape/Size of a tensor become constants of
// its global shape (so the exporter's shape arithmetic computes what it computed unsharded), and
// the target shapes of Reshape/Expand become the node's local output shape.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/graph.h"
#include "hp/model/model.h"
#include "hp/shard/propagate.h"

namespace hp::shard {

/// One pipeline stage: its nodes (topological order) and the global ranks at each mesh position.
struct StageNodes {
  int index = 0;
  std::vector<std::int64_t> layers;  ///< block numbers (discover_layers order)
  std::vector<int> nodes;
  std::vector<std::int64_t> ranks;  ///< ranks[position] = global rank; size == mesh size
};

/// An activation produced on one stage and read on a later one: each rank sends its local piece to
/// the rank at the same mesh position of the reading stage (tag = index in the boundary list).
struct Boundary {
  int tensor = -1;
  int from_stage = 0, to_stage = 0;
  int tag = 0;
};

struct PartitionPlan {
  const model::Model* model = nullptr;
  const model::Graph* graph = nullptr;
  const Propagation* prop = nullptr;
  std::vector<StageNodes> stages;
  std::vector<Boundary> boundaries;  ///< filled by plan_boundaries
};

/// Completes `stages` (every node a stage needs: shape/constant producers are copied into each
/// stage that reads them; nodes no stage lists go to stage 0) and lists the pipeline boundaries.
Status plan_boundaries(PartitionPlan& plan);

/// What one rank's partition holds.
struct RankPartition {
  std::int64_t rank = 0;
  int stage = 0;
  std::int64_t position = 0;  ///< mesh position within the stage
  std::string onnx;           ///< serialized ModelProto
  int comm_nodes = 0, sends = 0, recvs = 0;
  std::int64_t weight_bytes = 0;
  bool weights_written = true;  ///< false when the model has no weight data (shapes only)
  /// The partition's tensors whose values differ across the mesh's last axis (tp): split or
  /// partial over it, or computed from such. Training differentiates the partition and needs to
  /// know where the tensor-parallel regions begin (hp/train/autodiff.h, GradSpec::tp).
  std::vector<std::string> varying;
};

/// Builds the partition of the rank at `position` of `stage`. Weights are read from the model
/// (inline or external data); a model without weight data gives initializers with dims only.
Expected<RankPartition> build_partition(const PartitionPlan& plan, int stage,
                                        std::int64_t position);

}  // namespace hp::shard
