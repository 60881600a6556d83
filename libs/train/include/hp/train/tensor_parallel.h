// Tensor-parallel training (docs/training.md, "Tensor parallelism").
//
// Each member of the tensor-parallel group trains its partition of the model, the one hp shard
// writes for it (Megatron's column- and row-parallel layers, vocabulary-parallel embeddings, fused
// q|k|v blocks, whatever propagation chose): the partition is differentiated with the conjugate of
// every collective in it, and with an all-reduce of the gradient wherever a tensor every member
// holds whole enters a region the members compute in parts (GradSpec::tp). Each member then holds
// the exact gradient of its slice of every split weight, and the whole gradient of every
// replicated one (the same on every member), so the optimizer updates slices independently and
// replicated weights stay equal. The clip norm adds the split weights' squares over the group and
// counts a replicated weight once. Checkpoints and the saved model are gathered into the one-rank
// format through the weights' layouts, and a checkpoint resumes at any degree by slicing.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/comm/comm.h"
#include "hp/core/expected.h"
#include "hp/exec/tensor.h"
#include "hp/train/optimizer.h"
#include "hp/train/sharded_checkpoint.h"

namespace hp::train {

/// How a weight is cut over the group: its global shape, the shape of the view its members' slices
/// are contiguous blocks of (a fused q|k|v dim is [k, n/k] there), and each member's block.
struct ParamCut {
  std::vector<std::int64_t> shape, view;
  /// ranges[member][view dim] = [begin, end)
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> ranges;
  /// > 1: every member stores the whole value divided by this, an addend of a pending sum (a
  /// bias under a row-parallel Gemm). Its gradient is the whole one on every member, so each
  /// trains the whole value (the same on all) and hands the executor its share.
  std::int64_t partial = 1;
};

/// One member's part of the model, as hp shard builds it.
struct TensorParallelPart {
  std::string onnx;                      ///< serialized forward partition (RankPartition::onnx)
  std::vector<std::string> varying;      ///< RankPartition::varying
  std::map<std::string, ParamCut> cuts;  ///< the weights split over the group (others: whole)
};

struct TensorParallel {
  comm::Transport* transport = nullptr;  ///< not owned; null = no tensor parallelism
  std::vector<int> group;                ///< global ranks of the group, in member order
  /// With data parallelism: grid[d] is the tensor-parallel group of data-parallel index d (the
  /// rows of hp shard's [dp, tp] stage mesh); what the job layer places, kept so each rank finds
  /// its own group and position.
  std::vector<std::vector<int>> grid;
  int position = 0;  ///< this rank's position on the [dp, tp] mesh (row-major)
  /// With pipeline and data parallelism: every rank of this rank's data-parallel replica (all its
  /// stages' tensor-parallel groups), over which the clip norm is added.
  std::vector<int> replica;
  /// Builds the part of (virtual) pipeline stage `stage` at mesh position `position` (the job
  /// layer partitions the recipe; hp/job/train_run.h). `ranks`, when given, are the global ranks
  /// that run the stage at each mesh position, where they differ from hp shard's placement (ZB-V's
  /// V puts the second chunk on other ranks than interleaving does): the collectives' groups are
  /// renamed to them.
  std::function<Expected<TensorParallelPart>(int stage, int position,
                                             const std::vector<int>& ranks)>
      partition;
  bool active() const { return transport != nullptr && group.size() > 1; }
  int index() const;  ///< this rank's position in `group` (-1 when absent)
};

/// The group's collectives over one member's parameters (f32, in its gradient model's order).
class TensorParallelSync {
 public:
  /// Errc::bad_input when a parameter's slice does not match its cut, or a parameter (split or
  /// whole) is not float32.
  static Expected<std::unique_ptr<TensorParallelSync>> create(
      const TensorParallel& tp, const std::map<std::string, ParamCut>& cuts,
      const std::vector<exec::HostTensor>& params);
  /// sqrt of the whole model's sum of squared gradients (collective).
  Expected<double> global_norm(const std::vector<exec::HostTensor>& grads) const;
  /// Whole tensors from every member's slices, in `params` order (collective; every member gets
  /// them). `like` names each tensor (the parameters), `slices` may be gradients or optimizer
  /// state shaped like them.
  Expected<std::vector<exec::HostTensor>> gather(const std::vector<exec::HostTensor>& slices) const;
  /// This member's slice of each whole tensor (named as the parameters, in their order).
  Expected<exec::HostTensor> slice(std::size_t param, const exec::HostTensor& whole) const;
  bool split(std::size_t param) const { return cuts_[param] != nullptr; }
  /// Where this member's slice of parameter `param` lies in the whole tensor, as runs of its
  /// row-major elements in the slice's order (a whole one: one run), and the whole tensor's dims:
  /// what a sharded checkpoint records and reads (sharded_checkpoint.h).
  std::vector<Extent> runs(std::size_t param) const;
  std::vector<std::int64_t> whole_dims(std::size_t param) const;
  /// Partial addends (ParamCut::partial): `params` as read from the executor become the values
  /// trained (times the addend count), and stored() is what goes back to the executor.
  void to_trained(std::vector<exec::HostTensor>& params) const;
  exec::HostTensor stored(std::size_t param, const exec::HostTensor& trained) const;
  /// ParamCut::partial of parameter `param` (1: the executor stores the value trained).
  std::int64_t partial(std::size_t param) const { return partial_[param]; }

 private:
  TensorParallelSync() = default;
  const TensorParallel* tp_ = nullptr;
  int index_ = 0;
  std::vector<std::string> names_;
  std::vector<std::vector<std::int64_t>> local_dims_;
  std::vector<const ParamCut*> cuts_;  ///< per parameter; null = whole on every member
  std::vector<std::int64_t> partial_;  ///< per parameter: ParamCut::partial (1: none)
  std::map<std::string, ParamCut> owned_;
};

}  // namespace hp::train
