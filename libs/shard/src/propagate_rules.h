// Private: the per-op sharding rules propagation applies (propagate_rules.cpp) and the context they
// see. A rule reads the current layout of each input (a weight not yet laid out is "flexible": it
// takes whatever layout the rule asks of it) and answers the layout it needs of each input and the
// layout of each output.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "hp/model/graph.h"
#include "hp/shard/layout.h"
#include "hp/shard/propagate.h"

namespace hp::shard::detail {

using Entry = std::vector<int>;  // mesh axes of one tensor dim, first major

struct RuleInput {
  bool present = false;        // false for an omitted optional input
  Sharding cur;                // current layout (replicated when flexible)
  bool flexible = false;       // a weight with no layout yet: takes the requirement as its layout
  bool is_weight = false;      // an initializer (stored, sliced for free)
  bool is_activation = false;  // depends on the data of a graph input
  std::vector<std::int64_t> shape;
  int tensor = -1;       // graph tensor index
  int blocked_dim = -1;  // Propagation::blocked: the dim made of `blocks` blocks, -1 if none
  std::int64_t blocks = 1;
};

struct RuleContext {
  const onnx::GraphProto* proto = nullptr;
  const onnx::NodeProto* node = nullptr;
  const model::Graph* graph = nullptr;
  const Mesh* mesh = nullptr;
  int tp_axis = -1, dp_axis = -1;
  bool sequence_parallel = false;
  int opset = 17;
  int node_index = -1;
  const std::set<int>* no_fuse = nullptr;  // weights not to split blocked (a fusion that failed)
  const std::set<int>* replicate =
      nullptr;  // weights a head reshape could not keep split: replicated
  std::vector<RuleInput> in;
  std::vector<std::vector<std::int64_t>> out_shapes;
};

struct RuleResult {
  std::vector<Sharding> req;     // one per input slot (ignored for absent inputs)
  std::vector<Sharding> out;     // one per output
  std::vector<std::string> why;  // per input: "column-parallel", ... (for flexible weights)
  // Blocked dims (propagate.h): per input, the dim the rule wants a flexible weight blocked on; per
  // output, the dim it produces blocked (-1: none); the block count is `blocks`.
  std::vector<int> req_blocked, out_blocked;
  std::int64_t blocks = 1;
  bool blocks_ok = false;  // the rule understood its blocked inputs (else propagation refuses them)
};

/// Applies the rule of the node's op (or the replicate-everything default).
RuleResult apply_rule(const RuleContext& c);

/// Every node of `g` reads each input as `p` lays it out or through one of its redistributions;
/// otherwise an internal error naming the node (propagate_check.cpp).
Status check_consistent(const model::Graph& g, const Propagation& p);

/// Int64 values of a constant tensor (initializer or Constant node output), empty when unknown.
std::vector<std::int64_t> const_ints(const onnx::GraphProto& g, const std::string& name);

}  // namespace hp::shard::detail
