// The state of one pipeline rank's training run (pipeline_run.cpp runs it; pipeline_collect.cpp
// gathers the whole model from it on the lead for --save-model and one-rank checkpoints).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hp/train/checkpoint.h"
#include "hp/train/data.h"
#include "hp/train/data_parallel.h"
#include "hp/train/trainer.h"
#include "pipeline_stage.h"
#include "sharded_run.h"
#include "step_cache.h"

namespace hp::train::detail {

/// One pipeline rank: its stage, the syncs over the stage's replicas and tensor-parallel group, its
/// parameters and optimizer state, and the micro-batches of the current step.
struct PipeRun {
  explicit PipeRun(const TrainOptions& options) : o(options) {}
  const TrainOptions& o;
  model::Model forward;
  std::vector<std::vector<exec::HostTensor>> micro;
  std::int64_t total_labels = 0, tokens = 0;
  // The syncs before the stage: the stage's executors borrow from `dp` under ZeRO-3 and its hook
  // hands it gradients, so it goes after them.
  std::unique_ptr<DataParallelSync> dp;  ///< with data parallelism: this stage's replicas
  /// With expert parallelism instead: the stage's shared weights summed over its replicas, its
  /// experts over the replicas holding them (expert_parallel.h).
  std::unique_ptr<ExpertParallelSync> eps;
  std::array<std::int64_t, 3> expert_layers{};  ///< the pipeline's: all, routed, summed
  /// With tensor parallelism: the stage's group (its members hold slices of the split weights).
  std::unique_ptr<TensorParallelSync> tps;
  /// ZeRO-3 with per-step gathers: the stage's buckets kept through the step (step_cache.h).
  std::unique_ptr<StepCache> cache;
  std::unique_ptr<PipelineStage> stage;
  std::vector<exec::HostTensor> params;
  OptimizerState state;
  TrainReport report;
  TraceLog trace;
  comm::Transport& t() const { return *o.pp.transport; }
  /// The first stage of the first replica: prints, writes metrics, checkpoints, the saved model.
  bool lead() const { return o.pp.stage == 0 && o.dp.index() <= 0 && o.tp.index() <= 0; }
  /// ZeRO-3: the data-parallel sync holds this rank's shard of the stage's parameters, and the
  /// parts' executors borrow them for their uses; `params` keeps names and dims only.
  bool held() const {
    return (dp && dp->holds_parameters()) || (eps && (eps->holds_shared() || eps->holds_experts()));
  }
  /// Hands `params` (whole values) to the stage's executors (partial addends as stored,
  /// tensor_parallel.h), or under ZeRO-3 to the sync, which keeps its shard of them.
  Status set_weights() {
    if (held() && dp) return dp->hold_parameters(params);
    if (held()) {  // expert parallelism: the syncs keep their shards, the executors the rest
      HP_TRY(eps->hold(params));
      return set_unheld();
    }
    if (!tps) return stage->set_weights(params);
    std::vector<exec::HostTensor> stored;
    for (std::size_t k = 0; k < params.size(); ++k) stored.push_back(tps->stored(k, params[k]));
    return stage->set_weights(stored);
  }
  Expected<double> tp_norm();
  void say(bool err, const std::string& line) const {
    if (o.sink && lead()) o.sink(err, line);
  }
  // --data: the token stream, its input's name and the batches drawn so far.
  std::optional<TokenStream> stream;
  std::string input;
  std::int64_t data_position = 0;
  Status open_stream();
  Status draw();  ///< the micro-batches of batch data_position of the stream
  /// This replica's rows of the global batch cut into micro-batches, and their label count.
  Status take(std::vector<exec::HostTensor> batch, const std::filesystem::path& where);
  Status prepare();
  Status resume();
  Status resume_sharded();  ///< each rank its stage's pieces (sharded_run.h)
  /// The stage's whole parameter values (this rank's slices under tensor parallelism): under
  /// ZeRO-3 all-gathered from the stage's data-parallel peers (collective).
  Expected<std::vector<exec::HostTensor>> values() const {
    if (dp && dp->holds_parameters()) return dp->gather_parameters(params);
    if (eps) return eps->with_held(params);
    return params;
  }
  /// The stage's whole optimizer state, shaped like its parameters (collective over the shard
  /// groups under ZeRO).
  Expected<OptimizerState> whole_state() const {
    if (dp) return dp->gather_state(state, params);
    if (eps) return eps->gather_state(state);
    return state;
  }
  Status prepare_experts();
  /// ZeRO-3 under expert parallelism: the parameters no sync holds (the experts where one rank of
  /// the stage holds each) go to the executors; the held ones come from the gathers.
  Status set_unheld() {
    std::vector<exec::HostTensor> rest;
    for (std::size_t k = 0; k < params.size(); ++k)
      if (!eps->holds(k)) rest.push_back(params[k]);
    return stage->set_weights(rest);
  }
  ShardedLayout layout() const;
  Expected<StepMetrics> step();
  Expected<Checkpoint> gather();
};

}  // namespace hp::train::detail
