// Helpers shared by the planner tests.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "hp/planner/planner.h"
#include "hp/recipe/presets.h"

namespace hp_test {

/// An A100-like device (312 TFLOP/s bf16, 2 TB/s) with the GPU efficiency calibration and the given
/// memory, for search tests that set the memory limit themselves.
inline hp::planner::Machine a100(double memory) {
  hp::planner::Machine mc;
  mc.peak_flops = 312e12;
  mc.memory = memory;
  mc.memory_bandwidth = 2e12;
  mc.cal = hp::planner::calibration_for(hp::recipe::DeviceKind::gpu);
  return mc;
}

/// The cluster preset `name` (recipes/clusters) scaled to `nodes` nodes.
inline hp::recipe::Cluster preset_cluster(const std::string& name, std::int64_t nodes) {
  auto c = hp::recipe::load_cluster_ref(name, {}, hp::recipe::preset_dirs({}, HP_SOURCE_DIR));
  REQUIRE(c);
  auto scaled = hp::recipe::scale_cluster(*c, nodes);
  REQUIRE(scaled);
  return *scaled;
}

/// The topology of preset_cluster(name, nodes).
inline hp::topology::Topology preset_topology(const std::string& name, std::int64_t nodes) {
  auto t = hp::topology::Topology::from_cluster(preset_cluster(name, nodes));
  REQUIRE(t);
  return *t;
}

/// A GPT profile from the formulas (sequence s, hidden h, `layers` blocks, a vocab-sized
/// embedding and head): no ONNX model needed to drive the search.
inline hp::planner::ModelProfile small_gpt(int layers, double s, double h, double vocab) {
  hp::planner::ModelProfile m;
  m.seq = static_cast<std::int64_t>(s);
  m.hidden_bytes = 2 * s * h;
  for (int i = 0; i < layers; ++i) {
    hp::planner::BlockProfile b;
    b.name = "h." + std::to_string(i);
    b.parameters = 12 * h * h;
    b.fwd_flops = 24 * s * h * h + 4 * s * s * h;
    b.quadratic_flops = 4 * s * s * h;
    b.quadratic_act_bytes = 5 * 16 * s * s;
    b.act_bytes = 34 * s * h + b.quadratic_act_bytes;
    b.boundary_bytes = 2 * s * h;
    b.tp_collectives = 2;
    m.blocks.push_back(b);
  }
  m.prologue.parameters = vocab * h;
  m.prologue.fwd_flops = 0;
  m.epilogue.parameters = vocab * h;
  m.epilogue.fwd_flops = 2 * s * h * vocab;
  m.epilogue.act_bytes = 2 * s * vocab;
  return m;
}

}  // namespace hp_test
