// The alpha-beta formulas of docs/shard.md, "Redistribution cost", over topology links; see
// shard_cost.h for the table and the units.
#include "hp/shard/shard_cost.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>

namespace hp::shard {
namespace {

double gamma_of(const topology::Topology& topo, const CostOptions& opts) {
  if (opts.gamma >= 0) return opts.gamma;
  double bw = topo.device().memory_bandwidth;
  return bw > 0 ? 3.0 / bw : 0.0;
}

/// One group's time for a collective of n bytes over link l (p = group size).
double group_time(StepKind kind, const topology::Link& l, double p, double n, double gamma,
                  AllReduceAlgo algo) {
  if (p <= 1) return 0;
  const double alpha = l.latency, beta = l.bandwidth > 0 ? 1.0 / l.bandwidth : 0.0, f = (p - 1) / p;
  switch (kind) {
    case StepKind::all_gather:
    case StepKind::all_to_all: return (p - 1) * alpha + f * n * beta;
    case StepKind::reduce_scatter: return (p - 1) * alpha + f * n * (beta + gamma);
    case StepKind::all_reduce: {
      double ring = 2 * (p - 1) * alpha + 2 * f * n * beta + f * n * gamma;
      double doubling = std::ceil(std::log2(p)) * (alpha + n * beta + n * gamma);
      if (algo == AllReduceAlgo::ring) return ring;
      if (algo == AllReduceAlgo::recursive_doubling) return doubling;
      return std::min(ring, doubling);
    }
    case StepKind::local_slice:
    case StepKind::permute: return 0;
  }
  return 0;
}

}  // namespace

Expected<double> step_time(const topology::Topology& topo, const RedistStep& step,
                           const CostOptions& opts) {
  const auto n = static_cast<double>(step.bytes);
  double worst = 0;
  if (step.kind == StepKind::local_slice) return 0.0;
  if (step.kind == StepKind::permute) {
    for (auto [src, dst] : step.pairs) {
      if (src == dst) continue;
      auto l = topo.link(src, dst);
      if (!l.ok())
        return Error(Errc::bad_input,
                     fmt::format("cost: permute {}->{}: {}", src, dst, l.error().message()));
      double beta = l->bandwidth > 0 ? 1.0 / l->bandwidth : 0.0;
      worst = std::max(worst, l->latency + n * beta);
    }
    return worst;
  }
  const double gamma = gamma_of(topo, opts);
  for (const auto& g : step.groups) {
    auto l = topo.group_link(g);
    if (!l.ok())
      return Error(Errc::bad_input, fmt::format("cost: {} group: {}", step_kind_name(step.kind),
                                                l.error().message()));
    worst = std::max(
        worst, group_time(step.kind, *l, static_cast<double>(g.size()), n, gamma, opts.all_reduce));
  }
  return worst;
}

Expected<PlanCost> plan_cost(const topology::Topology& topo, const RedistPlan& plan,
                             const CostOptions& opts) {
  PlanCost cost;
  for (const RedistStep& s : plan.steps) {
    HP_ASSIGN_OR_RETURN(auto t, step_time(topo, s, opts));
    cost.step_seconds.push_back(t);
    cost.seconds += t;
  }
  return cost;
}

}  // namespace hp::shard
