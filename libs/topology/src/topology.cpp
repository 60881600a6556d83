// Rank placement and links. With contiguous placement, two ranks share a unit of a tier of size S
// exactly when a / S == b / S, so "the innermost tier containing both" is a scan from the inside
// out, and the innermost tier holding a whole group is the one where every member has the same unit
// as the first. Tier sizes nest (validate_cluster checks that each divides the next), so once ranks
// share a unit of one tier they share a unit of every tier outside it.
#include "hp/topology/topology.h"

#include <algorithm>
#include <limits>
#include <set>

#include <fmt/core.h>

namespace hp::topology {

Expected<Topology> Topology::from_cluster(const recipe::Cluster& c) {
  auto problems = recipe::validate_cluster(c, recipe::SourceMap(c.name));
  if (!problems.empty()) return collect_errors(Errc::bad_input, std::move(problems));
  Topology t;
  t.name_ = c.name;
  t.device_ = *c.rank_device_type();
  t.tiers_ = c.tiers;
  t.ranks_ = c.ranks();
  t.ranks_per_node_ = c.ranks_per_node();
  return t;
}

std::int64_t Topology::unit_of(std::int64_t rank, int level) const {
  std::int64_t size = tiers_[static_cast<std::size_t>(level)].size;
  return size > 0 ? rank / size : 0;
}

Link Topology::self_link() const { return Link{"self", -1, device_.memory_bandwidth, 0.0}; }

Link Topology::tier_link(int level) const {
  // The slowest tier up to `level` bounds the transfer (inner tiers are normally faster, but a
  // preset may say otherwise, e.g. a die link slower than the node fabric).
  double bw = std::numeric_limits<double>::infinity();
  for (int i = 0; i <= level; ++i) bw = std::min(bw, tiers_[static_cast<std::size_t>(i)].bandwidth);
  const recipe::Tier& t = tiers_[static_cast<std::size_t>(level)];
  return Link{t.name, level, bw, t.latency};
}

Expected<Link> Topology::link(std::int64_t a, std::int64_t b) const {
  const std::int64_t pair[] = {a, b};
  if (a == b) {
    if (a < 0 || a >= ranks_)
      return Error(Errc::bad_input, fmt::format("rank {} is outside cluster '{}' (ranks 0..{})", a,
                                                name_, ranks_ - 1));
    return self_link();
  }
  return group_link(pair);
}

Expected<Link> Topology::group_link(std::span<const std::int64_t> ranks) const {
  if (ranks.empty()) return Error(Errc::bad_input, "empty rank group");
  std::set<std::int64_t> seen;
  for (auto r : ranks) {
    if (r < 0 || r >= ranks_)
      return Error(Errc::bad_input, fmt::format("rank {} is outside cluster '{}' (ranks 0..{})", r,
                                                name_, ranks_ - 1));
    if (!seen.insert(r).second)
      return Error(Errc::bad_input, fmt::format("rank {} appears twice in the group", r));
  }
  if (ranks.size() == 1) return self_link();
  for (int level = 0; level < static_cast<int>(tiers_.size()); ++level) {
    std::int64_t unit = unit_of(ranks[0], level);
    bool together = std::all_of(ranks.begin(), ranks.end(),
                                [&](std::int64_t r) { return unit_of(r, level) == unit; });
    if (together) return tier_link(level);
  }
  // Unreachable for a valid cluster: the outermost tier spans every rank.
  return Error(Errc::internal, fmt::format("no tier of cluster '{}' holds the whole group", name_));
}

}  // namespace hp::topology
