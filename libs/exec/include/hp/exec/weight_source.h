// The seam between the executor and whoever holds weights it does not keep
// (Executor::set_weight_source): ZeRO-3's data-parallel ranks.
#pragma once

#include <cstddef>
#include <span>

#include "hp/core/expected.h"

namespace hp::exec {

/// Where the weights an executor does not keep come from (Executor::set_weight_source). ZeRO-3
/// keeps only each data-parallel rank's share of the parameters between uses and gathers a group
/// of them from the other ranks just before it is read (hp/train/data_parallel.h).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// Starts bringing group `g` in. The executor asks one use ahead: while the group of the use in
  /// progress is being computed with, the next use's is on its way.
  virtual void prefetch(std::size_t g) = 0;
  /// Writes group `g`'s weights, in the group's order, to `dst` (each its weight's float32
  /// elements), waiting for the prefetch of `g` when one is under way; a null destination skips
  /// its weight (a caller borrowing part of a group). Every prefetch(g) is followed by a
  /// fetch(g), in the same order.
  virtual Status fetch(std::size_t g, std::span<float* const> dst) = 0;
};

}  // namespace hp::exec
