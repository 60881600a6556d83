// `hp plan --top-k` lists structurally different plans first (search.cpp's Ranking), and the why
// line compares the best with the best plan of another structure (planner.cpp's explain). A plan's
// structure is (dp, tp, pp, ep, ZeRO level, schedule); the rest refines one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <tuple>

#include "hp/planner/planner.h"
#include "hp/recipe/presets.h"
#include "planner_test_util.h"

using namespace hp;
using namespace hp::planner;
using hp_test::a100;

namespace {

const auto cluster = hp_test::preset_cluster;
const auto gpt = hp_test::small_gpt;

std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, int> structure(
    const Config& c) {
  return {c.dp, c.tp, c.pp, c.ep, c.optimizer_shard, static_cast<int>(c.schedule)};
}

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("planner: the alternatives are the best plans of the fastest structures, exactly",
          "[planner]") {
  // Every structure searched on its own (--fix pins it) gives its best time; the unrestricted
  // search must list the fastest of them, in order, after the best, with those very times.
  const auto topo = hp_test::preset_topology("dgx-a100", 2);
  const ModelProfile m = gpt(16, 2048, 4096, 51200);
  Workload w;
  w.global_batch = 32;
  const Machine mc = a100(40.0 * (1 << 30));
  std::vector<std::pair<double, Config>> best_of;  // per structure that fits
  for (std::int64_t tp = 1; tp <= 16; tp *= 2)
    for (std::int64_t pp = 1; tp * pp <= 16; pp *= 2) {
      const std::int64_t dp = 16 / tp / pp;
      for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero)
        for (auto sched : {recipe::Schedule::one_f_one_b, recipe::Schedule::gpipe,
                           recipe::Schedule::zb_h1, recipe::Schedule::interleaved}) {
          if (pp == 1 && sched != recipe::Schedule::one_f_one_b) continue;
          Fixed f;
          f.dp = dp, f.tp = tp, f.pp = pp, f.ep = 1, f.optimizer_shard = zero, f.schedule = sched;
          const SearchResult one = search({m, topo, w, mc, {1, f}});
          if (one.plans.empty()) continue;
          CHECK(!one.rival);  // one structure: nothing else to compare with
          best_of.push_back({one.plans[0].predicted.iteration, one.plans[0].config});
        }
    }
  std::sort(best_of.begin(), best_of.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  REQUIRE(best_of.size() > kMaxAlternatives);

  const SearchResult r = search({m, topo, w, mc, {10, {}}});
  REQUIRE(r.plans.size() == 10);
  // Structures may tie (ZeRO levels whose extra traffic is hidden): compare times, and each row's
  // time with its own structure's best.
  auto own_best = [&](const Config& c) {
    for (const auto& [t, b] : best_of)
      if (structure(b) == structure(c)) return t;
    return -1.0;
  };
  std::vector<decltype(structure(Config{}))> seen;
  for (std::size_t i = 0; i < kMaxAlternatives; ++i) {
    INFO("row " << i + 1 << ": " << short_config(r.plans[i].config));
    CHECK(r.plans[i].predicted.iteration == Approx(best_of[i].first).epsilon(1e-9));
    CHECK(r.plans[i].predicted.iteration == Approx(own_best(r.plans[i].config)).epsilon(1e-9));
    CHECK(std::find(seen.begin(), seen.end(), structure(r.plans[i].config)) == seen.end());
    seen.push_back(structure(r.plans[i].config));
  }
  REQUIRE(r.rival);
  CHECK(r.rival->predicted.iteration == Approx(best_of[1].first).epsilon(1e-9));
  // The rows after the alternatives are the next-fastest plans, in time order.
  for (std::size_t i = kMaxAlternatives + 1; i < r.plans.size(); ++i)
    CHECK(r.plans[i - 1].predicted.iteration <= r.plans[i].predicted.iteration);

  // At k = 1 the table has one row, and the rival (what the why line names) is still exact.
  const SearchResult one = search({m, topo, w, mc, {1, {}}});
  REQUIRE(one.plans.size() == 1);
  CHECK(one.plans[0].predicted.iteration == Approx(best_of[0].first).epsilon(1e-9));
  REQUIRE(one.rival);
  CHECK(!same_structure(one.rival->config, one.plans[0].config));
  CHECK(one.rival->predicted.iteration == Approx(best_of[1].first).epsilon(1e-9));
  // Without the structure list (the --compare baselines) there is no rival.
  SearchLimits bare{1, {}};
  bare.alternatives = false;
  CHECK(!search({m, topo, w, mc, bare}).rival);
}

TEST_CASE("planner: Llama 3 70B on 64 DGX H100 nodes lists other structures before refinements",
          "[planner]") {
  PlanOptions opts;
  opts.model = std::string(HP_SOURCE_DIR) + "/recipes/skeletons/llama3-70b.onnx";
  opts.seq = 4096;
  opts.global_batch = 512;
  opts.top_k = 5;
  auto rep = run(opts, cluster("dgx-h100", 64));
  if (!rep) FAIL(rep.error().str());
  REQUIRE(rep->plans.size() == 5);
  // The five fastest plans here are all dp32 tp4 pp4 with other virtual-stage counts and one other
  // structure: the near-duplicates the rows used to show. Rows 2..5 now each bring a structure.
  PlanOptions k1 = opts;
  k1.top_k = 1;
  auto single = run(k1, cluster("dgx-h100", 64));
  REQUIRE(single);
  const Plan& best = rep->plans.front();
  CHECK(single->plans.front().predicted.iteration == best.predicted.iteration);
  std::vector<decltype(structure(best.config))> seen;
  for (const auto& p : rep->plans) {
    INFO(short_config(p.config));
    CHECK(std::find(seen.begin(), seen.end(), structure(p.config)) == seen.end());
    seen.push_back(structure(p.config));
    CHECK(best.predicted.iteration <= p.predicted.iteration);
  }
  for (std::size_t i = 2; i < rep->plans.size(); ++i)
    CHECK(rep->plans[i - 1].predicted.iteration <= rep->plans[i].predicted.iteration);
  // The why line names the second row, a different structure, at either k.
  const std::string rival = short_config(rep->plans[1].config);
  CHECK(contains(rep->why, "faster than " + rival + " (it spends less on "));
  CHECK(contains(single->why, "faster than " + rival + " (it spends less on "));
  CHECK(!contains(rep->why, "only plan"));
}

TEST_CASE("planner: the why line says when one structure or one plan is all that fits",
          "[planner]") {
  PlanOptions opts;
  opts.model = std::string(HP_SOURCE_DIR) + "/tests/data/models/tiny-gpt2.onnx";
  opts.seq = 16;
  opts.top_k = 3;
  // One CPU rank and one sequence: dp = tp = pp = 1, one micro-batch, no ZeRO, one schedule.
  opts.global_batch = 1;
  auto only = run(opts, cluster("local-cpu", 1));
  if (!only) FAIL(only.error().str());
  CHECK(only->plans.size() == 1);
  CHECK(contains(only->why, "; it is the only plan that fits"));

  // Four sequences: micro-batch sizes 1, 2 and 4 refine the one structure that exists.
  opts.global_batch = 4;
  auto refined = run(opts, cluster("local-cpu", 1));
  if (!refined) FAIL(refined.error().str());
  REQUIRE(refined->plans.size() == 3);
  for (const auto& p : refined->plans)
    CHECK(same_structure(p.config, refined->plans.front().config));
  CHECK(contains(refined->why, "; no plan of another structure fits; the next, " +
                                   short_config(refined->plans[1].config) + " ("));
  CHECK(contains(refined->why, "slower), differs in micro-batch size"));
  CHECK(!contains(refined->why, "only plan"));

  // --fix pinning a whole structure on 8 GPUs leaves refinements only, and says so.
  opts.global_batch = 16;
  opts.fix_args = {"dp=2", "tp=2", "pp=2", "zero=1", "schedule=1f1b"};
  auto fixed = run(opts, cluster("dgx-a100", 1));
  if (!fixed) FAIL(fixed.error().str());
  REQUIRE(fixed->plans.size() >= 2);
  CHECK(contains(fixed->why, "; no plan of another structure fits; the next, "));
}
