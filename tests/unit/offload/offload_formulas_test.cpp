// The memory figures of the timeline against the published formulas (docs/offload.md, "Memory
// formulas"): ZeRO model states for the 7.5B / 64-device example, Korthikanti's activations per
// layer and the first-stage totals of his Fig. 1 reproduced by simulating the pipeline schedules,
// and the KV cache of GQA models.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "hp/offload/formulas.h"
#include "hp/offload/timeline.h"

using namespace hp::offload;
using hp::recipe::Recompute;
using hp::recipe::Schedule;

namespace {
constexpr double GiB = 1024.0 * 1024 * 1024;
constexpr double KiB = 1024.0;
}  // namespace

TEST_CASE("model states follow the ZeRO formulas for 7.5B parameters on 64 devices",
          "[offload][formulas]") {
  const double psi = 7.5e9, nd = 64, k = 12;
  // ZeRO paper Fig. 1 rows, written out independently of the implementation.
  CHECK(zero_states(psi, 0, 64).total() == Approx(16 * psi).epsilon(1e-12));  // 120 GB
  CHECK(zero_states(psi, 1, 64).total() ==
        Approx(4 * psi + k * psi / nd).epsilon(1e-12));  // 31.4 GB
  CHECK(zero_states(psi, 2, 64).total() ==
        Approx(2 * psi + (2 + k) * psi / nd).epsilon(1e-12));  // 16.6 GB
  CHECK(zero_states(psi, 3, 64).total() ==
        Approx((2 + 2 + k) * psi / nd).epsilon(1e-12));  // 1.9 GB
  CHECK(zero_states(psi, 0, 64).total() / 1e9 == Approx(120.0));
  CHECK(zero_states(psi, 1, 64).total() / 1e9 == Approx(31.40625));
  CHECK(zero_states(psi, 2, 64).total() / 1e9 == Approx(16.640625));
  CHECK(zero_states(psi, 3, 64).total() / 1e9 == Approx(1.875));
  // Megatron's 18 B/param (bf16 weights, fp32 grads, 12 B optimizer); distributed optimizer 6 +
  // 12/d.
  CHECK(zero_states(psi, 0, 64, 2, 4, 12).total() / 1e9 == Approx(135.0));
  CHECK(zero_states(psi, 1, 64, 2, 4, 12).total() / 1e9 == Approx(46.40625));
}

TEST_CASE("the timeline carries each ZeRO level's model states, gradients from the backward on",
          "[offload][formulas]") {
  for (int level = 0; level <= 3; ++level) {
    StageInput in;
    in.micro_batches = 4;
    const int layers = 30;
    for (int i = 0; i < layers; ++i) {
      const ModelStates ms = zero_states(7.5e9 / layers, level, 64);
      Unit u;
      u.name = "h." + std::to_string(i);
      u.param_count = 7.5e9 / layers;
      u.parameters = ms.parameters, u.gradients = ms.gradients, u.optimizer = ms.optimizer;
      u.act = 1e6;
      u.fwd = 1e-3, u.bwd = 2e-3;
      in.units.push_back(u);
    }
    const Timeline t = simulate(in);
    const ModelStates want = zero_states(7.5e9, level, 64);
    // Weights and optimizer states are held throughout; a layer's gradients appear at its first
    // backward and stay to the optimizer step, so they only grow, and are whole by its end.
    bool backward_seen = false;
    double grads = 0;
    for (const auto& s : t.slots) {
      backward_seen = backward_seen || s.type == Slot::backward;
      const double held = s.memory[static_cast<int>(Kind::parameters)] +
                          s.memory[static_cast<int>(Kind::optimizer)];
      REQUIRE(held == Approx(want.parameters + want.optimizer).epsilon(1e-9));
      const double g = s.memory[static_cast<int>(Kind::gradients)];
      REQUIRE(g >= grads);
      if (!backward_seen) REQUIRE(g == 0);
      if (s.type == Slot::optimizer) REQUIRE(g == Approx(want.gradients).epsilon(1e-9));
      grads = g;
    }
  }
}

TEST_CASE("activations per layer follow Korthikanti's Table 2", "[offload][formulas]") {
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8;
  const double sbh = s * b * h;
  LayerShape one{s, b, h, a, 1, false};
  CHECK(korthikanti_layer_bytes(one, Recompute::none) == Approx(sbh * (34 + 5 * a * s / h)));
  LayerShape tp{s, b, h, a, t, false};
  CHECK(korthikanti_layer_bytes(tp, Recompute::none) ==
        Approx(sbh * (10 + 24 / t + 5 * a * s / (h * t))));
  CHECK(korthikanti_layer_bytes(tp, Recompute::selective) == Approx(sbh * (10 + 24 / t)));
  CHECK(korthikanti_layer_bytes(tp, Recompute::full) == Approx(2 * sbh));
  LayerShape sp{s, b, h, a, t, true};
  CHECK(korthikanti_layer_bytes(sp, Recompute::none) ==
        Approx(sbh * (34 / t + 5 * a * s / (h * t))));
  CHECK(korthikanti_layer_bytes(sp, Recompute::selective) == Approx(34 * sbh / t));
}

namespace {

struct Fig1 {
  const char* name;
  double heads, hidden, layers, t, p, v, b, micro_batches;
  double states_gib, act_tp_gib, act_sp_sel_gib;
};

// First-stage activation peak from simulating stage 0's schedule with Korthikanti's per-layer
// bytes.
double first_stage_activation_peak(const Fig1& f, const LayerShape& shape, Recompute rc) {
  StageInput in;
  in.stage = 0;
  in.stages = static_cast<std::int64_t>(f.p);
  in.virtual_stages = static_cast<std::int64_t>(f.v);
  in.schedule = f.v > 1 ? Schedule::interleaved : Schedule::one_f_one_b;
  in.micro_batches = static_cast<std::int64_t>(f.micro_batches);
  const auto per_chunk = static_cast<std::int64_t>(f.layers / (f.p * f.v));
  for (std::int64_t c = 0; c < in.virtual_stages; ++c)
    for (std::int64_t l = 0; l < per_chunk; ++l) {
      Unit u;
      u.name = "layer";
      u.chunk = c;
      u.act = korthikanti_layer_bytes(shape, rc);
      u.fwd = 1, u.bwd = 2;
      in.units.push_back(u);
    }
  double peak = 0;
  for (const auto& s : simulate(in).slots)
    peak = std::max(peak, s.memory[static_cast<int>(Kind::activations)]);
  return peak;
}

}  // namespace

TEST_CASE("simulated schedules reproduce Korthikanti Fig. 1 first-stage memory",
          "[offload][formulas]") {
  // Korthikanti et al. 2022, Fig. 1; s = 2048, global batch = micro-batches x b (dp = 1).
  const Fig1 rows[] = {
      {"22B", 64, 6144, 48, 8, 1, 1, 4, 1, 45.5625, 59.25, 9.5625},
      {"175B", 96, 12288, 96, 8, 8, 3, 1, 64, 45.5625, 66.84375, 12.3515625},
      {"530B", 128, 20480, 105, 8, 35, 3, 1, 280, 31.640625, 114.0234375, 23.076171875},
      {"1T", 160, 25600, 128, 8, 64, 1, 1, 512, 32.958984375, 131.25, 26.5625},
  };
  for (const auto& f : rows) {
    INFO(f.name);
    const double params = 12 * f.layers * f.hidden * f.hidden / (f.t * f.p);
    CHECK(zero_states(params, 0, 1, 2, 4, 12).total() / GiB == Approx(f.states_gib).epsilon(1e-9));
    LayerShape tp{2048, f.b, f.hidden, f.heads, f.t, false};
    LayerShape sp{2048, f.b, f.hidden, f.heads, f.t, true};
    CHECK(first_stage_activation_peak(f, tp, Recompute::none) / GiB ==
          Approx(f.act_tp_gib).epsilon(1e-9));
    CHECK(first_stage_activation_peak(f, sp, Recompute::selective) / GiB ==
          Approx(f.act_sp_sel_gib).epsilon(1e-9));
  }
}

TEST_CASE("KV cache bytes follow the GQA formula", "[offload][formulas]") {
  // Llama-3-8B: 32 layers, 8 KV heads x 128, bf16 -> 128 KiB per token.
  CHECK(kv_cache_bytes(32, 8, 128, 1, 2) == Approx(128 * KiB));
  CHECK(kv_cache_bytes(32, 8, 128, 71 * 1024, 2) / GiB == Approx(8.875));
  CHECK(kv_cache_bytes(32, 8, 128, 123 * 1024, 2) / GiB == Approx(15.375));
  // 80 layers, 8 KV heads x 128: 320 KiB per token, 32K tokens = 10 GiB.
  CHECK(kv_cache_bytes(80, 8, 128, 1, 2) == Approx(320 * KiB));
  CHECK(kv_cache_bytes(80, 8, 128, 32 * 1024, 2) / GiB == Approx(10.0));
  // GQA divides multi-head attention's cache by heads / kv_heads.
  CHECK(kv_cache_bytes(32, 32, 128, 1000, 2) / kv_cache_bytes(32, 8, 128, 1000, 2) == Approx(4.0));
}

TEST_CASE("schedules run every forward before its backward and keep the documented warm-up",
          "[offload][timeline]") {
  for (auto sched : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved}) {
    const std::int64_t p = 4, m = 8, v = sched == Schedule::interleaved ? 2 : 1;
    for (std::int64_t k = 0; k < p; ++k) {
      const auto ops = schedule_ops(sched, p, k, m, v, true);
      REQUIRE(ops.size() == static_cast<std::size_t>(2 * m * v));
      std::set<std::pair<std::int64_t, std::int64_t>> done;
      std::int64_t warmup = 0;
      bool seen_backward = false;
      for (const auto& op : ops) {
        if (op.forward) {
          REQUIRE(done.insert({op.micro, op.chunk}).second);
          if (!seen_backward) ++warmup;
        } else {
          REQUIRE(done.count({op.micro, op.chunk}) == 1);
          seen_backward = true;
        }
      }
      if (sched == Schedule::gpipe) CHECK(warmup == m);
      if (sched == Schedule::one_f_one_b) CHECK(warmup == p - k);
      if (sched == Schedule::interleaved)
        CHECK(warmup == std::min((p - k - 1) * 2 + (v - 1) * p, m * v) + 1);
    }
  }
}
