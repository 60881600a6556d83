// Optimizer steps on host tensors, as torch.optim computes them (docs/training.md, "Optimizers"):
// AdamW with decoupled weight decay and bias correction, SGD with momentum, global gradient-norm
// clipping and the learning-rate schedules. Parameters, gradients and states are f32 host tensors;
// the arithmetic follows torch's order of operations so results agree to float rounding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/tensor.h"

namespace hp::train {

enum class OptimizerKind { adamw, sgd };
/// "adamw" | "sgd"; Errc::bad_input otherwise.
Expected<OptimizerKind> parse_optimizer_kind(const std::string& name);
/// The inverse of parse_optimizer_kind.
const char* optimizer_name(OptimizerKind kind);

enum class LrSchedule { constant, cosine };
/// "constant" | "cosine" (linear warm-up then cosine decay); Errc::bad_input otherwise.
Expected<LrSchedule> parse_lr_schedule(const std::string& name);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;  ///< AdamW
  double eps = 1e-8;                  ///< AdamW
  double weight_decay = 0.01;         ///< AdamW: decoupled; SGD: added to the gradient
  double momentum = 0.0;              ///< SGD (0 = plain SGD)
  double clip_norm = 0.0;             ///< global gradient-norm clipping; 0 = off
  LrSchedule schedule = LrSchedule::constant;
  std::int64_t warmup_steps = 0;  ///< cosine: linear from lr/warmup to lr over these steps
  std::int64_t total_steps = 0;   ///< cosine: lr reaches min_lr at this step
  double min_lr = 0.0;            ///< cosine floor
  /// Threads for the update, the clipping and the norm. The elements are split between them and
  /// each element's arithmetic is unchanged (the norm's partial sums are taken per tensor and added
  /// in tensor order), so every thread count gives the same bits.
  int threads = 1;
};

/// Learning rate of 1-based step `step` under the schedule. constant: lr. cosine (W =
/// warmup_steps, T = total_steps): lr * step / W for step <= W; then, when T > W,
/// min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2 with p = min(1, (step - W) / (T - W)), so min_lr
/// from step T on; when T <= W (or T is 0) lr after the warm-up.
double learning_rate(const OptimizerConfig& c, std::int64_t step);

/// sqrt(sum of squares) over every gradient, accumulated in double.
double global_norm(const std::vector<exec::HostTensor>& grads, int threads = 1);
/// The sum of squares global_norm takes the root of, over the gradients k with counted[k] (every
/// one when `counted` is empty); the same bits on any number of threads.
double sum_of_squares(const std::vector<exec::HostTensor>& grads,
                      const std::vector<char>& counted = {}, int threads = 1);

/// Per-parameter state, beside the weights and saved with them (checkpoint.h).
struct OptimizerState {
  std::int64_t step = 0;  ///< updates done so far
  /// AdamW: exp_avg and exp_avg_sq per parameter; SGD with momentum: momentum_buffer (first only).
  std::vector<exec::HostTensor> exp_avg, exp_avg_sq;
};

/// What one update did.
struct StepInfo {
  double grad_norm = 0;   ///< before clipping
  double clip_scale = 1;  ///< factor the gradients were multiplied by (1 = not clipped)
  double lr = 0;
};

/// One update of every parameter from its gradient (same order, same shapes, f32): clips the
/// gradients in place when configured (torch.nn.utils.clip_grad_norm_: scaled by
/// clip_norm / (norm + 1e-6) when that is below 1), then applies the optimizer with the scheduled
/// learning rate of step state.step + 1. Empty state lists are created on the first step (zeros;
/// SGD's momentum buffer from the first gradient, as torch); non-empty ones must match the params.
/// Errc::bad_input on mismatched shapes or dtypes, Errc::runtime when the gradient norm is not
/// finite (nothing updated then).
Expected<StepInfo> optimizer_step(const OptimizerConfig& c, std::vector<exec::HostTensor>& params,
                                  std::vector<exec::HostTensor>& grads, OptimizerState& state);
/// The same update with the global gradient norm given: what a rank that holds only a shard of the
/// gradients does (ZeRO, data_parallel.h), the norm being the reduction of every shard's sum of
/// squares. The parameters, gradients and state may then be pieces of tensors (any shapes, as
/// long as each gradient and state tensor is shaped like its parameter).
Expected<StepInfo> optimizer_step(const OptimizerConfig& c, std::vector<exec::HostTensor>& params,
                                  std::vector<exec::HostTensor>& grads, OptimizerState& state,
                                  double grad_norm);

/// Where else each updated parameter goes: `to[k]`, when not null, receives parameter k's new
/// values (float32, its element count) in the same pass that computes them. The training loop
/// points it at the executor's own copy of the weight (Executor::host_weight), which saves a second
/// pass over every weight after the update.
struct Mirror {
  std::vector<float*> to;
};
Expected<StepInfo> optimizer_step(const OptimizerConfig& c, std::vector<exec::HostTensor>& params,
                                  std::vector<exec::HostTensor>& grads, OptimizerState& state,
                                  double grad_norm, const Mirror& mirror);

}  // namespace hp::train
