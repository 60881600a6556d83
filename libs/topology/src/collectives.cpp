// Alpha-beta collective costs. Each formula is the standard one for the bandwidth-optimal algorithm
// (ring for all-reduce / all-gather / reduce-scatter, pairwise exchange for all-to-all); see
// docs/planner.md, "Collective costs", and nccl-tests' "bus bandwidth" for the (p-1)/p factors.
// The model ignores contention between different collectives and protocol overheads: the planner
// compares plans with it, so consistency matters more than absolute accuracy.
#include "hp/topology/collectives.h"

#include <cmath>

namespace hp::topology {

namespace {
double frac(std::int64_t p) { return static_cast<double>(p - 1) / static_cast<double>(p); }
double steps(std::int64_t p) { return static_cast<double>(p - 1); }
}  // namespace

double all_reduce_time(const Link& l, std::int64_t p, double bytes) {
  if (p <= 1) return 0;
  return 2 * frac(p) * bytes / l.bandwidth + 2 * steps(p) * l.latency;
}

double all_gather_time(const Link& l, std::int64_t p, double bytes) {
  if (p <= 1) return 0;
  return frac(p) * bytes / l.bandwidth + steps(p) * l.latency;
}

double reduce_scatter_time(const Link& l, std::int64_t p, double bytes) {
  return all_gather_time(l, p, bytes);
}

double all_to_all_time(const Link& l, std::int64_t p, double bytes) {
  if (p <= 1) return 0;
  return frac(p) * bytes / l.bandwidth + steps(p) * l.latency;
}

double send_recv_time(const Link& l, double bytes) { return bytes / l.bandwidth + l.latency; }

double broadcast_time(const Link& l, std::int64_t p, double bytes) {
  if (p <= 1) return 0;
  return bytes / l.bandwidth + std::ceil(std::log2(static_cast<double>(p))) * l.latency;
}

double hierarchical_all_reduce_time(const Link& inner, const Link& outer, std::int64_t per_node,
                                    std::int64_t nodes, double bytes) {
  double intra = reduce_scatter_time(inner, per_node, bytes);                           // step 1
  double inter = all_reduce_time(outer, nodes, bytes / static_cast<double>(per_node));  // step 2
  return intra + inter + all_gather_time(inner, per_node, bytes);                       // step 3
}

}  // namespace hp::topology
