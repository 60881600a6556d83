// The two-level search (H2O, reference/planner.md §1).
//
// Level 1 enumerates every configuration of N ranks: tp * pp * dp = N (pp at most the block count),
// each micro-batch size dividing the per-replica batch (the micro-batch count follows), ZeRO level
// 0..3 over the DP group, sequence parallelism when tp > 1, the schedule (GPipe, 1F1B, interleaved
// with v virtual stages) and the placement of the three axes onto ranks (all 6 orders; orders that
// give every axis the same topology tier are one candidate). Nothing is ruled out by a fixed rule
// such as "TP inside the node": a TP group across nodes simply costs what the scale-out tier makes it
// cost.
//
// Each configuration gets two bounds from its cost table without assigning stages:
//   memory: model states / pp + the margin must fit (the busiest rank holds at least the average);
//   time:   m t + (p-1) t / v with t = the per-rank average micro-batch time without recomputation,
//           plus post-flush collectives and the optimizer step on the average rank's parameters.
// The time bound is a true lower bound of predict(): recomputation and imbalance only add to it.
// Candidates are visited in order of that bound, and the visit stops as soon as the bound reaches
// the k-th best predicted time: no later candidate can enter the top k (branch and bound).
//
// Level 2 (assign_stages) splits the blocks into pp contiguous stages, unevenly where that helps, and
// picks per-block recomputation. It minimises the slowest stage (the term multiplied by m) by binary
// search on a time threshold T: a greedy pass packs as many blocks into each stage as fit under T
// and the stage's memory, recomputing where needed; with per-stage costs monotone in the block set,
// maximal packing succeeds iff some partition meets T. Interleaved schedules use an even split into
// pp * v chunks (rank k holds chunks k, k+pp, ...), with recomputation still chosen per block.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "hp/planner/planner.h"
#include "hp/topology/collectives.h"
#include "stage.h"

namespace hp::planner {
namespace {

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

std::vector<StagePlan> interleaved_split(const StageContext& ctx) {
  const Config& c = ctx.config;
  const std::int64_t L = static_cast<std::int64_t>(ctx.model.blocks.size());
  const std::int64_t chunks = c.pp * c.virtual_stages;
  std::vector<std::vector<std::int64_t>> per_rank(static_cast<std::size_t>(c.pp));
  for (std::int64_t j = 0; j < chunks; ++j)
    for (std::int64_t b = j * L / chunks; b < (j + 1) * L / chunks; ++b)
      per_rank[static_cast<std::size_t>(j % c.pp)].push_back(b);
  std::vector<StagePlan> out;
  for (std::int64_t k = 0; k < c.pp; ++k) out.push_back(evaluate_stage(ctx, k, per_rank[static_cast<std::size_t>(k)]));
  return out;
}

std::vector<std::int64_t> range(std::int64_t a, std::int64_t b) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

// Greedy maximal packing under threshold t; empty when some stage cannot meet it.
std::vector<StagePlan> pack(const StageContext& ctx, double t) {
  const std::int64_t L = static_cast<std::int64_t>(ctx.model.blocks.size());
  const std::int64_t p = ctx.config.pp;
  std::vector<StagePlan> out;
  std::int64_t i = 0;
  for (std::int64_t k = 0; k < p; ++k) {
    const std::int64_t max_end = L - (p - k - 1);
    std::int64_t j = k == p - 1 ? L : i + 1;
    StagePlan s = evaluate_stage(ctx, k, range(i, j));
    if (!s.feasible || s.time > t) return {};
    while (j < max_end) {
      StagePlan next = evaluate_stage(ctx, k, range(i, j + 1));
      if (!next.feasible || next.time > t) break;
      s = std::move(next);
      ++j;
    }
    out.push_back(std::move(s));
    i = j;
  }
  return out;
}

}  // namespace

std::vector<StagePlan> assign_stages(const ModelProfile& m, const Config& c, const Workload& w,
                                     const Machine& mc, const AxisLinks& links) {
  const CostTable table = cost_table(m, c, w, mc, links);
  const StageContext ctx{m, c, w, mc, links, table};
  if (c.pp == 1) {
    auto s = evaluate_stage(ctx, 0, range(0, static_cast<std::int64_t>(m.blocks.size())));
    if (!s.feasible) return {};
    return {s};
  }
  if (c.virtual_stages > 1) {
    auto out = interleaved_split(ctx);
    for (const auto& s : out)
      if (!s.feasible) return {};
    return out;
  }
  double hi = std::numeric_limits<double>::max() / 4;
  auto best = pack(ctx, hi);
  if (best.empty()) return {};
  hi = 0;
  for (const auto& s : best) hi = std::max(hi, s.time);
  double lo = hi / static_cast<double>(c.pp) / 4;
  for (int it = 0; it < 24 && hi - lo > 1e-4 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    auto got = pack(ctx, mid);
    if (got.empty()) {
      lo = mid;
    } else {
      hi = 0;
      for (const auto& s : got) hi = std::max(hi, s.time);
      best = std::move(got);
    }
  }
  return best;
}

namespace {

struct Candidate {
  Config config;
  double bound = 0;
};

// Per-rank average micro-batch time and parameters of a cost table: the inputs to the bounds.
struct Totals {
  double time = 0, params = 0, states = 0;
};

Totals totals(const ModelProfile& m, const CostTable& t, const Config& c) {
  Totals s;
  auto add = [&](const BlockCost& b, const BlockProfile& p) {
    s.time += b.fwd + b.bwd + b.tp_comm;
    s.params += p.parameters / static_cast<double>(c.tp);
    s.states += b.state_bytes;
  };
  add(t.prologue, m.prologue);
  add(t.epilogue, m.epilogue);
  for (std::size_t i = 0; i < m.blocks.size(); ++i) add(t.blocks[i], m.blocks[i]);
  return s;
}

// The time lower bound of a configuration (see the essay): predict() on one balanced stage.
double time_bound(const ModelProfile& m, const Config& c, const Workload& w, const Machine& mc,
                  const AxisLinks& links, const Totals& t) {
  const double pp = static_cast<double>(c.pp);
  const double avg = t.time / pp;
  const double mbs = static_cast<double>(c.micro_batches);
  const double v = static_cast<double>(c.virtual_stages);
  double bound = mbs * avg + (pp - 1.0) * avg / v;
  if (w.train) {
    const double params = t.params / pp;
    const double grads = params * w.grad_bytes;
    if (c.optimizer_shard == 0)
      bound += topology::all_reduce_time(links.dp, c.dp, grads) * (1.0 - mc.cal.overlap_dp);
    else
      bound += topology::reduce_scatter_time(links.dp, c.dp, grads) * (1.0 - mc.cal.overlap_dp);
  }
  return bound;
}

void note_shortfall(Shortfall& sf, double need, double states, double acts, const Config& c) {
  if (sf.need == 0 || need < sf.need) sf = {need, states, acts, c};
}

}  // namespace

SearchResult search(const SearchInput& in) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  SearchResult res;
  const ModelProfile& m = in.model;
  const Workload& w = in.work;
  const Machine& mc = in.machine;
  const std::int64_t N = in.topo.ranks();
  const std::int64_t L = std::max<std::int64_t>(1, static_cast<std::int64_t>(m.blocks.size()));
  const std::int64_t B = w.global_batch;
  const double margin = mc.cal.transient_margin * mc.memory;
  const Fixed& fixed = in.limits.fixed;

  std::vector<Candidate> cands;
  for (std::int64_t tp : divisors(N)) {
    if (fixed.tp && *fixed.tp != tp) continue;
    for (std::int64_t pp : divisors(N / tp)) {
      if (pp > L || (fixed.pp && *fixed.pp != pp)) continue;
      const std::int64_t dp = N / tp / pp;
      if (B % dp != 0 || (fixed.dp && *fixed.dp != dp)) continue;
      std::set<std::tuple<int, int, int>> seen_links;
      Axis orders[6][3] = {{Axis::tp, Axis::dp, Axis::pp}, {Axis::tp, Axis::pp, Axis::dp},
                           {Axis::dp, Axis::tp, Axis::pp}, {Axis::pp, Axis::tp, Axis::dp},
                           {Axis::dp, Axis::pp, Axis::tp}, {Axis::pp, Axis::dp, Axis::tp}};
      for (auto& order : orders) {
        Config base;
        base.tp = tp, base.pp = pp, base.dp = dp;
        if (fixed.recompute) base.forced_recompute = static_cast<int>(*fixed.recompute);
        std::copy(order, order + 3, base.order);
        auto links = axis_links(in.topo, base);
        if (!links) continue;
        if (!seen_links.insert({links->tp.level, links->dp.level, links->pp.level}).second) continue;
        for (std::int64_t mbs : divisors(B / dp)) {
          for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
            Config c = base;
            c.micro_batch_size = mbs;
            c.micro_batches = B / dp / mbs;
            c.sequence_parallel = sp == 1;
            // Times do not depend on the ZeRO level: one table serves all four, states rescaled.
            const CostTable table = cost_table(m, c, w, mc, *links);
            Totals t = totals(m, table, c);
            for (int zero = 0; zero <= (w.train && dp > 1 ? 3 : 0); ++zero) {
              c.optimizer_shard = zero;
              t.states = t.params * state_bytes_per_param(w, m.dtype_bytes, zero, zero > 0 ? dp : 1);
              std::vector<std::pair<recipe::Schedule, std::int64_t>> scheds = {{recipe::Schedule::one_f_one_b, 1}};
              if (pp > 1 && w.train) {
                scheds.push_back({recipe::Schedule::gpipe, 1});
                std::vector<std::int64_t> vs = {2, 3, 4, 6, 8};
                if (fixed.virtual_stages) vs = {*fixed.virtual_stages};
                for (std::int64_t v : vs)
                  if (v > 1 && pp * v <= L && c.micro_batches % pp == 0) scheds.push_back({recipe::Schedule::interleaved, v});
              }
              for (auto [sched, v] : scheds) {
                c.schedule = sched;
                c.virtual_stages = v;
                if (!fixed.admits(c)) continue;
                ++res.stats.evaluated;
                const double mem_bound = t.states / static_cast<double>(pp) + margin;
                if (mem_bound > mc.memory) {
                  ++res.stats.pruned_memory;
                  note_shortfall(res.shortfall, mem_bound, t.states / static_cast<double>(pp), 0, c);
                  continue;
                }
                cands.push_back({c, time_bound(m, c, w, mc, *links, t)});
              }
            }
          }
        }
      }
    }
  }
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) { return a.bound < b.bound; });

  const std::size_t k = static_cast<std::size_t>(std::max<std::int64_t>(1, in.limits.top_k));
  for (std::size_t i = 0; i < cands.size(); ++i) {
    if (res.plans.size() >= k && cands[i].bound >= res.plans.back().predicted.iteration) {
      res.stats.pruned_time += static_cast<std::int64_t>(cands.size() - i);
      break;
    }
    const Config& c = cands[i].config;
    auto links = axis_links(in.topo, c);
    if (!links) continue;
    ++res.stats.level2;
    auto stages = assign_stages(m, c, w, mc, *links);
    if (stages.empty()) {
      ++res.stats.level2_infeasible;
      // The uneven packing failed: report the even split's worst rank as this candidate's need.
      const CostTable table = cost_table(m, c, w, mc, *links);
      const StageContext ctx{m, c, w, mc, *links, table};
      StagePlan worst;
      const std::int64_t nb = static_cast<std::int64_t>(m.blocks.size());
      for (std::int64_t s = 0; s < c.pp; ++s) {
        auto sp = evaluate_stage(ctx, s, range(s * nb / c.pp, (s + 1) * nb / c.pp));
        if (sp.memory > worst.memory) worst = sp;
      }
      note_shortfall(res.shortfall, worst.memory, worst.states, worst.activations, c);
      continue;
    }
    Plan plan{c, std::move(stages), {}, *links};
    plan.predicted = predict(m, c, w, mc, *links, plan.stages);
    auto at = std::upper_bound(res.plans.begin(), res.plans.end(), plan.predicted.iteration,
                               [](double t, const Plan& p) { return t < p.predicted.iteration; });
    res.plans.insert(at, std::move(plan));
    if (res.plans.size() > k) res.plans.pop_back();
  }
  res.stats.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return res;
}

}  // namespace hp::planner
