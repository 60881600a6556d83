// hp plan and hp offload-profile share one memory model: for every shipped recipe with a stage
// layout, the peak of each stage's simulated timeline without offload equals the stage memory
// planner::predict reports for the same recipe (within 2%), and planner::activation_peak equals the
// timeline's peak of activations and gradients for every schedule shape. A stage the planner calls
// feasible therefore never peaks above the usable memory in the timeline.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <random>

#include "hp/offload/stage_input.h"
#include "hp/offload/timeline.h"
#include "hp/planner/cost.h"
#include "hp/planner/predict.h"
#include "hp/planner/schedule.h"
#include "hp/recipe/presets.h"

namespace fs = std::filesystem;
using namespace hp;

namespace {

struct Shape {
  recipe::Schedule s;
  std::int64_t p, k, m, v;
};

}  // namespace

TEST_CASE("offload: activation_peak equals the timeline's activation and gradient peak",
          "[offload]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> bytes(0.0, 100.0);
  std::vector<Shape> shapes;
  for (std::int64_t p : {1, 2, 4})
    for (std::int64_t k = 0; k < p; ++k)
      for (std::int64_t m : {1, 3, 4, 8}) {
        shapes.push_back({recipe::Schedule::gpipe, p, k, m, 1});
        shapes.push_back({recipe::Schedule::one_f_one_b, p, k, m, 1});
        if (m % p == 0)
          for (std::int64_t v : {2, 3})
            shapes.push_back({recipe::Schedule::interleaved, p, k, m, v});
      }
  for (const Shape& sh : shapes)
    for (int trial = 0; trial < 5; ++trial) {
      offload::StageInput in;
      in.stage = sh.k, in.stages = sh.p, in.micro_batches = sh.m, in.virtual_stages = sh.v;
      in.schedule = sh.s;
      std::vector<planner::UnitActivations> units;
      for (std::int64_t c = 0; c < sh.v; ++c)
        for (int u = 0; u < 3; ++u) {
          offload::Unit x;
          x.chunk = c;
          x.act = bytes(rng);
          x.act_transient = trial % 2 ? bytes(rng) * 3 : 0.0;  // recompute rebuilds, some large
          x.gradients = trial % 3 ? bytes(rng) * (trial == 4 ? 10 : 1) : 0.0;  // some dominant
          in.units.push_back(x);
          units.push_back({c, x.act, x.act_transient, x.gradients});
        }
      const offload::Timeline t = offload::simulate(in);
      double simulated = 0;
      for (const auto& s : t.slots)
        simulated = std::max(simulated, s.memory[static_cast<int>(offload::Kind::activations)] +
                                            s.memory[static_cast<int>(offload::Kind::gradients)]);
      const auto& live = planner::live_counts(sh.s, sh.p, sh.k, sh.m, sh.v);
      INFO("schedule " << recipe::schedule_name(sh.s) << " p " << sh.p << " k " << sh.k << " m "
                       << sh.m << " v " << sh.v << " trial " << trial);
      CHECK(planner::activation_peak(live, units) == Approx(simulated).epsilon(1e-12));
    }
}

TEST_CASE("offload: every shipped recipe's timeline peak is the planner's stage memory",
          "[offload]") {
  const fs::path dir = fs::path(HP_SOURCE_DIR) / "recipes";
  const auto presets = recipe::preset_dirs(fs::path(HP_BINARY_DIR) / "bin", HP_SOURCE_DIR);
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    auto rec = recipe::load_recipe(entry.path());
    REQUIRE(rec);
    if (rec->stages.empty()) continue;
    auto cluster = recipe::cluster_for(*rec, dir, presets);
    REQUIRE(cluster);
    for (const char* dtype : {"bf16", "fp32"}) {
      INFO(entry.path().filename().string() << " in " << dtype);
      planner::PredictOptions po;
      po.dtype = dtype;
      auto plan = planner::predict_recipe(*rec, dir, *cluster, po);
      if (!plan && plan.error().message().find("no peak FLOP/s") != std::string::npos)
        continue;  // a device priced only in 16-bit (Ascend 910C has no fp32 peak in its table)
      REQUIRE(plan);
      offload::StageBuildOptions so;
      so.model = dir / rec->model;
      so.dtype = *parse_dtype(dtype);
      auto built = offload::build_stages(*rec, *cluster, so);
      REQUIRE(built);
      REQUIRE(built->stages.size() == plan->stages.size());
      const double usable = cluster->device_types.empty()
                                ? 0
                                : built->device.memory * (1 - planner::kTransientMargin);
      for (std::size_t k = 0; k < plan->stages.size(); ++k) {
        INFO("stage " << k);
        const double peak = offload::simulate(built->stages[k]).peak_bytes();
        CHECK(peak == Approx(plan->stages[k].memory).epsilon(0.02));
        if (plan->stages[k].feasible) CHECK(peak <= usable * 1.0000001);
      }
      ++checked;
    }
  }
  CHECK(checked >= 9);  // the shipped planned recipes, each in two dtypes where priced
}

TEST_CASE("offload: inference timelines agree with the planner apart from the KV cache",
          "[offload]") {
  // The planner prices inference without a KV cache (one block's activations at a time); the
  // timeline adds the cache of every micro-batch served. Everything else is the same model.
  const fs::path dir = fs::path(HP_SOURCE_DIR) / "recipes";
  const auto presets = recipe::preset_dirs(fs::path(HP_BINARY_DIR) / "bin", HP_SOURCE_DIR);
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    auto rec = recipe::load_recipe(entry.path());
    REQUIRE(rec);
    if (rec->stages.empty()) continue;
    INFO(entry.path().filename().string());
    auto cluster = recipe::cluster_for(*rec, dir, presets);
    REQUIRE(cluster);
    planner::PredictOptions po;
    po.train = false;
    auto plan = planner::predict_recipe(*rec, dir, *cluster, po);
    REQUIRE(plan);
    offload::StageBuildOptions so;
    so.model = dir / rec->model;
    so.train = false;
    auto built = offload::build_stages(*rec, *cluster, so);
    REQUIRE(built);
    REQUIRE(built->stages.size() == plan->stages.size());
    for (std::size_t k = 0; k < plan->stages.size(); ++k) {
      INFO("stage " << k);
      double peak = 0;
      for (const auto& s : offload::simulate(built->stages[k]).slots)
        peak = std::max(
            peak, offload::sum(s.memory) - s.memory[static_cast<int>(offload::Kind::kv_cache)]);
      CHECK(peak == Approx(plan->stages[k].memory).epsilon(0.02));
    }
    ++checked;
  }
  CHECK(checked >= 5);
}
