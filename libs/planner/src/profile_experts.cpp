// Experts of a ModuleList, found without names (profile_experts.h).
#include "profile_experts.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

namespace hp::planner {

using model::Graph;
using model::Tensor;

namespace {

// The block's nodes `t` depends on; with `values_only`, not through a Shape's input (a Shape reads
// its input's shape, not its values).
std::set<int> block_cone(const Graph& g, const std::set<int>& in_block, int t, bool values_only) {
  std::set<int> seen;
  std::vector<int> todo{t};
  while (!todo.empty()) {
    const int x = todo.back();
    todo.pop_back();
    const int p = x < 0 ? -1 : g.tensor(x).producer;
    if (p < 0 || !in_block.count(p) || !seen.insert(p).second) continue;
    if (values_only && g.node(p).op_type == "Shape") continue;
    for (int i : g.node(p).inputs) todo.push_back(i);
  }
  return seen;
}

}  // namespace

// Experts of a ModuleList, stacked with torch.stack: a Concat of Unsqueezes whose inputs come from
// branches each with nodes (at least one matmul over a weight) and weights of its own. What they
// cost: their count, their parameters, and their forward FLOPs on every token.
ListExperts module_list_experts(const Graph& g, const model::Block& b) {
  const std::set<int> in_block(b.nodes.begin(), b.nodes.end());
  ListExperts all;
  for (int ni : b.nodes) {
    const auto& c = g.node(ni);
    if (c.op_type != "Concat" || c.inputs.size() < 2) continue;
    std::vector<int> outs;
    for (int ti : c.inputs) {
      const int u = ti < 0 ? -1 : g.tensor(ti).producer;
      if (u < 0 || !in_block.count(u) || g.node(u).op_type != "Unsqueeze" ||
          g.node(u).inputs.empty())
        break;
      outs.push_back(g.node(u).inputs[0]);
    }
    if (outs.size() != c.inputs.size()) continue;
    std::vector<std::set<int>> cones;
    std::map<int, int> count;
    for (int o : outs) {
      cones.push_back(block_cone(g, in_block, o, false));
      for (int k : cones.back()) ++count[k];
    }
    ListExperts layer;
    layer.experts = static_cast<std::int64_t>(outs.size());
    for (const auto& cone : cones) {
      std::set<int> mine, weights;
      for (int k : cone)
        if (count[k] == 1) mine.insert(k);
      bool matmul = false;
      for (int k : mine) {
        const auto& n = g.node(k);
        layer.flops += n.cost.flops();
        for (int ti : n.inputs) {
          if (ti < 0 || !g.tensor(ti).is_parameter()) continue;
          const auto& readers = g.tensor(ti).consumers;
          if (!std::all_of(readers.begin(), readers.end(), [&](int r) { return mine.count(r); }))
            continue;  // shared with something else: not this expert's
          weights.insert(ti);
          matmul = matmul || n.op_type == "MatMul" || n.op_type == "Gemm";
        }
      }
      if (!matmul) layer.experts = 0;
      for (int ti : weights)
        if (auto numel = g.tensor(ti).numel()) layer.parameters += static_cast<double>(*numel);
    }
    if (layer.experts < 2) continue;
    all.experts = std::max(all.experts, layer.experts);
    all.parameters += layer.parameters;
    all.flops += layer.flops;
  }
  return all;
}

// Experts added into a sum (libs/train/src/expert_accumulate.h): Adds chained from a zeros
// ConstantOfShape, each adding a term with nodes of its own (its ancestors through values, not
// through a Shape's input) that read weights of its own, at least one by a matmul. Mixtral's loop
// runs each expert on the rows its router sends it (torch.where): their count is decided by the
// data, so those matmuls' FLOPs are not in the block's, and each expert is priced on its share of
// the block's rows, top_k / E of them (the rows: the largest leading dim among the known-shape
// tensors the expert reads from outside, the tokens). A sum of gated experts runs every expert on
// every token at known shapes, already counted. `extra` gets the FLOPs the block does not count.
ListExperts summed_experts(const Graph& g, const model::Block& b, std::int64_t top_k,
                           double& extra) {
  const std::set<int> in_block(b.nodes.begin(), b.nodes.end());
  ListExperts all;
  for (int z : b.nodes) {
    if (g.node(z).op_type != "ConstantOfShape" || g.node(z).outputs.empty()) continue;
    std::vector<int> terms, adds;
    for (int cur = g.node(z).outputs[0];;) {
      int next = -1, count = 0;
      for (int r : cur < 0 ? std::vector<int>{} : g.tensor(cur).consumers)
        if (in_block.count(r) && g.node(r).op_type == "Add" && g.node(r).inputs.size() == 2)
          next = r, ++count;
      if (count != 1) break;
      const auto& a = g.node(next);
      const int other = a.inputs[0] == cur ? a.inputs[1] : a.inputs[0];
      if (other == cur || a.outputs.empty()) break;
      terms.push_back(other);
      adds.push_back(next);
      cur = a.outputs[0];
    }
    std::vector<std::set<int>> cones;
    const std::set<int> chain(adds.begin(), adds.end());
    for (int t : terms) {
      std::set<int> seen = block_cone(g, in_block, t, true);
      if (std::any_of(seen.begin(), seen.end(), [&](int k) { return chain.count(k) > 0; }))
        break;  // reads the sum: the next block, not an expert
      cones.push_back(std::move(seen));
    }
    std::map<int, int> count;
    for (const auto& cone : cones)
      for (int k : cone) ++count[k];
    ListExperts layer;
    double unpriced = 0;
    for (const auto& cone : cones) {
      std::set<int> mine;
      for (int k : cone)
        if (count[k] == 1 && g.node(k).op_type != "Constant") mine.insert(k);
      double params = 0, matmul_params = 0, rows = 0;
      bool known = true;
      for (int k : mine) {
        const auto& n = g.node(k);
        for (int ti : n.outputs)
          if (ti >= 0 && !g.tensor(ti).numel()) known = false;
        for (std::size_t i = 0; i < n.inputs.size(); ++i) {
          const int ti = n.inputs[i];
          if (ti < 0) continue;
          const Tensor& t = g.tensor(ti);
          if (!t.is_parameter()) {
            if (!mine.count(t.producer) && t.kind == model::TensorKind::activation && t.has_shape &&
                !t.dims.empty() && t.dims[0].value > 0)
              rows = std::max(rows, static_cast<double>(t.dims[0].value));
            continue;
          }
          if (!std::all_of(t.consumers.begin(), t.consumers.end(),
                           [&](int r) { return mine.count(r) > 0; }))
            continue;
          const double numel = static_cast<double>(t.numel().value_or(0));
          params += numel;
          // A Gemm's bias (input 2) is an add, not multiply-accumulates.
          if (n.op_type == "MatMul" || (n.op_type == "Gemm" && i < 2)) matmul_params += numel;
        }
      }
      if (matmul_params == 0) break;  // not an expert: the chain's experts end before it
      ++layer.experts;
      layer.parameters += params;
      if (!known) unpriced += 2.0 * matmul_params * rows;
    }
    if (layer.experts < 2) continue;
    extra += unpriced *
             std::min<double>(1.0, static_cast<double>(top_k) / static_cast<double>(layer.experts));
    all.experts = std::max(all.experts, layer.experts);
    all.parameters += layer.parameters;
  }
  return all;
}

}  // namespace hp::planner
