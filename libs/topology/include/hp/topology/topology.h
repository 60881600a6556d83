// The rank topology of a cluster: which tier two ranks talk over, and what bandwidth and latency a
// group of ranks gets. Ranks are placed contiguously: rank r is device r % ranks_per_node of node
// r / ranks_per_node, and unit u of a tier of size S holds ranks [u*S, (u+1)*S). That is how mpirun
// maps ranks by slot, and how the planner numbers ranks in a recipe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/recipe/cluster.h"

namespace hp::topology {

/// What a transfer between ranks runs over. `level` indexes Topology::tiers(); -1 means the ranks
/// are the same device (a local copy at memory bandwidth, zero latency).
struct Link {
  std::string tier;
  int level = -1;
  double bandwidth = 0;  ///< bytes/s per rank, one direction
  double latency = 0;    ///< seconds per message
};

class Topology {
 public:
  /// A topology over a valid cluster (validate_cluster() empty), already scaled to its node count.
  static Expected<Topology> from_cluster(const recipe::Cluster& c);

  std::int64_t ranks() const { return ranks_; }
  std::int64_t ranks_per_node() const { return ranks_per_node_; }
  /// The device type every rank runs on.
  const recipe::DeviceType& device() const { return device_; }
  const std::vector<recipe::Tier>& tiers() const { return tiers_; }
  const std::string& name() const { return name_; }

  std::int64_t node_of(std::int64_t rank) const { return rank / ranks_per_node_; }
  /// The unit of tier `level` holding `rank` (0 for an unbounded tier).
  std::int64_t unit_of(std::int64_t rank, int level) const;

  /// The innermost tier containing both ranks. Fails for ranks outside 0..ranks()-1.
  Expected<Link> link(std::int64_t a, std::int64_t b) const;

  /// The effective link of a group: the innermost tier holding every member. A group that spans
  /// several units of the tier below crosses this tier, so its collectives are bound by the slowest
  /// tier on the way (the minimum bandwidth of the tiers up to it) and pay this tier's latency.
  /// Tier bandwidths are per rank with the whole unit sending at once, so concurrent groups (every
  /// TP group of a node at once) share the tier without a further division. A one-rank group gets
  /// the self link. Fails for an empty group, duplicate ranks or ranks out of range.
  Expected<Link> group_link(std::span<const std::int64_t> ranks) const;

 private:
  Link self_link() const;
  Link tier_link(int level) const;

  std::string name_;
  recipe::DeviceType device_;
  std::vector<recipe::Tier> tiers_;
  std::int64_t ranks_ = 0;
  std::int64_t ranks_per_node_ = 1;
};

}  // namespace hp::topology
