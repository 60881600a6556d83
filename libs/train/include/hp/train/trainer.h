// Training on one rank: the loop `hp launch RECIPE` runs when the recipe has a [train] table.
//
// Each step runs the gradient model (autodiff.h) on one batch, giving the loss and every gradient,
// then the optimizer updates the host copy of the weights (optimizer.h) and hands them back to the
// executor (Executor::set_weight). The loss reported for a step is the loss of that step's forward,
// before its update, as a PyTorch loop prints it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/train/autodiff.h"
#include "hp/train/data_parallel.h"
#include "hp/train/expert_parallel.h"
#include "hp/train/optimizer.h"
#include "hp/train/pipeline.h"
#include "hp/train/tensor_parallel.h"

namespace hp::train {

struct TrainOptions {
  std::filesystem::path model;  ///< forward ONNX model
  GradSpec grad;
  OptimizerConfig optimizer;
  std::int64_t steps = 1;
  // Data: exactly one of inputs_dir and data_file.
  std::filesystem::path inputs_dir;  ///< one batch (.pb tensors named after inputs + labels)
  std::filesystem::path data_file;   ///< token stream (data.h)
  int token_bytes = 2;               ///< 2 (uint16) or 4 (uint32)
  std::int64_t batch = 0, seq = 0;   ///< windows per batch and their length (data_file)
  std::uint64_t seed = 0;
  // Outputs.
  std::filesystem::path metrics;  ///< JSON lines, one per step; empty = none
  /// This rank's Chrome trace (trace.h): written when the run ends; empty = none. A data-parallel
  /// job gives each rank its part file (trace_part) and merges them.
  std::filesystem::path trace;
  std::filesystem::path save_model;  ///< trained model; empty = none
  std::filesystem::path checkpoint_dir;
  std::int64_t checkpoint_every = 0;  ///< 0 = only at the end (when checkpoint_dir is set)
  /// checkpoint_dir may replace a directory that is not an earlier checkpoint (--force).
  bool force_checkpoint = false;
  std::filesystem::path resume_dir;
  // Runtime.
  std::string backend;  ///< plugin name; empty = cpu
  int threads = 0;      ///< 0 = the cores available
  std::vector<std::string> plugin_paths;
  int log_every = 1;  ///< progress line every k steps (and the last)
  /// Several ranks training one model on parts of each batch (data_parallel.h): each takes its
  /// rows of the global batch (--inputs tensors, or the windows of --data); only the group's first
  /// rank prints, writes metrics, checkpoints and the saved model.
  DataParallel dp;
  /// Pipeline parallelism (pipeline.h): this rank runs one stage of the model; the first stage's
  /// rank prints, writes metrics, checkpoints and the saved model (of the whole model, gathered:
  /// every rank must be given the same checkpoint_dir and save_model). Not together with dp yet.
  PipelineRole pp;
  /// Tensor parallelism (tensor_parallel.h): this rank trains its partition of the model; the
  /// group's first member prints and writes (whole tensors, gathered: every member must be given
  /// the same checkpoint_dir and save_model). Not together with dp or pp yet.
  TensorParallel tp;
  /// Expert parallelism (expert_parallel.h): the data-parallel ranks share the experts out; each
  /// trains its rows on the shared weights and its experts. Instead of dp; not with tp or pp yet.
  ExpertParallel ep;
  /// Receives progress lines (stdout) and warnings (stderr when `err`).
  std::function<void(bool err, const std::string&)> sink;
};

struct StepMetrics {
  std::int64_t step = 0;  ///< 1-based
  double loss = 0, grad_norm = 0, lr = 0, seconds = 0, tokens_per_second = 0;
  std::int64_t peak_bytes = 0;  ///< the executor's peak of live tensor bytes during the step
  double run_seconds = 0;       ///< of `seconds`: the gradient model's run (forward + backward)
  /// Of `seconds`: the data-parallel gradient reduction left after the backward (0 on one rank).
  double reduce_seconds = 0;
  /// Of `seconds`: clipping and the optimizer (with ZeRO: and the parameters' all-gather).
  double update_seconds = 0;
  /// Of `run_seconds`: in the tensor-parallel collectives of the gradient model (forward and
  /// backward). They block the rank's computation, so all of it is exposed.
  double tp_comm_seconds = 0;
  /// Of `run_seconds`: in expert parallelism's dispatch and combine collectives (exposed alike).
  double ep_comm_seconds = 0;
};

struct TrainReport {
  std::vector<StepMetrics> steps;  ///< the steps this run did (after a resume: from there)
  std::int64_t first_step = 1;
  std::int64_t peak_bytes = 0;  ///< executor's measured peak of live tensor bytes
  std::int64_t params = 0;      ///< trainable elements
  double median_step_seconds = 0;
  std::string summary;  ///< the closing lines for the console
};

/// Runs the loop; see the file comment. Errors: Errc::bad_input for the model, data or options
/// (before the first step), Errc::runtime for a non-finite loss or gradient (naming the step; the
/// last checkpoint written is kept) or a failing kernel.
Expected<TrainReport> train(const TrainOptions& options);

namespace detail {
/// train() for a rank of a pipeline (options.pp active): pipeline_run.cpp.
Expected<TrainReport> train_pipeline(const TrainOptions& options);
}  // namespace detail

}  // namespace hp::train
