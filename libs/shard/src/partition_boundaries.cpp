// Pipeline boundaries: which stage runs each node (shape and constant producers are recomputed in
// every stage that reads them) and which activations cross from one stage to a later one, each
// boundary with the tag its hp.Send / hp.Recv pair uses.
#include <fmt/core.h>

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "hp/shard/partition.h"

namespace hp::shard {

Status plan_boundaries(PartitionPlan& plan) {
  const auto& g = *plan.graph;
  std::vector<int> owner(g.nodes.size(), -1);
  for (const auto& st : plan.stages)
    for (int i : st.nodes)
      if (owner[static_cast<std::size_t>(i)] < 0) owner[static_cast<std::size_t>(i)] = st.index;
  for (std::size_t i = 0; i < owner.size(); ++i)
    if (owner[i] < 0) owner[i] = 0;
  std::vector<std::set<int>> sets(plan.stages.size());
  for (std::size_t i = 0; i < owner.size(); ++i)
    sets[static_cast<std::size_t>(owner[i])].insert(static_cast<int>(i));
  std::map<std::pair<int, int>, int> seen;  // (tensor, to_stage) -> tag
  plan.boundaries.clear();
  for (std::size_t s = 0; s < sets.size(); ++s) {
    // Shape and constant producers are recomputed in every stage that reads them.
    std::vector<int> work(sets[s].begin(), sets[s].end());
    while (!work.empty()) {
      int i = work.back();
      work.pop_back();
      for (int t : g.node(i).inputs) {
        if (t < 0) continue;
        const auto& tensor = g.tensor(t);
        int p = tensor.producer;
        if (p < 0 || sets[s].count(p)) continue;
        if (tensor.kind == model::TensorKind::activation) continue;
        sets[s].insert(p);
        work.push_back(p);
      }
    }
    for (int i : sets[s])
      for (int t : g.node(i).inputs) {
        if (t < 0) continue;
        const auto& tensor = g.tensor(t);
        int p = tensor.producer;
        if (p < 0 || sets[s].count(p) || tensor.kind != model::TensorKind::activation) continue;
        int from = owner[static_cast<std::size_t>(p)];
        if (from > static_cast<int>(s))
          return Error(
              Errc::bad_input,
              fmt::format(
                  "stage {} reads '{}' which stage {} produces: stages must follow the layer order",
                  s, tensor.name, from));
        auto key = std::pair{t, static_cast<int>(s)};
        if (seen.count(key)) continue;
        int tag = static_cast<int>(plan.boundaries.size());
        seen[key] = tag;
        plan.boundaries.push_back(Boundary{t, from, static_cast<int>(s), tag});
      }
    plan.stages[s].nodes.assign(sets[s].begin(), sets[s].end());
  }
  return {};
}

}  // namespace hp::shard
