// The message tags of pipeline training's boundary tensors (pipeline_stage.cpp explains them).
#pragma once

namespace hp::train::detail {

constexpr int kMaxMicro = 128, kMaxCut = 16, kMaxChunks = 4, kMaxRank = 8;

/// Boundary b's tensor i of micro-batch k, direction 0 (activation) or 1 (gradient), message
/// half 0 (header) or 1 (bytes), on a pipeline of p ranks.
inline int tag_of(int boundary, int p, int micro, int direction, int tensor, int half) {
  const int c = boundary / p;
  return ((((c * kMaxMicro + micro) * 2 + direction) * kMaxCut + tensor) * 2) + half;
}

}  // namespace hp::train::detail
