// The consistency check propagate() runs on its result (propagate_rules.h, check_consistent).
#include <fmt/core.h>

#include <set>
#include <utility>

#include "propagate_rules.h"

namespace hp::shard::detail {

// Every node reads each input either as the tensor is laid out or through a redistribution. A
// violation is a propagation bug; it is reported here, naming the node, so that a plan is refused
// before any rank runs instead of failing inside a kernel with mismatched shapes.
Status check_consistent(const model::Graph& g, const Propagation& p) {
  std::set<std::pair<int, int>> moved;
  for (const auto& rd : p.redistributions) moved.insert({rd.tensor, rd.node});
  for (std::size_t i = 0; i < p.reads.size(); ++i)
    for (std::size_t k = 0; k < p.reads[i].size() && k < g.nodes[i].inputs.size(); ++k) {
      const int t = g.nodes[i].inputs[k];
      if (t < 0 || p.reads[i][k].dims.size() != g.tensor(t).dims.size()) continue;
      if (p.reads[i][k] == p.layout[static_cast<std::size_t>(t)]) continue;
      if (moved.count({t, static_cast<int>(i)})) continue;
      return Error(
          Errc::internal,
          fmt::format("sharding propagation: node '{}' reads '{}' as {} but it is laid "
                      "out as {}, with no redistribution between",
                      g.nodes[i].name, g.tensor(t).name, format_sharding(p.mesh, p.reads[i][k]),
                      format_sharding(p.mesh, p.layout[static_cast<std::size_t>(t)])),
          g.nodes[i].name, "report this model; fixing tp = 1 avoids the inconsistency");
    }
  return {};
}

}  // namespace hp::shard::detail
