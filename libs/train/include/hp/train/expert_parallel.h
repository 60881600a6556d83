// Expert parallelism in training (docs/training.md, "Expert parallelism").
//
// A mixture-of-experts layer as PyTorch exports a ModuleList of experts: every expert reads the
// layer's tokens and its own weights, and torch.stack puts their outputs side by side (Unsqueeze
// each, one Concat along the expert axis). The router then picks or weights the experts' rows.
// With expert parallelism the ranks of a group (ep of them, carved out of the data-parallel ranks,
// each training on its own rows) hold E/ep experts each: a member all-gathers the group's tokens
// (the dispatch), runs its own experts on all of them, and one all-to-all sends each member the
// rows of its tokens from every expert (the combine), so the layer's output on every member is what
// the whole model computes for its rows. Each expert's weights live on one member of the group; the
// gradient comes back through the conjugates (the reverse all-to-all, and a reduce-scatter of the
// tokens' gradient: rules_comm.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hp/comm/comm.h"
#include "hp/core/expected.h"
#include "hp/exec/tensor.h"
#include "hp/model/graph.h"
#include "hp/model/model.h"
#include "hp/train/data_parallel.h"
#include "hp/train/optimizer.h"
#include "hp/train/trace.h"

namespace onnx {
class GraphProto;
}

namespace hp::train {

/// The experts of one mixture-of-experts layer of a graph.
struct ExpertLayer {
  std::string tokens;   ///< the float tensor every expert reads (its token axis is 0)
  std::string stacked;  ///< the Concat output: every expert's output along `axis`
  std::int64_t axis = 1;
  int concat = -1;                                ///< the Concat node's index
  std::vector<int> unsqueeze;                     ///< per expert: the node stacking its output
  std::vector<std::vector<int>> nodes;            ///< per expert: the nodes only it needs
  std::vector<std::vector<std::string>> weights;  ///< per expert: the initializers only it reads
};

/// The expert layers of `g`: each Concat along an axis >= 1 of E >= 2 Unsqueeze outputs (on that
/// axis) whose inputs are computed by disjoint sets of nodes that read one float tensor shared by
/// all of them (the tokens), constants, and float initializers no other node reads (at least one
/// per expert), and whose values nothing else reads.
std::vector<ExpertLayer> find_expert_layers(const onnx::GraphProto& g);

/// One member's part of a model under expert parallelism.
struct ExpertPartition {
  std::string onnx;  ///< serialized model: shared nodes, this member's experts, the collectives
  /// Tensors whose values differ across the group for the same tokens (this member's experts'
  /// weights and values): the gradient of a group-wide tensor they read (the gathered tokens) is
  /// summed over the members (GradSpec::tp).
  std::vector<std::string> varying;
  /// Per member of the group: the expert initializers it holds, in graph order.
  std::vector<std::vector<std::string>> experts_of;
  int layers = 0;  ///< expert layers found
  int routed = 0;  ///< of them, dispatched by their routing (hp.Dispatch / hp.Combine)
  /// of them, loops that add each expert's rows into a sum (expert_accumulate.h): run on the
  /// all-gathered rows, the members' partial sums reduce-scattered
  int summed = 0;
};

/// Member `member` of the expert-parallel group `group` (global ranks in member order): `m` keeping
/// experts [member*E/p, (member+1)*E/p) of every expert layer. With `routed` and a layer whose
/// stack is read only at the pairs its top-k router chose (expert_route.cpp), hp.Dispatch sends
/// each token's rows to the members holding its experts only and hp.Combine brings the results
/// back into the tensor the layer stacked (the other pairs zero); otherwise the tokens are
/// hp.AllGather'ed over the group (axis 0) before the experts and the stacked outputs
/// hp.AllToAll'ed (split axis 0, concatenated along the expert axis) back. A layer written as a
/// loop adding each expert's rows into a sum (Mixtral's torch.where / index_add_:
/// libs/train/src/expert_accumulate.h) runs on every member's rows, all-gathered, with this
/// member's experts only, and its partial sum is hp.ReduceScatter'ed (axis 0) back into the
/// member's rows. Errc::bad_input when the model has no expert layer or a layer's expert count is
/// not a multiple of the group. `dims` (the rank's input dims) let such a layer read a shape from
/// outside it that does not depend on the rows (checked by inferring the graph's shapes at `dims`
/// and at twice the batch); without them it may read none.
/// `allow_none`: a model without expert layers (a pipeline stage holding none of its experts) gives
/// layers == 0 and an empty `onnx`, the caller keeping its model, instead of an error.
Expected<ExpertPartition> partition_experts(const model::Model& m, const std::vector<int>& group,
                                            int member, bool routed = true,
                                            const model::DimBindings& dims = {},
                                            bool allow_none = false);

/// Where a rank stands under expert parallelism. The data-parallel ranks `data` each train on their
/// rows of the batch; they are cut into expert-parallel groups of consecutive ranks, and the ranks
/// at the same position of every group hold the same experts (`replicas`).
struct ExpertParallel {
  comm::Transport* transport = nullptr;  ///< not owned; null = none
  std::vector<int> group;                ///< this rank's expert-parallel group, member order
  std::vector<int> data;                 ///< every data-parallel rank (the shared weights' group)
  std::vector<int> replicas;             ///< the ranks holding this rank's experts (it included)
  int zero = 0;  ///< optimizer_shard level: the shared weights shard over `data`, experts over
                 ///< `replicas` (data_parallel.h)
  /// HSDP (`shard_group`): the shared weights shard within consecutive groups of this many ranks of
  /// `data` (0: all of them) and replicate across groups; an expert shards over the ranks holding
  /// it within the same group. It must be a multiple or a divisor of the group's size.
  int shard = 0;
  std::int64_t bucket_bytes = std::int64_t{16} << 20;
  /// Dispatch each token to its top-k experts' members only, where the graph allows it
  /// (partition_experts); false: all-gather the tokens.
  bool routed = true;
  /// ZeRO-3: buckets kept from their first use to the step's end (DataParallel::gather_per_step).
  bool gather_per_step = false;
  /// With pipeline stages (the groups above are one stage's replicas): the ranks whose squared
  /// gradient norms add up to the whole model's (this rank's pipeline), and per parameter of the
  /// rank whether it counts here (a weight several stages share counts on its first stage only).
  /// Empty: the model is whole on every member.
  std::vector<int> norm_group;
  std::vector<char> counted;
  bool active() const { return transport != nullptr && group.size() > 1; }
  int index() const;  ///< this rank's position in `group` (-1 when absent)
  int part() const;   ///< this rank's position in `data`: which rows of a batch it trains on
};

/// The reductions and the optimizer of one member's parameters (f32, in its gradient model's
/// order). The loss's gradient on each rank is scaled by its share of the group's label positions
/// (GradSpec::loss_scale) before the experts' gradients of several ranks' tokens mix, so summing is
/// all that is left: the shared weights' gradients over `data`, the experts' over `replicas`. Each
/// of the two is a DataParallelSync (data_parallel.h) with weighted gradients: buckets reduced
/// while the backward runs (each on its own channel, so neither meets the backward's collectives
/// nor the other's where their ranks coincide), and ZeRO's levels within its group. The clip norm
/// adds the experts' squares over the group and counts the shared weights once.
class ExpertParallelSync : public exec::WeightSource {
 public:
  /// `experts_of` as partition_experts gives it. Errc::bad_input when a parameter is not f32.
  static Expected<std::unique_ptr<ExpertParallelSync>> create(
      const ExpertParallel& ep, const std::vector<exec::HostTensor>& params,
      std::vector<std::vector<std::string>> experts_of);
  /// Collective over `data`: this rank's loss is a mean over `count` label positions; returns its
  /// share of the group's (the loss scale to feed the step).
  Expected<double> begin_step(std::int64_t count);
  /// Gradient `k` (parameter order) is final (the executor's output hook, during the run).
  void gradient_ready(std::size_t k, const exec::HostTensor& grad);
  /// Collective: the group's loss (the shares' weighted sum); `grads` becomes this rank's pieces of
  /// the summed gradients (the shared weights' first, then the experts'), as update() takes them.
  Expected<double> finish_step(double loss, std::vector<exec::HostTensor>& grads);
  /// Collective: clips with the whole model's gradient norm and updates this rank's pieces;
  /// `params` afterwards hold the member's updated parameters. `state` holds the pieces' state.
  Expected<StepInfo> update(const OptimizerConfig& c, std::vector<exec::HostTensor>& params,
                            std::vector<exec::HostTensor>& grads, OptimizerState& state);
  /// Collective over the shard groups: the member's whole state, in parameter order and shaped
  /// like its parameters, from this rank's (its pieces, the shared weights' first); slice_state is
  /// the inverse (no collective).
  Expected<OptimizerState> gather_state(const OptimizerState& state);
  OptimizerState slice_state(const OptimizerState& whole) const;
  /// Collective over the group: the whole model's tensors from every member's (`mine`: shaped
  /// like its parameters, which name them), in the order of `forward`'s initializers, whose dims
  /// give the other members' experts.
  Expected<std::vector<exec::HostTensor>> gather(const std::vector<exec::HostTensor>& mine,
                                                 const model::Model& forward) const;
  bool expert(std::size_t param) const { return expert_[param] != 0; }
  /// ZeRO-3 (level 3): from now on each sync over several ranks holds its shards, the shared
  /// weights' over `data` and the experts' over `replicas` (one rank holding its experts has
  /// nothing to shard them with), and those entries of `params` have no data. The executor
  /// borrows them from this object (a WeightSource) in held_groups(). Called again with whole
  /// parameters (a checkpoint read back), the syncs take their shards of those.
  Status hold(std::vector<exec::HostTensor>& params);
  bool holds_shared() const;
  bool holds_experts() const;
  /// Whether parameter k is held by a sync (hold), not by the executor.
  bool holds(std::size_t k) const { return expert_[k] ? holds_experts() : holds_shared(); }
  DataParallelSync& shared_sync() { return *shared_; }
  DataParallelSync& expert_sync() { return *experts_; }
  /// The held buckets' parameter names: the shared weights' buckets first (shared_groups() of
  /// them, gathered over `data`), then the experts' (gathered over `replicas`).
  std::vector<std::vector<std::string>> held_groups() const;
  std::size_t shared_groups() const { return shared_groups_; }
  /// Collective over `data`: the shared weights' gathers span every data-parallel rank while the
  /// members run different partitions, so each must ask for the shared buckets in one order.
  /// `sequence`: the buckets this rank's step asks for (held_groups() indices).
  /// Errc::not_implemented naming `where` when the orders differ (experts of different shapes can
  /// cause it).
  Status same_shared_order(const std::vector<std::size_t>& sequence,
                           const std::string& where) const;
  /// `params` with the held entries all-gathered (collective over their shard groups).
  Expected<std::vector<exec::HostTensor>> with_held(const std::vector<exec::HostTensor>& params);
  // exec::WeightSource over held_groups(): each request goes to the sync holding the bucket.
  void prefetch(std::size_t g) override;
  Status fetch(std::size_t g, std::span<float* const> dst) override;
  bool sharded() const;
  void set_trace(TraceLog* trace);
  ~ExpertParallelSync();

 private:
  ExpertParallelSync() = default;
  /// Splits a list in parameter order into the shared weights' and the experts'.
  template <class T>
  std::pair<std::vector<T>, std::vector<T>> split(std::vector<T> all) const;
  ExpertParallel ep_;
  std::vector<std::string> names_;
  std::vector<char> expert_;     ///< per parameter: one of this member's experts, or not
  std::vector<std::size_t> at_;  ///< per parameter: its index in its own sync's list
  /// The shared weights' and the experts' names and dims (no data), as each sync lays them out.
  std::vector<exec::HostTensor> shapes_[2];
  std::vector<std::vector<std::string>> experts_of_;
  std::unique_ptr<DataParallelSync> shared_, experts_;
  std::size_t shared_pieces_ = 0;  ///< after finish_step: the shared weights' pieces come first
  std::size_t shared_groups_ = 0;  ///< held_groups() that are the shared weights'
};

}  // namespace hp::train
