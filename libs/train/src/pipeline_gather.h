// ZeRO-3 on a pipeline rank (PipelineStage::lend; docs/training.md, "ZeRO-3 with pipeline
// stages"): the executors of a stage's parts borrow its parameters from the data-parallel sync.
//
// A rank runs several executors (each chunk's forward, input-gradient and weight-gradient parts),
// one after another, once per micro-batch. Each asks for the buckets of its own uses in its own
// order (exec_gather.cpp), and one use ahead only within its run. Here the step's runs are one
// sequence instead: the buckets every action's executor asks for, in action order, which is the
// same on every data-parallel peer of the stage (they run the same schedule on the same
// partition). Each fetch asks for the next request of that sequence, so the first bucket of the
// next action is on its way while this action computes, or while the rank waits for its input.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/weight_source.h"

namespace hp::train::detail {

/// One step's sequence of bucket requests over every part's runs.
class StepGathers {
 public:
  explicit StepGathers(exec::WeightSource& source) : source_(source) {}
  /// The step's requests, in order: the buckets of each action's uses.
  void set_sequence(std::vector<std::size_t> buckets) { sequence_ = std::move(buckets); }
  const std::vector<std::size_t>& sequence() const { return sequence_; }
  /// Before a step's first action (after the last step's update): asks for the step's first
  /// bucket. Errc::internal when the last step left requests unfetched.
  Status begin_step();
  /// Request `fetched` of the step: asks for the one after it, then fetches it.
  Status fetch(std::size_t bucket, std::span<float* const> dst);

 private:
  exec::WeightSource& source_;
  std::vector<std::size_t> sequence_;
  std::size_t asked_ = 0, fetched_ = 0;
};

/// What one part's executor sees: its groups are the buckets' parameters that the part holds
/// (`names`, passed to Executor::set_weight_source); a fetch fills those and skips the rest.
class PartSource : public exec::WeightSource {
 public:
  struct Group {
    std::size_t bucket = 0;
    std::size_t width = 0;        ///< parameters in the bucket
    std::vector<std::size_t> at;  ///< the group's parameters' positions in the bucket
    std::vector<std::string> names;
  };
  PartSource(StepGathers& step, std::vector<Group> groups)
      : step_(step), groups_(std::move(groups)) {}
  const std::vector<Group>& groups() const { return groups_; }
  /// StepGathers asks one request ahead over the whole step; the executor's own asks are not
  /// needed.
  void prefetch(std::size_t) override {}
  Status fetch(std::size_t g, std::span<float* const> dst) override;

 private:
  StepGathers& step_;
  std::vector<Group> groups_;
};

}  // namespace hp::train::detail
