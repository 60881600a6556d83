// The baselines of `hp plan --compare` (those of the H2O paper, section 3): a DP x TP-only
// planner in the style of D-Rec, and an expert tuning one axis at a time. Both are searched with
// the same cost model and level 2 as hp's own plan, so the speedups measure what the restricted
// search spaces lose, not differences between models.
#include <algorithm>
#include <limits>

#include "hp/planner/planner.h"

namespace hp::planner {
namespace {

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> d;
  for (std::int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// One search restricted by `f`: the best plan it finds, if any.
std::optional<Plan> best_under(const SearchInput& in, const Fixed& f, std::int64_t& evaluated,
                               bool whole_heads = true) {
  SearchResult r = search({in.model, in.topo, in.work, in.machine, {1, f, whole_heads, false}});
  evaluated += r.stats.evaluated;
  if (r.plans.empty()) return std::nullopt;
  return std::move(r.plans.front());
}

Baseline dp_tp_only(const SearchInput& in) {
  Baseline b{"dp-tp-only",
             "DP x TP degrees (operator sharding: any tp) and micro-batch size; no pipeline, "
             "optimizer sharding or "
             "recomputation",
             {},
             0,
             0};
  Fixed f;
  f.pp = 1;
  f.optimizer_shard = 0;
  f.recompute = recipe::Recompute::none;
  f.sequence_parallel = false;
  b.plan = best_under(in, f, b.evaluated, false);
  return b;
}

Baseline greedy_expert(const SearchInput& in) {
  Baseline b{"greedy-expert",
             "one axis at a time: tp, pp, ZeRO level, micro-batch size, recompute policy",
             {},
             0,
             0};
  const std::int64_t N = in.topo.ranks(), B = in.work.global_batch;
  const auto L = static_cast<std::int64_t>(in.model.blocks.size());
  struct Point {
    std::int64_t tp = 1, pp = 1, mbs = 1;
    int zero = 3;
    recipe::Recompute rc = recipe::Recompute::full;
  } cur;
  if (!in.work.train) cur.zero = 0, cur.rc = recipe::Recompute::none;
  auto evaluate = [&](Point p) -> std::optional<Plan> {
    if (N % (p.tp * p.pp) != 0 || p.pp > L) return std::nullopt;
    const std::int64_t dp = N / p.tp / p.pp;
    if (B % dp != 0) return std::nullopt;
    if ((B / dp) % p.mbs != 0)
      p.mbs = 1;  // the held micro-batch size no longer divides: restart it
    Fixed f;
    f.tp = p.tp, f.pp = p.pp, f.dp = dp, f.micro_batch_size = p.mbs;
    f.optimizer_shard = dp > 1 ? p.zero : 0;
    f.recompute = p.rc;
    f.schedule = recipe::Schedule::one_f_one_b;
    f.virtual_stages = 1;
    return best_under(in, f, b.evaluated);
  };
  std::optional<Plan> best = evaluate(cur);
  auto better = [&](const std::optional<Plan>& x) {
    return x && (!best || x->predicted.iteration < best->predicted.iteration * (1 - 1e-12));
  };
  for (int round = 0; round < 4; ++round) {
    bool changed = false;
    auto tune = [&](auto values, auto set) {
      Point keep = cur;
      for (auto v : values) {
        Point p = cur;
        set(p, v);
        auto got = evaluate(p);
        if (better(got)) best = std::move(got), keep = p, changed = true;
      }
      cur = keep;
      if (best) cur.mbs = best->config.micro_batch_size;
    };
    tune(divisors(N), [](Point& p, std::int64_t v) { p.tp = v; });
    tune(divisors(N / cur.tp), [](Point& p, std::int64_t v) { p.pp = v; });
    if (in.work.train) tune(std::vector<int>{0, 1, 2, 3}, [](Point& p, int v) { p.zero = v; });
    tune(divisors(std::max<std::int64_t>(1, B / std::max<std::int64_t>(1, N / cur.tp / cur.pp))),
         [](Point& p, std::int64_t v) { p.mbs = v; });
    if (in.work.train)
      tune(std::vector<recipe::Recompute>{recipe::Recompute::none, recipe::Recompute::selective,
                                          recipe::Recompute::full},
           [](Point& p, recipe::Recompute v) { p.rc = v; });
    if (!changed) break;
  }
  b.plan = std::move(best);
  return b;
}

}  // namespace

std::vector<Baseline> run_baselines(const SearchInput& in, const Plan& best) {
  std::vector<Baseline> out = {dp_tp_only(in), greedy_expert(in)};
  for (auto& b : out)
    if (b.plan) b.speedup = b.plan->predicted.iteration / best.predicted.iteration - 1;
  return out;
}

}  // namespace hp::planner
