// The second half of layer discovery (layers.cpp has the first): once every activation node belongs
// to a unit (prologue, block i, epilogue), place the side nodes, add up each unit's cost, and list
// the tensors crossing each boundary.
//
// Side nodes (shape arithmetic, constant computations such as a weight Transpose) go where they are
// consumed. A side node consumed by a single unit joins it; one consumed by several units joins the
// earliest unit able to compute it (the latest unit among its inputs' producers), so a causal mask
// or rotary table built once from the input's shape and used by every layer is prologue work rather
// than block-0 work, and every block keeps the same cost.
//
// Parameters are owned by the first unit that reads them, so a tied embedding/head matrix counts
// once (in the prologue) and the units' parameters add up to the model's.
#include <algorithm>
#include <set>

#include "hp/model/layers.h"

namespace hp::model {
namespace {

Block& unit_block(Layering& l, int unit) {
  if (unit == 0) return l.prologue;
  if (unit == static_cast<int>(l.blocks.size()) + 1) return l.epilogue;
  return l.blocks[static_cast<std::size_t>(unit - 1)];
}

}  // namespace

void place_side_nodes(const Graph& g, std::vector<int>& unit_of, int units) {
  const std::size_t n = g.nodes.size();
  std::vector<int> earliest(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (unit_of[i] >= 0) continue;
    int e = 0;
    for (int t : g.nodes[i].inputs) {
      if (t < 0 || g.tensor(t).producer < 0) continue;
      auto p = static_cast<std::size_t>(g.tensor(t).producer);
      e = std::max(e, unit_of[p] >= 0 ? unit_of[p] : earliest[p]);
    }
    earliest[i] = e;
  }
  for (std::size_t i = n; i-- > 0;) {
    if (unit_of[i] >= 0) continue;
    std::set<int> consumer_units;
    for (int t : g.nodes[i].outputs) {
      if (t < 0) continue;
      for (int c : g.tensor(t).consumers)
        consumer_units.insert(unit_of[static_cast<std::size_t>(c)]);
    }
    int u = consumer_units.size() == 1 ? *consumer_units.begin() : earliest[i];
    unit_of[i] = std::clamp(u, 0, units - 1);
  }
}

void fill_units(const Graph& g, const std::vector<int>& unit_of, Layering& l) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    Block& b = unit_block(l, unit_of[i]);
    const Node& node = g.nodes[i];
    b.nodes.push_back(static_cast<int>(i));
    b.flops += node.cost.flops();
    b.matmul_flops += node.cost.matmul_flops;
    b.cost_known = b.cost_known && node.cost.known;
    for (int o : node.outputs)
      if (o >= 0 && g.tensor(o).kind == TensorKind::activation)
        b.activation_bytes += g.tensor(o).bytes().value_or(0);
  }
  for (const auto& t : g.tensors) {
    if (!t.is_parameter()) continue;
    int owner = static_cast<int>(l.blocks.size()) + 1;
    for (int c : t.consumers) owner = std::min(owner, unit_of[static_cast<std::size_t>(c)]);
    if (t.consumers.empty()) owner = 0;
    unit_block(l, owner).parameters += t.numel().value_or(0);
  }
}

void fill_cuts(const Graph& g, const std::vector<int>& unit_of, Layering& l) {
  if (l.blocks.empty()) return;
  const int units = static_cast<int>(l.blocks.size()) + 2;
  std::vector<Cut> cuts(static_cast<std::size_t>(units - 1));
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    const Tensor& tensor = g.tensors[t];
    if (tensor.producer < 0) continue;
    int pu = unit_of[static_cast<std::size_t>(tensor.producer)], cu = pu;
    for (int c : tensor.consumers) cu = std::max(cu, unit_of[static_cast<std::size_t>(c)]);
    for (int b = pu; b < cu; ++b) {
      cuts[static_cast<std::size_t>(b)].tensors.push_back(static_cast<int>(t));
      cuts[static_cast<std::size_t>(b)].bytes += tensor.bytes().value_or(0);
    }
  }
  for (int b = 0; b + 1 < units; ++b) {
    Cut& c = cuts[static_cast<std::size_t>(b)];
    const Block& before = unit_block(l, b);
    const Block& after = unit_block(l, b + 1);
    if (before.nodes.empty() || after.nodes.empty()) continue;
    c.after = before.name;
    c.before = after.name;
    l.cuts.push_back(std::move(c));
  }
}

}  // namespace hp::model
