// Level 1 + level 2 against brute force (docs/planner.md, "The search"): on small instances,
// search() must return the same best iteration time as enumerating the whole space under the same
// cost model: every degree combination (tp, pp, dp, ep), every axis order, micro-batch size, ZeRO
// level and HSDP shard group (every DP sub-group on a faster tier than the whole DP group),
// sequence parallelism, schedule and virtual-stage count, every stage assignment (for interleaving,
// every split into pp * v chunks) and every recompute level of every block. The enumeration is
// written independently of search.cpp; it shares only the cost functions (stage_plan, predict,
// axis_links).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>

#include "hp/planner/planner.h"
#include "hp/recipe/presets.h"
#include "planner_test_util.h"

using namespace hp;
using namespace hp::planner;
using hp_test::a100;

namespace {

// `nodes` nodes of `per_node` A100s: two tiers, so axis placement matters.
topology::Topology small_cluster(std::int64_t nodes, std::int64_t per_node) {
  auto c = recipe::load_cluster_ref("dgx-a100", {}, recipe::preset_dirs({}, HP_SOURCE_DIR));
  REQUIRE(c);
  c->nodes = nodes;
  c->device_types[0].per_node = per_node;
  c->tiers[0].size = per_node;
  auto t = topology::Topology::from_cluster(*c);
  REQUIRE(t);
  return *t;
}

ModelProfile gpt(int layers, double s, double h, double vocab, std::int64_t experts) {
  ModelProfile m;
  m.seq = static_cast<std::int64_t>(s);
  m.hidden_bytes = 2 * s * h;
  m.heads = 8;
  for (int i = 0; i < layers; ++i) {
    BlockProfile b;
    b.parameters = 12 * h * h;
    b.fwd_flops = 24 * s * h * h + 4 * s * s * h;
    b.quadratic_flops = 4 * s * s * h;
    b.quadratic_act_bytes = 5 * 8 * s * s;
    b.act_bytes = 34 * s * h + b.quadratic_act_bytes;
    b.boundary_bytes = 2 * s * h;
    b.tp_collectives = 2;
    b.kernels = 20;
    b.heads = 8;
    if (experts > 0) {
      b.expert_parameters = 8 * h * h * static_cast<double>(experts);
      b.parameters += b.expert_parameters;
      b.experts = experts;
      b.top_k = 2;
    }
    m.blocks.push_back(b);
  }
  m.prologue.parameters = vocab * h;
  m.epilogue.parameters = vocab * h;
  m.epilogue.fwd_flops = 2 * s * h * vocab;
  m.epilogue.act_bytes = 2 * s * vocab;
  return m;
}

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> d;
  for (std::int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Every split of `n` items into `parts` non-empty contiguous runs.
void compositions(std::int64_t n, std::int64_t parts, std::vector<std::int64_t>& cur,
                  const std::function<void(const std::vector<std::int64_t>&)>& f) {
  if (parts == 1) {
    cur.push_back(n);
    f(cur);
    cur.pop_back();
    return;
  }
  for (std::int64_t a = 1; a <= n - parts + 1; ++a) {
    cur.push_back(a);
    compositions(n - a, parts - 1, cur, f);
    cur.pop_back();
  }
}

struct Brute {
  double best = std::numeric_limits<double>::infinity();
  std::int64_t plans = 0;
};

// The best over every stage assignment and recompute set of one level-1 configuration.
void all_assignments(const ModelProfile& m, const Config& c, const Workload& w, const Machine& mc,
                     const AxisLinks& links, Brute& out) {
  const auto L = static_cast<std::int64_t>(m.blocks.size());
  const std::int64_t chunks = c.pp * c.virtual_stages;
  std::vector<std::int64_t> cur;
  compositions(L, chunks, cur, [&](const std::vector<std::int64_t>& sizes) {
    std::vector<std::vector<std::int64_t>> per_rank(static_cast<std::size_t>(c.pp));
    std::int64_t next = 0;
    for (std::int64_t j = 0; j < chunks; ++j)
      for (std::int64_t i = 0; i < sizes[static_cast<std::size_t>(j)]; ++i)
        per_rank[static_cast<std::size_t>(j % c.pp)].push_back(next++);
    std::vector<recipe::Recompute> levels(static_cast<std::size_t>(L), recipe::Recompute::none);
    std::function<void(std::int64_t)> rec = [&](std::int64_t b) {
      if (b == L || !w.train) {
        std::vector<StagePlan> stages;
        std::int64_t at = 0;
        for (std::int64_t k = 0; k < c.pp; ++k) {
          const auto& blocks = per_rank[static_cast<std::size_t>(k)];
          std::vector<recipe::Recompute> rc;
          for (std::size_t i = 0; i < blocks.size(); ++i)
            rc.push_back(levels[static_cast<std::size_t>(at++)]);
          stages.push_back(stage_plan(m, c, w, mc, links, k, blocks, rc));
          if (!stages.back().feasible) return;
        }
        ++out.plans;
        out.best = std::min(out.best, predict(m, c, w, mc, links, stages).iteration);
        return;
      }
      for (auto r :
           {recipe::Recompute::none, recipe::Recompute::selective, recipe::Recompute::full}) {
        levels[static_cast<std::size_t>(b)] = r;
        rec(b + 1);
      }
      levels[static_cast<std::size_t>(b)] = recipe::Recompute::none;
    };
    // levels are indexed in rank order (rank 0's blocks first), which covers every set as well.
    rec(0);
  });
}

Brute brute_force(const ModelProfile& m, const topology::Topology& topo, const Workload& w,
                  const Machine& mc) {
  Brute out;
  const std::int64_t N = topo.ranks(), L = static_cast<std::int64_t>(m.blocks.size()),
                     B = w.global_batch;
  std::int64_t experts = 0;
  for (const auto& b : m.blocks) experts = std::max(experts, b.experts);
  const Axis orders[6][3] = {{Axis::tp, Axis::dp, Axis::pp}, {Axis::tp, Axis::pp, Axis::dp},
                             {Axis::dp, Axis::tp, Axis::pp}, {Axis::pp, Axis::tp, Axis::dp},
                             {Axis::dp, Axis::pp, Axis::tp}, {Axis::pp, Axis::dp, Axis::tp}};
  for (std::int64_t tp : divisors(N))
    for (std::int64_t pp : divisors(N / tp)) {
      const std::int64_t dp = N / tp / pp;
      if (pp > L || B % dp != 0 || m.heads % tp != 0) continue;
      for (std::int64_t ep : divisors(dp)) {
        if (ep > 1 && (experts == 0 || experts % ep != 0)) continue;
        for (const auto& order : orders)
          for (std::int64_t mbs : divisors(B / dp))
            for (int sp = 0; sp <= (tp > 1); ++sp)
              for (int zero = 0; zero <= (w.train && dp > 1 ? 3 : 0); ++zero)
                for (std::int64_t group : divisors(dp))  // HSDP shard group (dp = plain ZeRO)
                  for (std::int64_t v = 1; pp * v <= L; ++v)
                    for (int sched = 0; sched < 4; ++sched) {
                      Config c;
                      c.tp = tp, c.pp = pp, c.dp = dp, c.ep = ep;
                      std::copy(order, order + 3, c.order);
                      c.micro_batch_size = mbs, c.micro_batches = B / dp / mbs;
                      c.sequence_parallel = sp == 1;
                      c.optimizer_shard = zero;
                      c.shard_group = group == dp ? 0 : group;
                      c.virtual_stages = v;
                      c.schedule = sched == 0   ? recipe::Schedule::one_f_one_b
                                   : sched == 1 ? recipe::Schedule::gpipe
                                   : sched == 2 ? recipe::Schedule::interleaved
                                                : recipe::Schedule::zb_h1;
                      if ((v > 1) != (sched == 2)) continue;
                      if (pp == 1 && sched != 0) continue;   // one stage: no pipeline schedule
                      if (!w.train && sched != 0) continue;  // inference: forward only
                      if (v > 1 && c.micro_batches % pp != 0)
                        continue;  // Megatron's interleaving rule
                      if (group < dp && (zero == 0 || group == 1)) continue;
                      auto links = axis_links(topo, c);
                      REQUIRE(links);
                      // HSDP groups live on a faster tier than the whole DP group (else it is plain
                      // ZeRO).
                      if (group < dp && links->shard.level >= links->dp.level) continue;
                      all_assignments(m, c, w, mc, *links, out);
                    }
      }
    }
  return out;
}

void check_same_optimum(const ModelProfile& m, const topology::Topology& topo, const Workload& w,
                        double memory) {
  const Machine mc = a100(memory);
  const SearchResult r = search({m, topo, w, mc, {1, {}}});
  const Brute b = brute_force(m, topo, w, mc);
  INFO("memory " << memory << ", brute-force plans " << b.plans << ", best " << b.best);
  if (!std::isfinite(b.best)) {
    CHECK(r.plans.empty());
    return;
  }
  REQUIRE(!r.plans.empty());
  CHECK(r.plans.front().predicted.iteration == Approx(b.best).epsilon(1e-9));
  CHECK(r.plans.front().predicted.iteration >=
        b.best * (1 - 1e-12));  // never better than the true optimum
}

}  // namespace

TEST_CASE("planner: level 1 + level 2 find the brute-force optimum (dense, 4 ranks on 2 nodes)",
          "[planner]") {
  const auto topo = small_cluster(2, 2);
  const ModelProfile m = gpt(4, 512, 1024, 8000, 0);
  Workload w;
  w.global_batch = 8;
  // From roomy (no recompute, any layout) to tight (recompute and ZeRO decide what fits) to nothing
  // fits.
  for (double gib : {16.0, 0.9, 0.6, 0.45, 0.3, 0.05})
    check_same_optimum(m, topo, w, gib * (1 << 30));
}

TEST_CASE("planner: level 1 + level 2 find the brute-force optimum (6 blocks, interleaving)",
          "[planner]") {
  const auto topo = small_cluster(1, 2);
  const ModelProfile m = gpt(6, 512, 1024, 8000, 0);
  Workload w;
  w.global_batch = 4;
  for (double gib : {16.0, 0.8, 0.5}) check_same_optimum(m, topo, w, gib * (1 << 30));
}

TEST_CASE("planner: level 1 + level 2 find the brute-force optimum (MoE with expert parallelism)",
          "[planner]") {
  const auto topo = small_cluster(2, 2);
  const ModelProfile m = gpt(3, 256, 512, 4000, 4);
  Workload w;
  w.global_batch = 8;
  for (double gib : {16.0, 0.5, 0.25}) check_same_optimum(m, topo, w, gib * (1 << 30));
}

TEST_CASE("planner: level 1 + level 2 find the brute-force optimum (inference)", "[planner]") {
  const auto topo = small_cluster(2, 2);
  const ModelProfile m = gpt(4, 512, 1024, 8000, 0);
  Workload w;
  w.global_batch = 8;
  w.train = false;
  for (double gib : {16.0, 0.1}) check_same_optimum(m, topo, w, gib * (1 << 30));
}
