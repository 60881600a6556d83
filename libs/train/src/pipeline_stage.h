// One rank's part of a pipeline-parallel training run (hp/train/pipeline.h): the model chunks
// (virtual stages) it holds — one, or two and more under interleaved 1F1B and ZB-V — each with its
// gradient model split for the schedule and one executor per part, and one step's actions over the
// micro-batches.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/exec/executor.h"
#include "hp/train/stages.h"
#include "hp/train/trace.h"
#include "hp/train/trainer.h"
#include "pipeline_gather.h"
#include "send_progress.h"

namespace hp::train::detail {

class PipelineStage {
 public:
  /// Cuts `forward` at o.pp.cuts, builds the gradient models of this rank's virtual stages at
  /// `dims` (a micro-batch's) and their parts. Errc::bad_input when the cuts do not split the model
  /// (split_pipeline's errors), are not one per pair of virtual stages, or for more than 128
  /// micro-batches, 16 tensors at a boundary or 4 chunks per rank (the tags).
  static Expected<std::unique_ptr<PipelineStage>> create(const TrainOptions& o,
                                                         const model::Model& forward,
                                                         const model::DimBindings& dims);

  /// Runs this rank's actions of one step. `micro` holds each micro-batch's data inputs and labels
  /// (named); `total_labels` is the global batch's label positions. Afterwards grads() holds the
  /// whole batch's gradients of this rank's parameters (shared weights' summed over their stages)
  /// and the return value is the global batch's loss, on every rank of the pipeline.
  /// Under expert parallelism (TrainOptions::ep: the stage's replicas share its experts out)
  /// `share` is this replica's share of the stage's data-parallel group's label positions: the
  /// last stage's gradient model multiplies the loss's gradient by it (GradSpec::loss_scale), as
  /// every member's contributions mix in its experts' gradients, so the stage's gradients come out
  /// weighted for summing (DataParallel::weighted).
  Expected<double> run_step(const std::vector<std::vector<exec::HostTensor>>& micro,
                            std::int64_t total_labels, double share = 1.0);
  /// sqrt of the whole model's sum of squared gradients (collective; shared weights once).
  Expected<double> global_norm();
  /// Writes `params` (this rank's, in params() order) into every part holding them.
  Status set_weights(const std::vector<exec::HostTensor>& params);

  /// This rank's parameters: each of its chunks' in turn, a weight two chunks read once.
  const std::vector<std::string>& params() const { return params_; }
  std::vector<exec::HostTensor>& grads() { return grads_; }
  /// This rank's current parameter values (host copies from the executors).
  Expected<std::vector<exec::HostTensor>> read_params();
  /// Whether this rank holds the first virtual stage reading parameter `name` (every rank reading a
  /// shared weight has the same gradient and update; the first one counts and saves it).
  bool owns(const std::string& name) const;
  /// What building the chunks' gradient models noted (tied weights, ...).
  std::vector<std::string> notes() const;
  /// The largest part's executor peak plus the most bytes of micro-batch tensors (stashes,
  /// boundary tensors and their gradients) this rank held between actions in the last step: what
  /// a schedule's order costs in memory (GPipe holds every micro-batch's stash, 1F1B at most p).
  std::int64_t peak_bytes() const;
  /// Tensor parallelism (TrainOptions::tp): the weights split over the stage's tensor-parallel
  /// group (the same cuts on every stage; empty without it).
  const std::map<std::string, ParamCut>& cuts() const { return cuts_; }
  /// Records every action of the following steps ("F 3.1": step 3, micro-batch 1, its virtual
  /// stage in args; the wait for its input before it as "wait F 3.1", category "wait") into
  /// `trace` (not owned; null = none).
  void set_trace(TraceLog* trace) { trace_ = trace; }
  /// Called during run_step with each parameter's gradient (params() order) as soon as the step's
  /// last action adding to it has run, so that data parallelism can reduce it while the rest of
  /// the schedule runs. Weights several stages share are not handed over (they are summed over
  /// those stages at the end of the step).
  void set_gradient_hook(std::function<void(std::size_t, const exec::HostTensor&)> hook) {
    hook_ = std::move(hook);
    finals_ = finals();  // the action lists are the same every step
  }
  /// Expert parallelism: per member of the stage's expert group, the experts it holds of this
  /// rank's chunks (partition_experts' experts_of, the chunks' lists end to end), and the layers
  /// found (all, routed, summed) in them.
  const std::vector<std::vector<std::string>>& experts_of() const { return experts_of_; }
  std::array<int, 3> expert_layers() const { return expert_layers_; }
  /// Seconds the last step spent in the parts' "hp"-domain collectives (tensor parallelism).
  double comm_seconds() const { return comm_seconds_; }
  /// ZeRO-3: from now on the parts' executors borrow this rank's parameters from `source` (not
  /// owned; the data-parallel sync), whose groups are `buckets` (parameter names, params()'
  /// order). Each part borrows the buckets' parameters it holds, and the step's requests are
  /// served one ahead over all of its actions (pipeline_gather.h). set_weights and read_params
  /// then refuse these parameters. Before the first step.
  Status lend(exec::WeightSource* source, const std::vector<std::vector<std::string>>& buckets);
  /// After lend: the buckets one step asks for, in order (empty before).
  std::vector<std::size_t> gather_sequence() const {
    return gathers_ ? gathers_->sequence() : std::vector<std::size_t>{};
  }

 private:
  struct Part {
    GradPart part;
    std::unique_ptr<PartSource> source;  ///< ZeRO-3 (lend): where the executor's weights come from
    std::unique_ptr<exec::Executor> ex;  ///< null for an empty part
  };
  /// One virtual stage of the model on this rank.
  struct Chunk {
    int stage = 0;  ///< virtual stage
    GradGraph gg;
    Part forward, backward, weight;
    std::vector<std::string> float_in;              ///< received tensors whose gradient goes back
    std::vector<std::string> float_out;             ///< sent tensors whose gradient comes back
    std::map<std::string, std::size_t> grad_index;  ///< gradient output -> rank parameter
    /// The loss's gradient is scaled inside the gradient model (expert parallelism's last stage:
    /// kLossScaleInput), so its outputs are not scaled afterwards.
    bool graph_scale = false;
  };
  using Env = std::map<std::string, exec::HostTensor>;
  PipelineStage() = default;
  Status run_part(Chunk& c, Part& p, Env& env, float scale);
  Status run_action(const PipelineAction& a, std::vector<std::vector<Env>>& env,
                    const std::vector<float>& scale);
  Status send(int peer, int tag, const exec::HostTensor& t);
  Expected<exec::HostTensor> recv(int peer, int tag, const std::string& name);
  /// The transport's turn (send_progress.h) during a step; an empty lock otherwise.
  std::unique_lock<std::mutex> hold();
  int rank_of(int virtual_stage) const {
    return role_.ranks[static_cast<std::size_t>(role_.position(virtual_stage))];
  }
  bool mine(int virtual_stage) const { return role_.position(virtual_stage) == role_.stage; }
  Chunk* chunk(int virtual_stage);
  /// The part of chunk `c` that an action of this kind runs.
  static Part& part_of(Chunk& c, PipelineAction::Kind kind) {
    return kind == PipelineAction::Kind::forward    ? c.forward
           : kind == PipelineAction::Kind::backward ? c.backward
                                                    : c.weight;
  }
  /// Per action of the step: the parameters whose gradient is final after it (the hook's).
  std::vector<std::vector<std::size_t>> finals();

  /// The executors' collectives of a tensor-parallel stage, each taking the transport's turn
  /// (hold()) as the boundary messages do.
  class LockedComm : public exec::CommOps {
   public:
    LockedComm(comm::Transport& t, PipelineStage& s) : inner_(t), s_(s) {}
    bool handles(const std::string& op) const override { return inner_.handles(op); }
    Status run(const exec::CommNode& n, const std::vector<const exec::HostTensor*>& in,
               std::vector<exec::HostTensor>& out) override {
      auto turn = s_.hold();
      return inner_.run(n, in, out);
    }
    Status run_into(const exec::CommNode& n, const std::vector<exec::CommTensor>& in,
                    const exec::CommAlloc& alloc) override {
      auto turn = s_.hold();
      return inner_.run_into(n, in, alloc);
    }

   private:
    comm::TransportCommOps inner_;
    PipelineStage& s_;
  };
  /// Virtual stage `vs`'s forward piece: the cut of the forward model, or under tensor
  /// parallelism this rank's partition of it (Recv/Send as graph inputs/outputs).
  Expected<model::Model> piece(const TrainOptions& o, const PipelinePieces& pieces, int vs,
                               GradSpec& spec);
  /// Under expert parallelism: this member's partition of the piece (partition_experts), or the
  /// piece itself where it holds no expert layer.
  Expected<model::Model> expert_piece(const TrainOptions& o, const model::Model& piece, int vs,
                                      GradSpec& spec);

  PipelineRole role_;
  std::unique_ptr<LockedComm> comm_;  ///< tensor or expert parallelism only
  std::map<std::string, ParamCut> cuts_;
  std::unique_ptr<StepGathers> gathers_;  ///< ZeRO-3 (lend); before chunks_, which use it
  std::vector<Chunk> chunks_;
  std::vector<std::string> params_;
  /// PipelinePieces::shared for the weights this rank trains and other ranks read too: name -> the
  /// ranks reading it.
  std::map<std::string, std::vector<int>> shared_;
  std::map<std::string, bool> owned_;  ///< shared weights: whether this rank's chunk is the first
  std::vector<exec::HostTensor> grads_;
  double loss_ = 0;
  double share_ = 1.0;  ///< run_step's share (expert parallelism's in-graph loss scale)
  std::vector<std::vector<std::string>> experts_of_;
  /// Expert parallelism: cut tensor -> the batch dim the whole model has on its axis 0.
  std::map<std::string, std::string> row_symbol_;
  std::array<int, 3> expert_layers_{};
  LossKind loss_kind_ = LossKind::cross_entropy;
  TraceLog* trace_ = nullptr;
  std::function<void(std::size_t, const exec::HostTensor&)> hook_;
  std::vector<std::vector<std::size_t>> finals_;  ///< finals(), once the hook is set
  SendProgress* progress_ = nullptr;              ///< during run_step
  std::int64_t step_ = 0;                         ///< steps run (trace names)
  std::int64_t held_peak_ = 0;  ///< most bytes held in the micro-batches' tensors, last step
  double comm_seconds_ = 0;     ///< in collectives, last step
};

}  // namespace hp::train::detail
