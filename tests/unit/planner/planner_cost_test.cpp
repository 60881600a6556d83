// Planner cost model: ZeRO state bytes, in-flight micro-batches per schedule, Korthikanti
// activation memory under TP/SP/recompute, TP communication, and the GPT-3 175B skeleton's
// parameters and FLOPs against the 12 l h^2 formulas (docs/planner.md, "FLOPs convention" and
// "Per block and micro-batch").
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "hp/model/summary.h"
#include "hp/planner/cost.h"
#include "hp/planner/planner.h"
#include "hp/planner/schedule.h"
#include "hp/topology/collectives.h"

using namespace hp;
using namespace hp::planner;

TEST_CASE("planner: ZeRO state bytes match the ZeRO paper's 7.5B / 64-way table", "[planner]") {
  Workload w;  // bf16 weights and grads, K = 12
  const double psi = 7.5e9;
  CHECK(psi * state_bytes_per_param(w, 2, 0, 64) / 1e9 == Approx(120.0));
  CHECK(psi * state_bytes_per_param(w, 2, 1, 64) / 1e9 == Approx(31.40625));
  CHECK(psi * state_bytes_per_param(w, 2, 2, 64) / 1e9 == Approx(16.640625));
  CHECK(psi * state_bytes_per_param(w, 2, 3, 64) / 1e9 == Approx(1.875));
  w.train = false;
  CHECK(state_bytes_per_param(w, 2, 3, 64) == 2.0);
}

TEST_CASE("planner: in-flight micro-batches per schedule", "[planner]") {
  Config c;
  c.pp = 8;
  c.micro_batches = 64;
  c.schedule = recipe::Schedule::one_f_one_b;
  CHECK(in_flight(c, 0) == 8.0);
  CHECK(in_flight(c, 7) == 1.0);
  c.schedule = recipe::Schedule::gpipe;
  CHECK(in_flight(c, 3) == 64.0);
  c.schedule = recipe::Schedule::interleaved;
  c.virtual_stages = 3;
  CHECK(in_flight(c, 0) == Approx(8.0 * (1.0 + 7.0 / 24.0)));
  // Megatron's warm-up on the last stage is (v-1)p = 16 chunk forwards: it too holds about p
  // micro-batches of its earlier chunks, not min(m, p-k) = 1.
  CHECK(in_flight(c, 7) == Approx(17.0 / 3.0));
  const LiveCounts& last = live_counts(c.schedule, 8, 7, 64, 3);
  REQUIRE(last.after_forward.size() >= 1);
  std::int64_t most = 0, most_total = 0;
  for (const auto& n : last.after_forward) {
    most = std::max(most, n[0]);
    most_total = std::max(most_total, n[0] + n[1] + n[2]);
  }
  // Chunk 0 peaks at 2p: the second group's p forwards of chunk 0 run while chunk 1's backwards
  // free the first group's chunk 1, before any backward of chunk 0.
  CHECK(most == 16);
  CHECK(most_total == 17);
  c.schedule = recipe::Schedule::one_f_one_b;
  c.micro_batches = 2;
  CHECK(in_flight(c, 0) == 2.0);  // m < p: only m micro-batches exist
}

TEST_CASE("planner: gradients are born in the backward, not held through the forward",
          "[planner]") {
  // Two units of 10 bytes kept per micro-batch and 5 bytes of gradients each, one rank.
  const std::vector<UnitActivations> units = {{0, 10, 0, 5}, {0, 10, 0, 5}};
  // One micro-batch: the forward ends at 20; the last unit's backward adds its 5 gradient bytes on
  // top (25); the first unit's runs after the last freed 10 (20 + 10 - 10). States + activations
  // would say 30.
  CHECK(activation_peak(live_counts(recipe::Schedule::gpipe, 1, 0, 1, 1), units) == 25.0);
  // GPipe with two micro-batches: 40 after the forwards, 45 in the first backward; the second
  // finds all 10 gradient bytes and 20 of activations (30).
  CHECK(activation_peak(live_counts(recipe::Schedule::gpipe, 1, 0, 2, 1), units) == 45.0);
  // Gradients larger than the activations: the peak is at the end of the backward, all of them
  // plus the first unit's own activations (2 x 50 + 10).
  const std::vector<UnitActivations> heavy = {{0, 10, 0, 50}, {0, 10, 0, 50}};
  CHECK(activation_peak(live_counts(recipe::Schedule::gpipe, 1, 0, 1, 1), heavy) == 110.0);
  // 1F1B with a rank ahead of it (p = 2, k = 0, m = 3): micro-batch 0's backward allocates the
  // gradients, the forwards of micro-batch 2 then run on top of them (2 x 20 + 10).
  CHECK(activation_peak(live_counts(recipe::Schedule::one_f_one_b, 2, 0, 3, 1), units) == 50.0);
  // The incremental tracker agrees.
  PeakTracker t(live_counts(recipe::Schedule::one_f_one_b, 2, 0, 3, 1), units);
  CHECK(t.peak() == 50.0);
  t.set(1, 2, 8);  // the second unit recomputed: keeps 2, rebuilds 8 in its backward
  const std::vector<UnitActivations> changed = {{0, 10, 0, 5}, {0, 2, 8, 5}};
  CHECK(t.peak() ==
        activation_peak(live_counts(recipe::Schedule::one_f_one_b, 2, 0, 3, 1), changed));
}

TEST_CASE("planner: ZB-H1 holds p micro-batches on every stage, and its bubble model",
          "[planner]") {
  Config c;
  c.pp = 8;
  c.micro_batches = 64;
  c.schedule = recipe::Schedule::zb_h1;
  // Weight gradients deferred by k backwards on stage k: (p - k) + k = p everywhere.
  for (std::int64_t k = 0; k < 8; ++k) CHECK(in_flight(c, k) == 8.0);
  c.micro_batches = 3;
  for (std::int64_t k = 0; k < 8; ++k) CHECK(in_flight(c, k) == 3.0);
  // The order keeps every micro-batch's forward before its (W-placed) backward, each once.
  for (std::int64_t k = 0; k < 4; ++k) {
    const auto ops = schedule_ops(recipe::Schedule::zb_h1, 4, k, 8, 1, true);
    REQUIRE(ops.size() == 16);
    std::vector<int> seen(8, 0);
    for (const auto& op : ops) {
      auto& s = seen[static_cast<std::size_t>(op.micro)];
      CHECK(s == (op.forward ? 0 : 1));
      ++s;
    }
  }
  // bubble_seconds: 1F1B (p-1)(f+b+w), interleaved / v, ZB-H1 (p-1)(f + max(b-w, 0)), ZB-V
  // (p-1) f/2; one stage has none.
  using S = recipe::Schedule;
  CHECK(bubble_seconds(S::one_f_one_b, 4, 8, 1, 1, 1, 1) == Approx(9));
  CHECK(bubble_seconds(S::gpipe, 4, 8, 1, 1, 2, 0) == Approx(9));
  CHECK(bubble_seconds(S::interleaved, 4, 8, 3, 1, 1, 1) == Approx(3));
  CHECK(bubble_seconds(S::zb_h1, 4, 8, 1, 1, 1, 1) == Approx(3));
  CHECK(bubble_seconds(S::zb_h1, 4, 8, 1, 1, 1.5, 0.5) == Approx(6));
  CHECK(bubble_seconds(S::zb_h1, 4, 8, 1, 1, 0.5, 1.5) == Approx(3));  // clamped: the start-up
  CHECK(bubble_seconds(S::zb_h1, 4, 2, 1, 1, 1, 1) == Approx(5));      // m < p: 2 Ws with no gap
  CHECK(bubble_seconds(S::zb_h1, 4, 1, 1, 1, 2, 0.5) == Approx(3 * 2.5 + 3 * 0.5));
  CHECK(bubble_seconds(S::zbv, 4, 8, 2, 1, 1, 1) == Approx(1.5));
  CHECK(bubble_seconds(S::zb_h1, 1, 8, 1, 1, 1, 1) == 0);
}

namespace {

// A GPT layer per Korthikanti Table 2: 34 s h bytes (16-bit) per sequence plus 5 a s^2 of attention
// scores; its forward is 24 s h^2 + 4 s^2 h FLOPs.
BlockProfile gpt_layer(double s, double h, double a) {
  BlockProfile b;
  b.parameters = 12 * h * h;
  b.fwd_flops = 24 * s * h * h + 4 * s * s * h;
  b.quadratic_flops = 4 * s * s * h;
  b.quadratic_act_bytes = 5 * a * s * s;
  b.act_bytes = 34 * s * h + b.quadratic_act_bytes;
  b.boundary_bytes = 2 * s * h;
  b.tp_collectives = 2;
  return b;
}

}  // namespace

TEST_CASE("planner: activation bytes follow Korthikanti Table 2", "[planner]") {
  const double s = 2048, h = 12288, a = 96, t = 8, mb = 1;
  ModelProfile m;
  m.seq = 2048;
  m.hidden_bytes = 2 * s * h;
  Config c;
  c.tp = 8;
  Workload w;
  Machine mc;
  mc.peak_flops = 312e12;
  mc.cal = calibration_for(recipe::DeviceKind::gpu);
  m.dtype_bytes = 2;
  AxisLinks links;
  links.tp = {"node", 0, 300e9, 3e-6};
  BlockCost tp_only = block_cost(gpt_layer(s, h, a), m, c, w, mc, links);
  CHECK(tp_only.act[0] == Approx(s * mb * h * (10 + 24 / t + 5 * a * s / (h * t))));
  CHECK(tp_only.act[1] == Approx(s * mb * h * (10 + 24 / t)));
  CHECK(tp_only.act[2] == Approx(2 * s * mb * h));
  c.sequence_parallel = true;
  BlockCost sp = block_cost(gpt_layer(s, h, a), m, c, w, mc, links);
  CHECK(sp.act[0] == Approx(s * mb * h * (34 / t + 5 * a * s / (h * t))));
  CHECK(sp.act[1] == Approx(34 * s * mb * h / t));

  // Compute: forward at the width-dependent efficiency, backward twice that; TP: 2 all-reduces of
  // b s h each way.
  const double eff = 0.8 * (h / t) / (h / t + 444);
  const double fwd = (24 * s * h * h + 4 * s * s * h) / t / (312e12 * eff);
  CHECK(sp.fwd == Approx(fwd));
  CHECK(sp.bwd == Approx(2 * fwd));
  CHECK(sp.tp_comm == Approx(4 * topology::all_reduce_time(links.tp, 8, 2 * s * h)));
  // Korthikanti Fig. 1 check of states: 18 bytes/param there; ZeRO-0 here with K = 12 is 16 bytes.
  CHECK(sp.state_bytes == Approx(12 * h * h / t * 16));
}

TEST_CASE("planner: a measured sustained GEMM rate replaces peak x efficiency", "[planner]") {
  const double s = 1024, h = 4096, a = 32;
  ModelProfile m;
  m.seq = 1024;
  m.hidden_bytes = 4 * s * h;
  m.dtype_bytes = 4;
  Config c;
  Workload w;
  Machine mc;
  mc.peak_flops = 1e12;
  mc.cal = calibration_for(recipe::DeviceKind::cpu);
  AxisLinks links;
  const BlockCost table = block_cost(gpt_layer(s, h, a), m, c, w, mc, links);
  mc.sustained_flops = 1.5e12;  // measured above the table peak, as on a CPU that boosts
  const BlockCost measured = block_cost(gpt_layer(s, h, a), m, c, w, mc, links);
  const double flops = 24 * s * h * h + 4 * s * s * h;
  // The CPU calibration is a flat 0.5 of peak; the measured rate is used as it is, at any width.
  CHECK(table.fwd - measured.fwd == Approx(flops / 0.5e12 - flops / 1.5e12));
  CHECK(measured.bwd == Approx(2 * measured.fwd));
  // With a memory bandwidth the measured rate's forward also moves its activations once more (a
  // table rate's efficiency already has that work in it); the backward stays twice the forward.
  mc.memory_bandwidth = 1e11;
  const BlockCost moved = block_cost(gpt_layer(s, h, a), m, c, w, mc, links);
  REQUIRE(moved.act_infer > 0);
  CHECK(moved.fwd - measured.fwd == Approx(moved.act_infer / 1e11));
  CHECK(moved.bwd == Approx(2 * moved.fwd));
  mc.sustained_flops = 0;
  CHECK(block_cost(gpt_layer(s, h, a), m, c, w, mc, links).fwd == Approx(table.fwd));
}

TEST_CASE("planner: the 175B skeleton's parameters and FLOPs match 12 l h^2", "[planner]") {
  model::SummaryOptions so;
  so.model = std::string(HP_SOURCE_DIR) + "/tests/data/models/gpt-175b-skeleton.onnx";
  so.dims = {{"batch", 1}, {"seq", 2048}};
  auto s = model::summarize_model(so);
  REQUIRE(s);
  auto p = profile_model(*s, 2048, 2);
  REQUIRE(p);
  const double l = 96, h = 12288, V = 50257, seq = 2048;
  REQUIRE(p->blocks.size() == 96);
  const double params = 12 * l * h * h * (1 + 13 / (12 * h) + (V + seq) / (12 * l * h));
  CHECK(p->total_parameters() == Approx(params).epsilon(0.01));
  // Per layer forward: 24 s h^2 + 4 s^2 h (2 FLOPs per MAC), plus softmax/norm elementwise work.
  CHECK(p->blocks[10].fwd_flops == Approx(24 * seq * h * h + 4 * seq * seq * h).epsilon(0.02));
  CHECK(p->blocks[10].quadratic_flops > 4 * seq * seq * h * 0.9);
  CHECK(p->blocks[10].tp_collectives == 2);
  WARN("175B block: act " << p->blocks[10].act_bytes << " quad "
                          << p->blocks[10].quadratic_act_bytes << " kernels "
                          << p->blocks[10].kernels);
  CHECK(p->hidden_bytes == Approx(2 * seq * h));
}
