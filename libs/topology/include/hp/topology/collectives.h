// Alpha-beta costs of collectives (docs/planner.md, "Collective costs"): a message of n bytes over
// a link costs alpha + n/B, with alpha = Link::latency and B = Link::bandwidth (per rank, one
// direction). p is the group size; every function returns 0 for p <= 1 (nothing to exchange) and
// seconds otherwise. These are the bandwidth-optimal ring / pairwise algorithms NCCL and HCCL use
// for large messages.
#pragma once

#include <cstdint>

#include "hp/topology/topology.h"

namespace hp::topology {

/// Ring all-reduce of an n-byte buffer: 2(p-1)/p * n/B + 2(p-1) alpha.
double all_reduce_time(const Link& l, std::int64_t p, double bytes);
/// All-gather producing an n-byte buffer (n/p from each rank): (p-1)/p * n/B + (p-1) alpha.
double all_gather_time(const Link& l, std::int64_t p, double bytes);
/// Reduce-scatter of an n-byte buffer (n/p result per rank): (p-1)/p * n/B + (p-1) alpha.
double reduce_scatter_time(const Link& l, std::int64_t p, double bytes);
/// All-to-all where each rank holds n bytes, n/p for every peer (itself included), pairwise
/// exchange: (p-1)/p * n/B + (p-1) alpha.
double all_to_all_time(const Link& l, std::int64_t p, double bytes);
/// Point-to-point send/recv of n bytes: n/B + alpha.
double send_recv_time(const Link& l, double bytes);
/// Broadcast of n bytes, pipelined (bandwidth term n/B) with a binomial tree's ceil(log2 p) alphas.
double broadcast_time(const Link& l, std::int64_t p, double bytes);

/// Hierarchical all-reduce over `nodes` units of `per_node` ranks: reduce-scatter inside the unit
/// over `inner`, all-reduce of n/per_node across units over `outer`, all-gather inside (the worked
/// example is in docs/planner.md, "Collective costs").
double hierarchical_all_reduce_time(const Link& inner, const Link& outer, std::int64_t per_node,
                                    std::int64_t nodes, double bytes);

}  // namespace hp::topology
