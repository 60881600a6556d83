// Private: per-node cost (cost.cpp).
#pragma once

#include "hp/model/graph.h"
#include "hp/model/model.h"
#include "onnx_util.h"

namespace hp::model {

/// FLOPs, bytes and parameters of `node` (whose tensors in `graph` carry inferred shapes).
NodeCost compute_cost(const onnx::NodeProto& proto, const Graph& graph, const Node& node);

// cost_control.cpp
/// Fills `c`'s FLOPs for a recurrent layer (LSTM, GRU, RNN); false when `node` is none.
bool add_recurrent_cost(const onnx::NodeProto& proto, const Graph& graph, const Node& node,
                        NodeCost& c);
/// Adds the cost of `node`'s subgraphs (If, Loop, Scan, SequenceMap), each built as a graph of its
/// own from `model`'s opsets; nothing for other nodes.
void add_subgraph_cost(const Model& model, const onnx::NodeProto& proto, const Graph& graph,
                       const Node& node, NodeCost& c);

}  // namespace hp::model
