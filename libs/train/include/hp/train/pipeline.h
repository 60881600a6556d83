// Pipeline-parallel training (docs/training.md, "Pipeline parallelism").
//
// The model is cut into stages (stages.h: split_pipeline at the recipe's stage boundaries);
// each rank of the pipeline holds one stage's gradient model, split for the schedule into forward,
// backward (B) and, for the zero-bubble schedules, weight (W) parts, and runs its list of actions
// over the micro-batches of every global batch. Activations go forward and their gradients back
// point to point, tagged per (micro-batch, direction, tensor). The result is what one rank trains:
// every micro-batch's loss gradient is weighted by its share of the global batch's label positions,
// weights read by several stages (an embedding tied to the head) have their gradient parts summed
// over those stages' ranks, and the gradient norm for clipping is that of the whole model.
#pragma once

#include <string>
#include <vector>

#include "hp/comm/comm.h"

namespace hp::train {

/// One compute action of a rank's schedule (hp/job/schedule.h gives the lists).
struct PipelineAction {
  enum class Kind { forward, backward, weight };
  Kind kind = Kind::forward;
  int micro_batch = 0;
  /// The virtual stage (model chunk) it runs; -1: the rank's only one.
  int stage = -1;
};

struct PipelineRole {
  comm::Transport* transport = nullptr;  ///< not owned; null = no pipeline
  /// Global rank of each stage of this rank's pipeline, in stage order. With data parallelism
  /// (TrainOptions::dp: the ranks of this stage in every pipeline) each replica of the model is a
  /// pipeline of its own, taking its rows of the global batch.
  std::vector<int> ranks;
  /// grid[stage][replica]: the global ranks of every pipeline of the job (ranks is this rank's
  /// column); what the job layer places, kept so each rank can find its own.
  std::vector<std::vector<int>> grid;
  int stage = 0;  ///< this rank's position in the pipeline (index into ranks)
  /// With more model chunks than ranks (interleaved 1F1B, ZB-V): the rank position of each virtual
  /// stage (interleaving: virtual stage c·p + r on position r; ZB-V: chunk 1 of position r is
  /// virtual stage 2p − 1 − r). Empty: one virtual stage per rank, stage s on position s.
  std::vector<int> position_of_stage;
  int micro_batches = 1;  ///< the global batch is cut into these along axis 0
  /// B and W run apart (zero-bubble schedules); otherwise the backward is one part and W empty.
  bool split_weight = false;
  std::vector<PipelineAction> actions;  ///< this rank's compute actions of one step, in order
  /// cuts[b]: the tensors of the forward model virtual stage b writes and b + 1 reads (boundary b);
  /// one list per pair of neighbouring virtual stages.
  std::vector<std::vector<std::string>> cuts;
  bool active() const { return transport != nullptr && ranks.size() > 1; }
  int stages() const {
    return position_of_stage.empty() ? static_cast<int>(ranks.size())
                                     : static_cast<int>(position_of_stage.size());
  }
  int position(int virtual_stage) const {
    return position_of_stage.empty() ? virtual_stage
                                     : position_of_stage[static_cast<std::size_t>(virtual_stage)];
  }
};

}  // namespace hp::train
