// The two-level search of the H2O planner (docs/planner.md).
//
// Level 1 enumerates every configuration of N ranks: tp * pp * dp = N (pp at most the block count),
// each micro-batch size dividing the per-replica batch (the micro-batch count follows), ZeRO level
// 0..3 over the DP group, sequence parallelism when tp > 1, the schedule (GPipe, 1F1B, interleaved
// with v virtual stages) and the placement of the three axes onto ranks (all 6 orders; orders that
// give every axis the same topology tier are one candidate). Nothing is ruled out by a fixed rule
// such as "TP inside the node": a TP group across nodes simply costs what the scale-out tier makes
// it cost.
//
// Each configuration gets two bounds from its cost table without assigning stages:
//   memory: model states / pp + the margin must fit (the busiest rank holds at least the average);
//   time:   m t + (p-1) t / v with t = the per-rank average micro-batch time without recomputation,
//           plus post-flush collectives and the optimizer step on the average rank's parameters.
// The time bound is a true lower bound of predict(): recomputation and imbalance only add to it.
// Candidates are visited in order of that bound, and the visit stops as soon as the bound reaches
// the k-th best predicted time: no later candidate can enter the top k (branch and bound). Beside
// the top k the search keeps the best plan of each of the fastest structures (same_structure), and
// the bound is checked against that list too (Ranking below).
//
// Level 2 (stage assignment and recomputation) is in assign_stages.cpp; visiting the candidates
// in bound order and keeping the best plans in search_rank.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <tuple>

#include "hp/planner/planner.h"
#include "hp/topology/collectives.h"
#include "pricing.h"
#include "search_internal.h"
#include "stage.h"

namespace hp::planner {
namespace {

using detail::Bounded;
using detail::note_shortfall;

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> d;
  for (std::int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

// Per-rank average micro-batch time and parameters of a cost table: the inputs to the bounds.
struct Totals {
  double time = 0, dense = 0, expert = 0, states = 0;
  double fwd = 0, compute = 0;  // bubble_scale's inputs, the sums predict() sees over all stages
};

Totals totals(const ModelProfile& m, const CostTable& t) {
  Totals s;
  auto add = [&](const BlockCost& b) {
    s.time += b.fwd + b.bwd + b.tp_comm + b.ep_comm;
    s.fwd += b.fwd;
    s.compute += b.fwd + b.bwd;
    s.dense += b.dense_params;
    s.expert += b.expert_params;
    s.states += b.state_bytes;
  };
  add(t.prologue);
  add(t.epilogue);
  for (std::size_t i = 0; i < m.blocks.size(); ++i) add(t.blocks[i]);
  return s;
}

// The time lower bound of a configuration (see the essay): predict() on one balanced stage.
double time_bound(const ModelProfile& m, const Config& c, const Workload& w, const Machine& mc,
                  const AxisLinks& links, const Totals& t) {
  const double pp = static_cast<double>(c.pp);
  const double avg = t.time / pp;
  const double mbs = static_cast<double>(c.micro_batches);
  const double v = static_cast<double>(c.virtual_stages);
  // Pipeline sends are the same for every assignment: spread them over the ranks like the work.
  double hops = 0;
  if (c.pp > 1) {
    const double msg = static_cast<double>(c.micro_batch_size) * m.hidden_bytes /
                       (c.sequence_parallel ? static_cast<double>(c.tp) : 1.0);
    hops = (2.0 * pp - 2.0) * (w.train ? 2.0 : 1.0) * v * topology::send_recv_time(links.pp, msg) *
           (1.0 - mc.cal.overlap_pp) / pp;
  }
  // predict()'s m max t + (sum t - max t) r >= m avg + (p - 1) avg r for any r <= 1 <= m: the same
  // bubble scale r (1/v, or ZB-H1's forward share) keeps the bound below every assignment.
  double bound =
      mbs * (avg + hops) + (pp - 1.0) * (avg + hops) * bubble_scale(c, w.train, t.fwd, t.compute);
  if (!w.train) return bound;
  // The post-flush terms are affine in the bytes (gradient sync, gathers) or linear (optimizer
  // step), so the average rank's are at most the biggest rank's.
  bound += gradient_sync_time(c, w, mc, links, t.dense / pp, t.expert / pp);
  const auto dshard = static_cast<double>(dense_shard(c)),
             eshard = static_cast<double>(expert_shard(c));
  if (c.optimizer_shard > 0) {
    const double gathers = zero_gathers(c, mbs);
    const double hidden = c.optimizer_shard == 3 ? mc.cal.overlap_opt : 0.0;
    bound += gathers *
             topology::all_gather_time(links.shard, dense_shard(c),
                                       (t.dense + t.expert) / pp * m.dtype_bytes) *
             (1.0 - hidden);
  }
  if (mc.memory_bandwidth > 0)
    bound += 32.0 * (t.dense / dshard + t.expert / eshard) / pp / mc.memory_bandwidth;
  return bound;
}

// Expert parallelism is carved out of DP: ep divides dp and the expert count (ep = 1 is no EP).
std::vector<std::int64_t> expert_degrees(std::int64_t dp, std::int64_t experts,
                                         const Fixed& fixed) {
  std::vector<std::int64_t> eps;
  for (std::int64_t ep : divisors(dp))
    if ((ep == 1 || (experts > 0 && experts % ep == 0)) && (!fixed.ep || *fixed.ep == ep))
      eps.push_back(ep);
  return eps;
}

// An HSDP group: ZeRO shards over it, with the links that then apply; group 0 = none.
struct Hsdp {
  std::int64_t group = 0;
  std::optional<AxisLinks> links;
};

// HSDP is worth a candidate only when a DP sub-group reaches a faster tier than the whole DP group:
// the largest such sub-group (the innermost ranks of the DP group) under `base`'s placement.
Hsdp hsdp_group(const topology::Topology& topo, const Config& base, const AxisLinks& links) {
  // Tiers only get slower as the group grows: bisect the proper divisors of dp.
  std::int64_t sdp = 1;
  for (Axis x : base.order) {
    if (x == Axis::dp) break;
    sdp *= x == Axis::tp ? base.tp : base.pp;
  }
  auto faster = [&](std::int64_t o) {
    std::vector<std::int64_t> ranks;
    for (std::int64_t i = 0; i < o; ++i) ranks.push_back(i * sdp);
    auto l = topo.group_link(ranks);
    return l && l->level < links.dp.level;
  };
  auto ds = divisors(base.dp);
  ds.erase(
      std::remove_if(ds.begin(), ds.end(), [&](std::int64_t o) { return o == 1 || o == base.dp; }),
      ds.end());
  std::size_t lo = 0, hi = ds.size();  // ds[0, lo) are faster, ds[hi, end) are not
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (faster(ds[mid]))
      lo = mid + 1;
    else
      hi = mid;
  }
  Hsdp h;
  if (lo > 0) {
    Config hc = base;
    hc.shard_group = ds[lo - 1];
    if (auto hl = axis_links(topo, hc)) h.group = ds[lo - 1], h.links = *hl;
  }
  return h;
}

// The schedules a configuration may run: 1F1B always; in training with pp > 1 also GPipe, ZB-H1
// and, when the micro-batch count is a multiple of pp (Megatron interleaves only then),
// interleaving with every virtual-stage count that leaves each chunk at least one of the `blocks`.
// ZB-V is not searched: its V places chunks unlike the layouts the planner prices.
std::vector<std::pair<recipe::Schedule, std::int64_t>> schedules(const Config& c, bool train,
                                                                 std::int64_t blocks) {
  std::vector<std::pair<recipe::Schedule, std::int64_t>> out = {{recipe::Schedule::one_f_one_b, 1}};
  if (c.pp > 1 && train) {
    out.push_back({recipe::Schedule::gpipe, 1});
    out.push_back({recipe::Schedule::zb_h1, 1});
    if (c.micro_batches % c.pp == 0)
      for (std::int64_t v = 2; c.pp * v <= blocks; ++v)
        out.push_back({recipe::Schedule::interleaved, v});
  }
  return out;
}

// Level 1: every configuration of the ranks, nested from the degrees down to the schedule, each
// bounded from its cost table without assigning stages. The memory bound drops a configuration
// (counted, and noted as a shortfall); the rest are returned with their time bounds.
class Level1 {
 public:
  Level1(const SearchInput& in, SearchResult& res)
      : in_(in),
        res_(res),
        ranks_(in.topo.ranks()),
        blocks_(std::max<std::int64_t>(1, static_cast<std::int64_t>(in.model.blocks.size()))),
        batch_(in.work.global_batch),
        usable_(usable_memory(in.machine)) {
    for (const auto& b : in.model.blocks) experts_ = std::max(experts_, b.experts);
  }

  // Every split of the ranks into tp x pp x dp that the heads, blocks, batch and --fix allow.
  std::vector<Bounded> enumerate() {
    const Fixed& fixed = in_.limits.fixed;
    for (std::int64_t tp : divisors(ranks_)) {
      if ((fixed.tp && *fixed.tp != tp) ||
          (in_.limits.whole_heads && in_.model.heads > 0 && in_.model.heads % tp != 0))
        continue;
      for (std::int64_t pp : divisors(ranks_ / tp)) {
        if (pp > blocks_ || (fixed.pp && *fixed.pp != pp)) continue;
        const std::int64_t dp = ranks_ / tp / pp;
        if (batch_ % dp != 0 || (fixed.dp && *fixed.dp != dp)) continue;
        placements(tp, pp, dp);
      }
    }
    return std::move(cands_);
  }

 private:
  // Every placement of the axes onto ranks and every expert degree of one split. Placements that
  // put every group on the same tiers cost the same, so only the first of them becomes candidates.
  void placements(std::int64_t tp, std::int64_t pp, std::int64_t dp) {
    std::set<std::tuple<int, int, int, int, int, std::int64_t, std::int64_t, int>> seen_links;
    const auto eps = expert_degrees(dp, experts_, in_.limits.fixed);
    for (const auto& order : kAxisOrders) {
      for (std::int64_t ep : eps) {
        Config base;
        base.tp = tp, base.pp = pp, base.dp = dp, base.ep = ep;
        if (in_.limits.fixed.recompute)
          base.forced_recompute = static_cast<int>(*in_.limits.fixed.recompute);
        std::copy(order, order + 3, base.order);
        auto links = axis_links(in_.topo, base);
        if (!links) continue;
        const Hsdp hsdp = in_.work.train && dp > 1 ? hsdp_group(in_.topo, base, *links) : Hsdp{};
        if (!seen_links
                 .insert({links->tp.level, links->dp.level, links->pp.level, links->ep.level,
                          links->edp.level, ep, hsdp.group,
                          hsdp.links ? hsdp.links->replica.level : -1})
                 .second)
          continue;
        micro_batchings(base, *links, hsdp);
      }
    }
  }

  // Every micro-batch size dividing the per-replica batch (the count follows), with and without
  // sequence parallelism. Times do not depend on the ZeRO level, so one cost table serves all four.
  void micro_batchings(const Config& base, const AxisLinks& links, const Hsdp& hsdp) {
    for (std::int64_t mbs : divisors(batch_ / base.dp)) {
      // Pipeline stages run one micro-batch at a time with static shapes; hp shard binds a
      // symbolic batch dim to the micro-batch, which a static-batch export does not have.
      if (in_.model.static_batch > 0 && base.pp > 1 && batch_ / base.dp / mbs > 1) continue;
      for (int sp = 0; sp <= (base.tp > 1 ? 1 : 0); ++sp) {
        Config c = base;
        c.micro_batch_size = mbs;
        c.micro_batches = batch_ / base.dp / mbs;
        c.sequence_parallel = sp == 1;
        const CostTable table = cost_table(in_.model, c, in_.work, in_.machine, links);
        zero_levels(c, links, hsdp, totals(in_.model, table));
      }
    }
  }

  // The ZeRO levels over the whole DP group, and over the HSDP group when there is one, each with
  // the model states of the same table rescaled; then every schedule of the configuration.
  void zero_levels(Config c, const AxisLinks& links, const Hsdp& hsdp, Totals t) {
    const ModelProfile& m = in_.model;
    const Workload& w = in_.work;
    const Fixed& fixed = in_.limits.fixed;
    for (int zs = 0; zs <= (w.train && c.dp > 1 ? 3 + 3 * (hsdp.group > 0) : 0); ++zs) {
      // zs 0..3: ZeRO 0..3 over the whole DP group; 4..6: ZeRO 1..3 over the HSDP group.
      const int zero = zs <= 3 ? zs : zs - 3;
      c.optimizer_shard = zero;
      c.shard_group = zs <= 3 ? 0 : hsdp.group;
      if (fixed.shard_group && *fixed.shard_group != (c.shard_group > 0 ? c.shard_group : c.dp))
        continue;
      const AxisLinks& zl = zs <= 3 ? links : *hsdp.links;
      t.states = t.dense * state_bytes_per_param(w, m.dtype_bytes, zero, dense_shard(c)) +
                 t.expert * state_bytes_per_param(w, m.dtype_bytes, zero, expert_shard(c));
      for (auto [sched, v] : schedules(c, w.train, blocks_)) {
        c.schedule = sched;
        c.virtual_stages = v;
        if (fixed.admits(c)) bound(c, zl, t);
      }
    }
  }

  // One configuration's bounds: model states / pp above the usable memory drops it; the time bound
  // orders the survivors.
  void bound(const Config& c, const AxisLinks& links, const Totals& t) {
    ++res_.stats.evaluated;
    const double mem_bound = t.states / static_cast<double>(c.pp);
    if (mem_bound > usable_) {
      ++res_.stats.pruned_memory;
      note_shortfall(res_.shortfall, mem_bound, mem_bound, 0, c);
      return;
    }
    cands_.push_back({c, time_bound(in_.model, c, in_.work, in_.machine, links, t)});
  }

  const SearchInput& in_;
  SearchResult& res_;
  const std::int64_t ranks_, blocks_, batch_;
  const double usable_;
  std::int64_t experts_ = 0;
  std::vector<Bounded> cands_;
};

}  // namespace

bool same_structure(const Config& a, const Config& b) {
  return a.dp == b.dp && a.tp == b.tp && a.pp == b.pp && a.ep == b.ep &&
         a.optimizer_shard == b.optimizer_shard && a.schedule == b.schedule;
}

SearchResult search(const SearchInput& in) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  SearchResult res;
  std::vector<Bounded> cands = Level1(in, res).enumerate();
  std::stable_sort(cands.begin(), cands.end(),
                   [](const Bounded& a, const Bounded& b) { return a.bound < b.bound; });
  detail::rank_by_level2(in, cands, res);
  res.stats.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return res;
}

}  // namespace hp::planner
