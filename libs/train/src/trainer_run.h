// One rank's training run (trainer.cpp: preparation and the step; trainer_checkpoint.cpp: resuming
// and checkpoints), shared between the two files.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "batches.h"
#include "hp/comm/comm.h"
#include "hp/exec/executor.h"
#include "hp/train/autodiff.h"
#include "hp/train/checkpoint.h"
#include "hp/train/data_parallel.h"
#include "hp/train/expert_parallel.h"
#include "hp/train/tensor_parallel.h"
#include "hp/train/trace.h"
#include "hp/train/trainer.h"
#include "sharded_run.h"
#include "step_cache.h"

namespace hp::train::detail {

struct TrainRun {
  explicit TrainRun(const TrainOptions& options) : o(options) {}
  const TrainOptions& o;
  model::Model forward;
  std::map<std::string, ParamCut> cuts;  ///< tensor parallelism: the split weights
  std::vector<exec::HostTensor> batch;   ///< the --inputs tensors, read once
  GradGraph gg;
  std::unique_ptr<exec::Executor> ex;
  std::vector<exec::HostTensor> params;
  /// Buffers the forward updates (GradGraph::buffer_updates), as of the last step. With data
  /// parallelism each rank's follow its own rows and the lead's are saved, as DDP broadcasts
  /// rank 0's.
  std::vector<exec::HostTensor> buffers;
  OptimizerState state;  ///< with data parallelism: of this rank's pieces (data_parallel.h)
  std::int64_t data_position = 0;
  TrainReport report;
  // Data parallelism: this rank's part of every global batch, and the gradient reduction.
  int part = 0, parts = 1;
  std::unique_ptr<DataParallelSync> sync;
  // Tensor parallelism: this member's partition of the model, its collectives, and where each of
  // its parameters is among the forward model's (the one-rank order of checkpoints).
  model::Model part_model;
  std::unique_ptr<comm::TransportCommOps> comm_ops;
  std::unique_ptr<TensorParallelSync> tps;
  /// Expert parallelism: which member holds which experts, and the reductions.
  std::vector<std::vector<std::string>> experts_of;
  /// Expert parallelism: layers found; of them routed, and summed (Mixtral-style loops).
  struct {
    int layers = 0, routed = 0, summed = 0;
  } expert_layers;
  std::unique_ptr<ExpertParallelSync> eps;
  /// ZeRO-3 with per-step gathers: the buckets kept through the step (before the syncs it reads
  /// from are destroyed).
  std::unique_ptr<StepCache> cache;
  TraceLog trace;

  /// The rank that prints and writes files (the first of the data-parallel group, the first
  /// member of the tensor-parallel group).
  bool lead() const { return part == 0 && o.tp.index() <= 0; }
  bool partitioned() const { return o.tp.active() || o.ep.active(); }
  /// ZeRO-3: the data-parallel sync holds the parameters (params keep names and dims only) and the
  /// executor borrows them from it; under expert parallelism, the shared weights' sync and the
  /// experts' hold theirs (ExpertParallelSync::hold).
  bool held() const {
    return (sync && sync->holds_parameters()) ||
           (eps && (eps->holds_shared() || eps->holds_experts()));
  }
  /// Parameter j is held by a sync, not by the executor (no set_weight for it).
  bool lent(std::size_t j) const { return eps ? eps->holds(j) : held(); }
  /// ZeRO-3: the syncs take the parameters (whole in `params`) back into their shards.
  Status hold() { return eps ? eps->hold(params) : sync->hold_parameters(params); }
  void say(bool err, const std::string& line) const {
    if (o.sink && lead()) o.sink(err, line);
  }
  Status prepare();
  Status resume();
  Status resume_sharded();  ///< from a sharded checkpoint (sharded_run.h)
  detail::ShardedLayout layout() const;
  Expected<StepMetrics> step(const detail::BatchSource& data);
  Status checkpoint();  ///< write_checkpoint(), traced
  Status write_checkpoint();
  Status prepare_tensor_parallel(GradSpec& spec);
  /// `dims`: the rank's input dims (partition_experts checks shapes read across them).
  Status prepare_expert_parallel(GradSpec& spec, const model::DimBindings& dims);
  /// Tensor or expert parallelism: this member's parameters (slices, or its experts and the shared
  /// weights) and their state, picked by name from the whole model's.
  Status resume_by_name(Checkpoint c);
  Status resume_buffers(const Checkpoint& c);
  /// The whole model's parameters (or state shaped like them) in the forward model's order, from
  /// this rank's (tensor parallelism: gathered, a collective).
  Expected<std::vector<exec::HostTensor>> whole(const std::vector<exec::HostTensor>& mine) const;
};

}  // namespace hp::train::detail
