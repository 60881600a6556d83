// One rank's stage of a pipeline-parallel training run (hp/train/pipeline.h): its gradient model,
// split for the schedule, one executor per part, and one step's actions over the micro-batches.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/exec/executor.h"
#include "hp/train/stages.h"
#include "hp/train/trace.h"
#include "hp/train/trainer.h"
#include "send_progress.h"

namespace hp::train::detail {

class PipelineStage {
 public:
  /// Cuts `forward` at o.pp.cuts, builds this stage's gradient model at `dims` (a micro-batch's)
  /// and its parts. Errc::bad_input when the cuts do not split the model (split_pipeline's errors),
  /// are not one per pair of stages, or for more than 128 micro-batches or 64 tensors at a
  /// boundary (the tags).
  static Expected<std::unique_ptr<PipelineStage>> create(const TrainOptions& o,
                                                         const model::Model& forward,
                                                         const model::DimBindings& dims);

  /// Runs this rank's actions of one step. `micro` holds each micro-batch's data inputs and labels
  /// (named); `total_labels` is the global batch's label positions. Afterwards grads() holds the
  /// whole batch's gradients of this stage's parameters (shared weights' summed over their stages)
  /// and the return value is the global batch's loss, on every rank of the pipeline.
  Expected<double> run_step(const std::vector<std::vector<exec::HostTensor>>& micro,
                            std::int64_t total_labels);
  /// sqrt of the whole model's sum of squared gradients (collective; shared weights once).
  Expected<double> global_norm();
  /// Writes `params` (this stage's, in params() order) into every part holding them.
  Status set_weights(const std::vector<exec::HostTensor>& params);

  const std::vector<std::string>& params() const { return gg_.params; }
  std::vector<exec::HostTensor>& grads() { return grads_; }
  /// This stage's current parameter values (host copies from the executors).
  Expected<std::vector<exec::HostTensor>> read_params();
  /// Whether this stage is the first of those reading parameter `name` (every stage reading a
  /// shared weight has the same gradient and update; the first one counts and saves it).
  bool owns(const std::string& name) const;
  const GradGraph& grad_graph() const { return gg_; }
  /// The largest part's executor peak plus the most bytes of micro-batch tensors (stashes,
  /// boundary tensors and their gradients) this stage held between actions in the last step: what
  /// a schedule's order costs in memory (GPipe holds every micro-batch's stash, 1F1B at most p).
  std::int64_t peak_bytes() const;
  bool last() const { return stage_ + 1 == static_cast<int>(role_.ranks.size()); }
  /// Records every action of the following steps ("F 3.1": step 3, micro-batch 1; the wait for its
  /// input before it as "wait F 3.1", category "wait") into `trace` (not owned; null = none).
  void set_trace(TraceLog* trace) { trace_ = trace; }

 private:
  struct Part {
    GradPart part;
    std::unique_ptr<exec::Executor> ex;  ///< null for an empty part
  };
  using Env = std::map<std::string, exec::HostTensor>;
  PipelineStage() = default;
  Status run_part(Part& p, Env& env, float scale);
  Status send(int peer, int tag, const exec::HostTensor& t);
  Expected<exec::HostTensor> recv(int peer, int tag, const std::string& name);
  /// The transport's turn (send_progress.h) during a step; an empty lock otherwise.
  std::unique_lock<std::mutex> hold();

  PipelineRole role_;
  int stage_ = 0;
  GradGraph gg_;
  /// PipelinePieces::shared for the weights this stage trains: name -> the ranks reading it.
  std::map<std::string, std::vector<int>> shared_;
  std::map<std::string, bool> owned_;   ///< shared weights: whether this stage is their first
  std::vector<std::string> float_in_;   ///< received tensors whose gradient goes back
  std::vector<std::string> float_out_;  ///< sent tensors whose gradient comes back
  Part forward_, backward_, weight_;
  std::map<std::string, std::size_t> grad_index_;  ///< gradient output -> parameter
  std::vector<exec::HostTensor> grads_;
  double loss_ = 0;
  LossKind loss_kind_ = LossKind::cross_entropy;
  TraceLog* trace_ = nullptr;
  SendProgress* progress_ = nullptr;  ///< during run_step
  std::int64_t step_ = 0;             ///< steps run (trace names)
  std::int64_t held_peak_ = 0;        ///< most bytes held in the micro-batches' tensors, last step
};

}  // namespace hp::train::detail
