// Data-parallel training with ZeRO and HSDP (docs/training.md, "Data parallelism").
//
// Every rank of the data-parallel group runs the whole gradient model on its rows of the global
// batch. What one rank would compute on the whole batch is then rebuilt exactly: the loss is a mean
// over label positions, so rank r's loss and gradients are weighted by n_r / N (its label count
// over the group's) before they are summed, which gives the single-rank mean even when ranks hold
// different numbers of ignored (-100) labels.
//
// The gradients and parameters are laid end to end in one flat f32 vector, cut into buckets of
// whole parameters (bucket_bytes; a larger parameter is a bucket of its own), each padded to a
// multiple of the shard count. With `shard` ranks sharing the optimizer (ZeRO), member i of a shard
// group owns the i-th 1/shard of every bucket: it keeps the optimizer state of those elements only,
// updates them, and the group all-gathers the updated parameters bucket by bucket. The levels:
//   0: gradients all-reduced over the group; every rank updates everything (plain DDP);
//   1: gradients all-reduced; each rank updates its shard (optimizer states sharded);
//   2, 3: gradients reduce-scattered within the shard group (each rank only ever holds its shard of
//      the reduced gradients), then all-reduced across the replicas of that shard (HSDP).
//   3: as 2, and the parameters are sharded too (hold_parameters): a rank keeps its shard of every
//      bucket between uses, and the executor borrows each bucket's parameters for the nodes that
//      read them (exec::WeightSource): all-gathered just before a use, one use ahead, on a thread
//      of their own, and freed after it. The update then needs no all-gather.
// HSDP: shard groups are `shard` consecutive members of the data-parallel group; the members with
// the same position in every shard group are the replica group of that shard.
//
// Overlap: a step is begin_step (the label counts, so every rank knows its weight before the
// backward), gradient_ready for each gradient as the executor finishes it (Executor's output
// hook), finish_step. This object's communication thread reduces the buckets while the backward
// goes on, last to first, each once its gradients are all in: a fixed order, so the collectives
// match on every member whatever order they complete in. The transport must allow calls from
// another thread (Transport::any_thread(); otherwise the buckets are reduced in finish_step). The
// thread's collectives run on their own channel (DataParallel::channel), so the compute thread's
// (tensor or expert parallelism) may use the same ranks meanwhile.
//
// The global gradient norm (for clipping) is the square root of the shard group's sum of every
// member's sum of squares over its shard, so clipping is the single-rank clipping. Checkpoints are
// written in the single-rank format (gather_state): any later run resumes them at any degree.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "hp/comm/comm.h"
#include "hp/core/expected.h"
#include "hp/exec/tensor.h"
#include "hp/exec/weight_source.h"
#include "hp/train/optimizer.h"
#include "hp/train/trace.h"

namespace hp::train {

struct DataParallel {
  comm::Transport* transport = nullptr;  ///< not owned; null = one rank
  std::vector<int> group;                ///< global ranks of the data-parallel group, in order
  int zero = 0;                          ///< optimizer_shard level 0..3
  int shard = 0;  ///< HSDP shard group size (divides the group); 0 = the whole group
  std::int64_t bucket_bytes = std::int64_t{16} << 20;  ///< all-reduce chunk
  /// With pipeline parallelism the group is one stage's replicas, and the clip norm is the whole
  /// model's: norm_group are the ranks whose stages' squared norms add up to it (this rank's
  /// pipeline), and counted[k] says whether parameter k counts here (a weight several stages share
  /// counts on the first only). Empty: the group's parameters are the whole model.
  std::vector<int> norm_group;
  std::vector<char> counted;
  /// The gradients arrive weighted already (the gradient model scales the loss's gradient by the
  /// rank's share: expert parallelism), so they are summed as they come.
  bool weighted = false;
  /// ZeRO-3 with tensor parallelism: the executor stores parameter k divided by divisor[k] (a
  /// partial addend, tensor_parallel.h's ParamCut::partial), while the held shards are the values
  /// trained, so a fetch divides. Empty: every divisor is 1.
  std::vector<std::int64_t> divisor;
  /// The communication thread's channel (comm::set_channel): its communicators are its own, so
  /// the executor's collectives (channel 0) may use the same ranks during the run. Two
  /// DataParallelSyncs of one rank whose groups may coincide take different channels.
  int channel = 1;
  /// ZeRO-3 ([parallel] zero3_gather = "per-step"): a bucket gathered for its first use in a step
  /// is kept until the step's backward is done (libs/train/src/step_cache.h).
  bool gather_per_step = false;
  bool active() const { return transport != nullptr && group.size() > 1; }
  /// Position of this rank in `group` (-1 when absent).
  int index() const;
};

/// What a rank holds of the flat parameter vector: pieces of parameters, in order.
struct FlatPiece {
  std::size_t param = 0;    ///< index into the parameter list
  std::int64_t offset = 0;  ///< first element inside the parameter
  std::int64_t count = 0;   ///< elements
};

class DataParallelSync : public exec::WeightSource {
 public:
  /// Lays out `params` (f32, in the gradient model's order). Errc::bad_input when the group does
  /// not contain this rank or `shard` does not divide it, or zero is outside 0..3.
  static Expected<std::unique_ptr<DataParallelSync>> create(
      const DataParallel& dp, const std::vector<exec::HostTensor>& params);
  ~DataParallelSync();

  /// Collective: this rank's loss is a mean over `count` label positions; learns the group's.
  Status begin_step(std::int64_t count);
  /// Gradient `k` (parameter order) is final: weighted into the flat vector; a bucket complete with
  /// it goes to the communication thread. Called on the executor's thread during its run.
  void gradient_ready(std::size_t k, const exec::HostTensor& grad);
  /// Collective: the gradients not handed over yet are taken from `grads`, every bucket reduced;
  /// afterwards `grads` holds this rank's pieces of the reduced gradients (pieces(): its shard, or
  /// everything at level 0) and the return value is the group's loss.
  Expected<double> finish_step(double loss, std::vector<exec::HostTensor>& grads);
  /// begin_step with the group's label count already known (no collective).
  Status begin_step(std::int64_t count, double total);
  /// This rank's share of the group's mean loss (its gradients' weight), after begin_step.
  double share() const { return scale_; }
  /// The group's label positions, after begin_step.
  double total() const { return total_; }
  /// begin_step + finish_step without overlap.
  Expected<double> reduce(double loss, std::int64_t count, std::vector<exec::HostTensor>& grads);

  /// Collective over the shard group: clips and updates this rank's pieces of `params` from
  /// `grads` as finish_step left them (optimizer_step with the global norm), then all-gathers the
  /// updated parameters into `params`. `state` holds the pieces' state. `mirror` (optimizer.h)
  /// applies at level 0 only, where every rank updates whole parameters.
  Expected<StepInfo> update(const OptimizerConfig& c, std::vector<exec::HostTensor>& params,
                            std::vector<exec::HostTensor>& grads, OptimizerState& state,
                            const Mirror& mirror = {});
  /// Collective over the shard group: the squared norm of the gradients this object's group holds
  /// (the counted ones), from `grads` as finish_step left them. Adds norm_group's when it is set.
  Expected<double> squared_norm(const std::vector<exec::HostTensor>& grads, int threads);
  /// update() clipping with `norm`, the whole model's gradient norm found by the caller.
  Expected<StepInfo> update_with_norm(const OptimizerConfig& c,
                                      std::vector<exec::HostTensor>& params,
                                      std::vector<exec::HostTensor>& grads, OptimizerState& state,
                                      double norm, const Mirror& mirror = {});

  /// Collective: `state` (this rank's pieces) gathered into one state per parameter, shaped like
  /// `params` (the single-rank checkpoint format). Every rank receives it.
  Expected<OptimizerState> gather_state(const OptimizerState& state,
                                        const std::vector<exec::HostTensor>& params);
  /// This rank's pieces of a whole-model state (a checkpoint read back), the inverse of
  /// gather_state.
  OptimizerState slice_state(const OptimizerState& whole) const;

  /// ZeRO-3 (level 3, a shard group of several): from now on this object holds the parameters.
  /// It keeps this rank's shard of every bucket, taken from `params`, whose data goes (names,
  /// dtypes and dims stay); update() then updates the shard and gathers nothing. An executor
  /// borrows them with set_weight_source(this, weight_groups()). Called again with whole
  /// parameters (a checkpoint read back), it takes its shard of those. Errc::internal below
  /// level 3 or without sharding.
  Status hold_parameters(std::vector<exec::HostTensor>& params);
  bool holds_parameters() const { return holding_; }
  /// The parameter names of each bucket, the groups an executor borrows.
  std::vector<std::vector<std::string>> weight_groups(
      const std::vector<exec::HostTensor>& params) const;
  /// Collective over the shard group, when holds_parameters(): the whole parameters, shaped and
  /// named like `params` (checkpoints, the saved model).
  Expected<std::vector<exec::HostTensor>> gather_parameters(
      const std::vector<exec::HostTensor>& params);
  // exec::WeightSource: the executor's gathers of bucket g, in the same order on every member.
  void prefetch(std::size_t g) override;
  Status fetch(std::size_t g, std::span<float* const> dst) override;

  const std::vector<FlatPiece>& pieces() const { return pieces_; }
  bool sharded() const { return shard_ > 1; }
  int shard_count() const { return shard_; }
  /// Bytes this object holds for whole gradients: the flat vector, or at ZeRO-3 its bucket
  /// buffers (at most as many of each length as were staged at once; never more than the flat
  /// vector).
  std::int64_t gradient_bytes();
  /// Bytes of the whole flat vector (every bucket, padded).
  std::int64_t flat_bytes() const {
    return buckets_.empty() ? 0 : (buckets_.back().start + buckets_.back().length) * 4;
  }
  /// Seconds the last finish_step waited for reductions still running when the backward ended
  /// (the communication the backward did not hide).
  double exposed_seconds() const { return exposed_; }
  /// Records every bucket's reduction (tid 1) into `trace` (not owned; null = none).
  void set_trace(TraceLog* trace) { trace_ = trace; }

  struct Bucket {
    std::int64_t start = 0, length = 0;  ///< in the flat vector; length a multiple of the shards
    std::size_t first = 0, end = 0;      ///< parameters [first, end)
  };

 private:
  DataParallelSync() = default;
  Status reduce_bucket(const Bucket& b);
  /// Every member's part of bucket b, from and into `flat` (laid out as the flat vector).
  Status allgather_bucket(const Bucket& b, float* flat);
  // ZeRO-3's gradient buffers (data_parallel_zero3.cpp): bucket b's, taken at its first gradient;
  // given back after its reduce-scatter, its shard kept; where this rank's shard of the reduced
  // gradients of flat position `at` (in bucket b) lies.
  float* stage(std::size_t b);
  void unstage(std::size_t b);
  float* reduced(std::size_t b, std::int64_t at);
  /// This rank's part of bucket b in the flat vector.
  std::int64_t own_start(const Bucket& b) const {
    return b.start + position_ * (b.length / shard_);
  }
  void worker();
  /// The parameter shard's element of flat position `at` (inside this rank's part of bucket b).
  float* held(std::size_t b, std::int64_t at) {
    return shard_params_.data() + held_offset_[b] + (at - own_start(buckets_[b]));
  }
  void start_gatherer();

  DataParallel dp_;
  int shard_ = 1;                   ///< members sharing one copy of the optimizer (1 = none)
  std::vector<int> shard_group_;    ///< global ranks of this rank's shard group
  std::vector<int> replica_group_;  ///< global ranks holding the same shard (HSDP)
  int position_ = 0;                ///< in the shard group
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  ///< parameter -> bucket
  std::vector<std::int64_t> offsets_;   ///< flat offset of each parameter
  std::vector<std::int64_t> numel_;
  std::vector<FlatPiece> pieces_;
  std::vector<float>
      flat_;  ///< gradients, then parameters, bucket by bucket (padded); not at ZeRO-3
  // One step's state.
  std::int64_t count_ = 0;
  double total_ = 0;  ///< label positions of the group
  float scale_ = 0;
  std::vector<char> ready_;           ///< per parameter
  std::vector<std::size_t> pending_;  ///< per bucket: gradients still missing
  double exposed_ = 0;
  TraceLog* trace_ = nullptr;
  // The communication thread, and which buckets are complete this step.
  struct Worker;
  std::unique_ptr<Worker> w_;
  // ZeRO-3 (hold_parameters): this rank's part of every bucket's parameters, end to end, and the
  // thread that all-gathers buckets for the executor (data_parallel_zero3.cpp).
  bool holding_ = false;
  std::vector<float> shard_params_;
  std::vector<std::int64_t> held_offset_;  ///< per bucket: its part's start in shard_params_
  // ZeRO-3 keeps no whole flat vector: a bucket's gradients are staged in a buffer of their own
  // only from its first gradient to its reduce-scatter (buffers of the same length reused, so MPI
  // works on warm pages), and this rank's shard of the reduced gradients in grad_shard_ (laid out
  // as shard_params_). The compute thread takes buffers, the reduction thread gives them back.
  std::vector<std::vector<float>> staged_, spare_;
  std::mutex stage_mu_;
  std::vector<float> grad_shard_;
  struct Gatherer;
  std::shared_ptr<Gatherer> g_;
};

}  // namespace hp::train
