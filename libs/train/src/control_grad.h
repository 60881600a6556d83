// Gradients of the control-flow ops If and Loop (docs/training.md, "Control flow").
//
// Their subgraphs read outer tensors (weights, activations) by name, so a rule that sees only the
// node's inputs cannot differentiate them; autodiff.cpp calls these instead of a GradCtx rule. Each
// backward is itself control flow whose subgraph recomputes the forward subgraph and runs its
// gradient, built by build_grad_graph on the subgraph taken as a model of its own (its outer reads
// as graph inputs, the gradients arriving at its outputs as output_grads): nested If and Loop
// nodes differentiate by the same recursion.
//   - If: an If on the same condition whose branches give the gradient of every outer tensor the
//     node differentiates (zeros where a branch does not read it).
//   - Loop: the forward Loop also stacks each iteration's carried values (extra scan outputs);
//     a backward Loop runs the iterations in reverse, reads iteration i's carried values from
//     those stacks, and carries the gradient of the carried values and the sum of the outer
//     tensors' gradients.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "grad_ctx.h"
#include "hp/train/autodiff.h"

namespace hp::train::detail {

/// What the control-flow rules need of the transformation around them.
struct ControlContext {
  const model::Model* model = nullptr;  ///< the forward (path, opsets, ir version)
  const GradSpec* spec = nullptr;       ///< its dims are the subgraphs' too
  std::function<bool(const std::string&)> requires_grad;
  /// The name a forward tensor has where the backward reads it (a recomputed clone's).
  std::function<std::string(const std::string&)> renamed;
};

/// A gradient the backward of a node contributes: (forward tensor, its gradient).
using Contribution = std::pair<std::string, std::string>;

/// Emits the backward of forward node `k` of w.graph (an If or a Loop; a Loop gains the stacks of
/// its carried values) for the gradients `douts` arriving at its outputs ("" where none).
/// Errc::bad_input naming the node for what cannot be differentiated: a random op in a subgraph
/// (its recomputation would draw other values), a subgraph op without a rule.
Expected<std::vector<Contribution>> control_flow_grad(GraphWriter& w, int k,
                                                      const std::vector<std::string>& douts,
                                                      const ControlContext& cx);

}  // namespace hp::train::detail
