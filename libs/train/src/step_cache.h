// ZeRO-3's per-step gathering ([parallel] zero3_gather = "per-step"; docs/training.md, "Per-step
// gathers"): a weight source in front of the syncs that hold the shards. The first use of a bucket
// in a step gathers it as usual and keeps the whole bucket; its later uses in the step (the
// backward's, every other micro-batch's) copy from the kept bucket without communication. After
// the step's backward the buckets are freed, since the update changes the shards. The real
// gathers are the first uses, in the same order on every rank of a shard group (the same actions
// over the same partition), so the collectives still pair up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/tensor.h"
#include "hp/exec/weight_source.h"

namespace hp::train::detail {

class StepCache : public exec::WeightSource {
 public:
  /// `sizes[g]`: the element count of every parameter of `inner`'s group g, in the group's order.
  StepCache(exec::WeightSource& inner, std::vector<std::vector<std::int64_t>> sizes);
  /// Asks `inner` for a bucket not kept yet (once per step).
  void prefetch(std::size_t g) override;
  /// The kept bucket, or gathered now (and kept); null destinations are skipped.
  Status fetch(std::size_t g, std::span<float* const> dst) override;
  /// The step's backward is done: frees every kept bucket.
  void end_step();
  std::int64_t peak_bytes() const { return peak_; }   ///< the most kept at once in any step
  std::size_t gathered() const { return gathered_; }  ///< real gathers since construction

 private:
  exec::WeightSource& inner_;
  std::vector<std::vector<std::int64_t>> sizes_;
  std::vector<std::vector<std::vector<float>>> kept_;  ///< per group, per parameter
  std::vector<char> held_, asked_;
  std::int64_t bytes_ = 0, peak_ = 0;
  std::size_t gathered_ = 0;
};

/// A StepCache over `inner`, whose groups are `groups` (parameter names), each parameter sized as
/// its entry of `params` (names and dims; a held parameter has no data). Errc::internal when a
/// group names a parameter `params` lacks.
Expected<std::unique_ptr<StepCache>> make_step_cache(
    exec::WeightSource& inner, const std::vector<std::vector<std::string>>& groups,
    const std::vector<exec::HostTensor>& params);

/// What an executor (or a pipeline stage's parts) borrows `groups` of `source` (a sync) from: the
/// sync itself, or with `per_step` a StepCache in front of it, made into `cache`.
Expected<exec::WeightSource*> lend_through(std::unique_ptr<StepCache>& cache,
                                           exec::WeightSource& source,
                                           const std::vector<std::vector<std::string>>& groups,
                                           const std::vector<exec::HostTensor>& params,
                                           bool per_step);

}  // namespace hp::train::detail
