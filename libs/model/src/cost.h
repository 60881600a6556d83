// Private: per-node cost (cost.cpp).
#pragma once

#include "hp/model/graph.h"
#include "onnx_util.h"

namespace hp::model {

/// FLOPs, bytes and parameters of `node` (whose tensors in `graph` carry inferred shapes).
NodeCost compute_cost(const onnx::NodeProto& proto, const Graph& graph, const Node& node);

}  // namespace hp::model
