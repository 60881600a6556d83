// Helpers shared by the planner tests.
#pragma once

#include "hp/planner/planner.h"

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

}  // namespace hp_test
