// Level 2 of the planner's search over the level-1 candidates (search.cpp) in order of their time
// bound: stage assignment and recomputation for each (assign_stages.cpp), the top k and the best
// plan of each of the fastest structures kept, and the visit stopped as soon as the bound shows no
// later candidate can enter either list (docs/planner.md).
#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "search_internal.h"
#include "stage.h"

namespace hp::planner::detail {
namespace {

// A candidate level 2 cannot fit: the even split's worst rank is its need, for the report of why
// nothing fits.
void note_even_split(const SearchInput& in, const Config& c, const AxisLinks& links,
                     Shortfall& shortfall) {
  const ModelProfile& m = in.model;
  const CostTable table = cost_table(m, c, in.work, in.machine, links);
  const StageContext ctx{m, c, in.work, in.machine, links, table};
  StagePlan worst;
  const std::int64_t nb = static_cast<std::int64_t>(m.blocks.size());
  for (std::int64_t s = 0; s < c.pp; ++s) {
    auto sp = evaluate_stage(ctx, s, block_range(s * nb / c.pp, (s + 1) * nb / c.pp));
    if (sp.memory > worst.memory) worst = sp;
  }
  note_shortfall(shortfall, worst.memory, worst.states, worst.activations, c);
}

// Whether `a` should replace `b` among plans of one kind: faster, or as fast (to 1e-12) and needing
// less memory (the best time must be exact; candidates arrive in a fixed order, so ties are
// stable).
bool better(const Plan& a, const Plan& b) {
  const double dt = a.predicted.iteration - b.predicted.iteration;
  const bool tie = std::abs(dt) <= 1e-12 * a.predicted.iteration;
  return tie ? a.predicted.peak_memory < b.predicted.peak_memory : dt < 0;
}

// Adds `plan` to the top k, best first. Equivalent plans (same degrees, micro-batching and
// schedule, the same predicted time to 1e-6: a ZeRO level, SP or placement that changes nothing
// that matters) would fill the top k with one choice, so only one of them is kept.
void keep_distinct(std::vector<Plan>& plans, SearchStats& stats, Plan plan, std::size_t k) {
  const Config& c = plan.config;
  auto same = std::find_if(plans.begin(), plans.end(), [&](const Plan& q) {
    const Config& a = q.config;
    return a.dp == c.dp && a.tp == c.tp && a.pp == c.pp && a.ep == c.ep &&
           a.micro_batch_size == c.micro_batch_size && a.schedule == c.schedule &&
           a.virtual_stages == c.virtual_stages &&
           std::abs(q.predicted.iteration - plan.predicted.iteration) <=
               1e-6 * plan.predicted.iteration;
  });
  if (same != plans.end()) {
    ++stats.duplicates;
    // The faster stays (the best time must be exact); on a tie, the one needing less memory.
    if (!better(plan, *same)) return;
    plans.erase(same);
  }
  auto at = std::upper_bound(plans.begin(), plans.end(), plan.predicted.iteration,
                             [](double t, const Plan& p) { return t < p.predicted.iteration; });
  plans.insert(at, std::move(plan));
  if (plans.size() > k) plans.pop_back();
}

// The structures among the level-1 candidates (at most `cap` are counted): when fewer structures
// than the alternatives list holds survive level 1, the list is full at that many.
std::size_t count_structures(const std::vector<Bounded>& cands, std::size_t cap) {
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, int>> seen;
  for (const auto& b : cands) {
    const Config& c = b.config;
    seen.insert({c.dp, c.tp, c.pp, c.ep, c.optimizer_shard, static_cast<int>(c.schedule)});
    if (seen.size() >= cap) break;
  }
  return seen.size();
}

// What level 2 has found so far: the top k plans and, alongside, the best plan of each of the
// fastest structures (same_structure), so that `hp plan --top-k` can show structurally different
// alternatives rather than k refinements of one structure. A candidate is worth level 2 only if it
// could enter either list:
//   - the top list while its bound is below the k-th best time (or the list is not full);
//   - the structure list while its bound is below its structure's best time so far, and, once the
//     list is full, below the worst listed structure's time (a new structure would have to beat
//     it).
// Candidates come in bound order, so once neither list can take the current one, none later can.
// The top list keeps at least two plans, so the why line always knows the runner-up.
class Ranking {
 public:
  Ranking(std::size_t k, std::size_t structures) : k_(k), cap_(structures) {}

  // No later candidate (their bounds are at least `bound`) can enter either list.
  bool exhausted(double bound) const {
    return top_full(bound) &&
           (cap_ == 0 || (alts_.size() >= cap_ && bound >= alts_.back().predicted.iteration));
  }
  // This candidate cannot enter either list (its structure already has a plan at most `bound`).
  bool cannot_enter(const Config& c, double bound) const {
    if (!top_full(bound)) return false;
    if (cap_ == 0) return true;
    auto it = std::find_if(alts_.begin(), alts_.end(),
                           [&](const Plan& p) { return same_structure(p.config, c); });
    return it != alts_.end() && bound >= it->predicted.iteration;
  }

  void add(const Plan& plan, SearchStats& stats) {
    if (cap_ > 0) {
      auto it = std::find_if(alts_.begin(), alts_.end(),
                             [&](const Plan& p) { return same_structure(p.config, plan.config); });
      if (it == alts_.end() || better(plan, *it)) {
        if (it != alts_.end()) alts_.erase(it);
        auto at =
            std::upper_bound(alts_.begin(), alts_.end(), plan.predicted.iteration,
                             [](double t, const Plan& p) { return t < p.predicted.iteration; });
        alts_.insert(at, plan);
        if (alts_.size() > cap_) alts_.pop_back();
      }
    }
    keep_distinct(top_, stats, plan, k_);
  }

  // The reported order: the best; the best plan of each other structure, fastest first; then the
  // remaining top plans (refinements of listed structures); at most `k` rows.
  void finish(SearchResult& res, std::size_t k) {
    if (top_.empty()) return;
    if (top_.size() > 1) res.runner_up = top_[1];
    for (const auto& a : alts_)
      if (!same_structure(a.config, top_.front().config)) {
        res.rival = a;
        break;
      }
    std::vector<Plan> out = {top_.front()};
    for (const auto& a : alts_)
      if (!same_structure(a.config, top_.front().config)) out.push_back(a);
    for (std::size_t i = 1; i < top_.size(); ++i)
      if (std::none_of(out.begin(), out.end(),
                       [&](const Plan& p) { return same_plan(p, top_[i]); }))
        out.push_back(top_[i]);
    if (out.size() > k) out.resize(k);
    res.plans = std::move(out);
  }

 private:
  bool top_full(double bound) const {
    return top_.size() >= k_ && bound >= top_.back().predicted.iteration;
  }
  // The same plan in both lists (copies): same structure, refinements and time.
  static bool same_plan(const Plan& a, const Plan& b) {
    const Config &x = a.config, &y = b.config;
    return same_structure(x, y) && x.micro_batch_size == y.micro_batch_size &&
           x.virtual_stages == y.virtual_stages && x.sequence_parallel == y.sequence_parallel &&
           x.shard_group == y.shard_group && std::equal(x.order, x.order + 3, y.order) &&
           a.predicted.iteration == b.predicted.iteration;
  }

  const std::size_t k_, cap_;
  std::vector<Plan> top_, alts_;
};

}  // namespace

void rank_by_level2(const SearchInput& in, const std::vector<Bounded>& cands, SearchResult& res) {
  const ModelProfile& m = in.model;
  const std::size_t k = static_cast<std::size_t>(std::max<std::int64_t>(1, in.limits.top_k));
  const std::size_t alts =
      in.limits.alternatives
          ? count_structures(cands,
                             std::max<std::size_t>(2, std::min<std::size_t>(k, kMaxAlternatives)))
          : 0;
  Ranking rank(alts > 0 ? std::max<std::size_t>(k, 2) : k, alts);
  for (std::size_t i = 0; i < cands.size(); ++i) {
    if (rank.exhausted(cands[i].bound)) {
      res.stats.pruned_time += static_cast<std::int64_t>(cands.size() - i);
      break;
    }
    const Config& c = cands[i].config;
    if (rank.cannot_enter(c, cands[i].bound)) {
      ++res.stats.pruned_time;
      continue;
    }
    auto links = axis_links(in.topo, c);
    if (!links) continue;
    ++res.stats.level2;
    auto stages = assign_stages(m, c, in.work, in.machine, *links);
    if (stages.empty()) {
      ++res.stats.level2_infeasible;
      note_even_split(in, c, *links, res.shortfall);
      continue;
    }
    Plan plan{c, std::move(stages), {}, *links};
    plan.predicted = predict(m, c, in.work, in.machine, *links, plan.stages);
    rank.add(plan, res.stats);
  }
  rank.finish(res, k);
}

}  // namespace hp::planner::detail
