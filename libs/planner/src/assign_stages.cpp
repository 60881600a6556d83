// Level 2 of the H2O planner's search (docs/planner.md, "The search"): the blocks split into stages
// and per-block recomputation for one level-1 configuration.
//
// Level 2 (assign_stages) splits the blocks into pp contiguous stages, unevenly where that helps,
// and picks per-block recomputation. It minimises the slowest stage (the term multiplied by m) by
// binary search on a time threshold T: a greedy pass packs as many blocks into each stage as fit
// under T and the stage's memory, recomputing where needed; with per-stage costs monotone in the
// block set, maximal packing succeeds iff some partition meets T. Interleaved schedules use an even
// split into pp * v chunks (rank k holds chunks k, k+pp, ...), with recomputation still chosen per
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include "hp/planner/planner.h"
#include "pricing.h"
#include "stage.h"

namespace hp::planner {

std::vector<std::int64_t> block_range(std::int64_t a, std::int64_t b) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

namespace {

// A level-2 result in the making: the blocks of every pipeline rank and the slowest rank's time.
struct Packing {
  std::vector<std::vector<std::int64_t>> blocks;
  double tmax = 0;
};

// Stage feasibility and time of (rank k, blocks [i, j)), memoised: the threshold search asks the
// same ranges again and again.
class RangeCosts {
 public:
  explicit RangeCosts(const StageContext& ctx)
      : ctx_(ctx), L_(static_cast<std::uint64_t>(ctx.model.blocks.size()) + 1) {}
  std::pair<bool, double> operator()(std::int64_t k, std::int64_t i, std::int64_t j) {
    const std::uint64_t key =
        (static_cast<std::uint64_t>(k) * L_ + static_cast<std::uint64_t>(i)) * L_ +
        static_cast<std::uint64_t>(j);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    const StagePlan s = evaluate_stage(ctx_, k, block_range(i, j));
    return memo_[key] = {s.feasible, s.time};
  }

 private:
  const StageContext& ctx_;
  std::uint64_t L_;
  std::unordered_map<std::uint64_t, std::pair<bool, double>> memo_;
};

// The same for the interleaved packing, keyed by rank and block list: the threshold search lays out
// the same ranks again and again.
class LayoutCosts {
 public:
  explicit LayoutCosts(const StageContext& ctx) : ctx_(ctx) {}
  std::pair<bool, double> operator()(std::int64_t k, std::vector<std::int64_t> blocks) {
    auto key = std::make_pair(k, std::move(blocks));
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    const StagePlan s = evaluate_stage(ctx_, k, key.second);
    return memo_[std::move(key)] = {s.feasible, s.time};
  }

 private:
  const StageContext& ctx_;
  std::map<std::pair<std::int64_t, std::vector<std::int64_t>>, std::pair<bool, double>> memo_;
};

// Greedy maximal packing under threshold t: each rank takes the longest run of blocks that fits
// and meets t (found by bisection: a rank's cost grows with its blocks); nullopt when some rank
// cannot. With costs monotone in the block set this succeeds iff some contiguous assignment does.
std::optional<Packing> pack(const StageContext& ctx, RangeCosts& cost, LayoutCosts&, double t) {
  const std::int64_t L = static_cast<std::int64_t>(ctx.model.blocks.size());
  const std::int64_t p = ctx.config.pp;
  auto ok = [&](std::int64_t k, std::int64_t i, std::int64_t j) {
    auto [feasible, time] = cost(k, i, j);
    return feasible && time <= t;
  };
  Packing out;
  std::int64_t i = 0;
  for (std::int64_t k = 0; k < p; ++k) {
    std::int64_t j = L;
    if (k < p - 1) {
      if (!ok(k, i, i + 1)) return std::nullopt;
      std::int64_t lo = i + 1, hi = L - (p - k - 1);
      while (lo < hi) {
        const std::int64_t mid = (lo + hi + 1) / 2;
        if (ok(k, i, mid))
          lo = mid;
        else
          hi = mid - 1;
      }
      j = lo;
    } else if (!ok(k, i, L)) {
      return std::nullopt;
    }
    out.tmax = std::max(out.tmax, cost(k, i, j).second);
    out.blocks.push_back(block_range(i, j));
    i = j;
  }
  return out;
}

// Rank k's blocks alone under the same layout (the trial packings ask for one rank at a time).
std::vector<std::int64_t> interleaved_rank(const std::vector<std::int64_t>& counts, std::int64_t v,
                                           std::int64_t k) {
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(counts[static_cast<std::size_t>(k)]));
  std::int64_t next = 0;
  for (std::int64_t round = 0; round < v; ++round)
    for (std::size_t r = 0; r < counts.size(); ++r) {
      const std::int64_t a = counts[r];
      const std::int64_t size = a / v + (round < a % v ? 1 : 0);
      if (static_cast<std::int64_t>(r) == k)
        for (std::int64_t i = 0; i < size; ++i) out.push_back(next + i);
      next += size;
    }
  return out;
}

// Interleaved level 2: blocks per rank chosen like pack() (greedy maximal counts under threshold t,
// at least v per rank so no chunk is empty); the ranks still to come are assumed even while a rank
// is sized, and the final layout is evaluated as laid out.
std::optional<Packing> pack_interleaved(const StageContext& ctx, RangeCosts&, LayoutCosts& cost,
                                        double t) {
  const std::int64_t L = static_cast<std::int64_t>(ctx.model.blocks.size());
  const std::int64_t p = ctx.config.pp, v = ctx.config.virtual_stages;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(p), v);
  std::int64_t used = 0;
  auto ok = [&](std::int64_t k, std::int64_t a) {
    std::vector<std::int64_t> cs = counts;
    cs[static_cast<std::size_t>(k)] = a;
    const std::int64_t rest = p - k - 1, left = L - used - a;
    for (std::int64_t r = k + 1; r < p; ++r)
      cs[static_cast<std::size_t>(r)] = left / rest + (r - k - 1 < left % rest ? 1 : 0);
    const auto [feasible, time] = cost(k, interleaved_rank(cs, v, k));
    return feasible && time <= t;
  };
  for (std::int64_t k = 0; k < p - 1; ++k) {
    if (!ok(k, v)) return std::nullopt;
    std::int64_t lo = v, hi = L - used - v * (p - k - 1);
    while (lo < hi) {
      const std::int64_t mid = (lo + hi + 1) / 2;
      if (ok(k, mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    counts[static_cast<std::size_t>(k)] = lo;
    used += lo;
  }
  counts[static_cast<std::size_t>(p - 1)] = L - used;
  Packing out{interleaved_layout(counts, v), 0};
  for (std::int64_t k = 0; k < p; ++k) {
    const auto [feasible, time] = cost(k, out.blocks[static_cast<std::size_t>(k)]);
    if (!feasible || time > t) return std::nullopt;
    out.tmax = std::max(out.tmax, time);
  }
  return out;
}

}  // namespace

std::vector<std::vector<std::int64_t>> interleaved_layout(const std::vector<std::int64_t>& counts,
                                                          std::int64_t v) {
  const auto pp = static_cast<std::int64_t>(counts.size());
  std::vector<std::vector<std::int64_t>> per_rank(counts.size());
  std::int64_t next = 0;
  for (std::int64_t round = 0; round < v; ++round)
    for (std::int64_t k = 0; k < pp; ++k) {
      const std::int64_t a = counts[static_cast<std::size_t>(k)];
      const std::int64_t size = a / v + (round < a % v ? 1 : 0);
      for (std::int64_t i = 0; i < size; ++i)
        per_rank[static_cast<std::size_t>(k)].push_back(next++);
    }
  return per_rank;
}

std::vector<StagePlan> assign_stages(const ModelProfile& m, const Config& c, const Workload& w,
                                     const Machine& mc, const AxisLinks& links) {
  const CostTable table = cost_table(m, c, w, mc, links);
  const StageContext ctx{m, c, w, mc, links, table};
  if (c.pp == 1) {
    auto s = evaluate_stage(ctx, 0, block_range(0, static_cast<std::int64_t>(m.blocks.size())));
    if (!s.feasible) return {};
    return {s};
  }
  RangeCosts cost(ctx);
  LayoutCosts layouts(ctx);
  const auto packer = c.virtual_stages > 1 ? pack_interleaved : pack;
  auto best = packer(ctx, cost, layouts, std::numeric_limits<double>::infinity());
  if (!best) return {};
  // Minimise the slowest rank: bisect the threshold, then finish exactly (stage times take finitely
  // many values, so step just below the best maximum until no packing meets it).
  double lo = best->tmax / static_cast<double>(c.pp) / 4;
  for (int it = 0; it < 24 && best->tmax - lo > 1e-4 * best->tmax; ++it) {
    const double mid = 0.5 * (lo + best->tmax);
    if (auto got = packer(ctx, cost, layouts, mid))
      best = std::move(got);
    else
      lo = mid;
  }
  for (int it = 0; it < 64; ++it) {
    auto got = packer(ctx, cost, layouts, best->tmax * (1 - 1e-12));
    if (!got) break;
    best = std::move(got);
  }
  std::vector<StagePlan> out;
  for (std::int64_t k = 0; k < c.pp; ++k)
    out.push_back(evaluate_stage(ctx, k, best->blocks[static_cast<std::size_t>(k)]));
  return out;
}

StagePlan stage_plan(const ModelProfile& m, const Config& c, const Workload& w, const Machine& mc,
                     const AxisLinks& links, std::int64_t stage, std::vector<std::int64_t> blocks,
                     std::vector<recipe::Recompute> recompute) {
  const CostTable table = cost_table(m, c, w, mc, links);
  const StageContext ctx{m, c, w, mc, links, table};
  return cost_stage(ctx, stage, std::move(blocks), std::move(recompute));
}

}  // namespace hp::planner
