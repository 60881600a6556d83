// Optimizer steps, as torch.optim's single-tensor (foreach=False) paths compute them on CPU float
// tensors. torch evaluates each in-place op over the whole tensor in float, with its Python-float
// scalars rounded to float; the loops below do the same ops in the same order, one pass per
// parameter, so a weight agrees with torch's to float rounding (torch's vectorized kernels fuse
// some multiply-adds, which moves the last bit at most). The scalars (bias corrections, step size)
// are computed in double like Python's floats, then rounded once.
//
// Everything is validated before the first write, so an error (mismatched shapes, non-finite
// gradient norm) leaves weights, gradients and state as they were.
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "hp/plugin/hp_plugin.h"
#include "hp/train/optimizer.h"

namespace hp::train {

using exec::HostTensor;

Expected<OptimizerKind> parse_optimizer_kind(const std::string& name) {
  if (name == "adamw") return OptimizerKind::adamw;
  if (name == "sgd") return OptimizerKind::sgd;
  return Error(Errc::bad_input, fmt::format("unknown optimizer '{}' (adamw or sgd)", name));
}

const char* optimizer_name(OptimizerKind kind) {
  return kind == OptimizerKind::sgd ? "sgd" : "adamw";
}

Expected<LrSchedule> parse_lr_schedule(const std::string& name) {
  if (name == "constant") return LrSchedule::constant;
  if (name == "cosine") return LrSchedule::cosine;
  return Error(Errc::bad_input,
               fmt::format("unknown learning-rate schedule '{}' (constant or cosine)", name));
}

namespace {

std::int64_t numel_f32(const HostTensor& t) {
  return static_cast<std::int64_t>(t.data.size() / sizeof(float));
}

/// Runs body(t) for t in [0, threads), the calling thread being t = 0.
void on_threads(int threads, const std::function<void(int)>& body) {
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  body(0);
  for (auto& th : pool) th.join();
}

/// Threads worth starting for tensors of these element counts: one below 64K elements in all,
/// where starting a thread costs more than it saves.
int threads_for(const std::vector<std::int64_t>& sizes, int threads) {
  std::int64_t total = 0;
  for (auto n : sizes) total += n;
  return total < (1 << 16) ? 1 : std::max(1, threads);
}

/// For each tensor, the thread that sums it whole: the one whose share of the concatenated
/// elements holds the tensor's first element.
std::vector<int> owners(const std::vector<std::int64_t>& sizes, int threads) {
  std::int64_t total = 0, start = 0;
  for (auto n : sizes) total += n;
  std::vector<int> who;
  for (auto n : sizes) {
    who.push_back(total == 0 ? 0 : static_cast<int>(start * threads / total));
    start += n;
  }
  return who;
}

/// Calls fn(k, lo, hi) for the pieces [lo, hi) of tensors k that thread `me`'s contiguous share of
/// the concatenated elements covers.
template <class Fn>
void for_share(const std::vector<std::int64_t>& sizes, int me, int threads, Fn fn) {
  std::int64_t total = 0;
  for (auto n : sizes) total += n;
  const std::int64_t lo = total * me / threads, hi = total * (me + 1) / threads;
  std::int64_t start = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::int64_t a = std::max(lo, start), b = std::min(hi, start + sizes[k]);
    if (a < b) fn(k, a - start, b - start);
    start += sizes[k];
  }
}

}  // namespace

double global_norm(const std::vector<HostTensor>& grads, int threads) {
  return std::sqrt(sum_of_squares(grads, {}, threads));
}

double sum_of_squares(const std::vector<HostTensor>& grads, const std::vector<char>& counted,
                      int threads) {
  // Eight partial sums per tensor keep the additions independent (the loop pipelines; a single
  // double accumulator would serialize 27M dependent adds for a 108 MB model). Each tensor's sums
  // are one thread's, and they are added in tensor order: the same bits on any thread count.
  std::vector<std::array<double, 8>> acc(grads.size());
  std::vector<std::int64_t> sizes;
  for (std::size_t t = 0; t < grads.size(); ++t)
    sizes.push_back(counted.empty() || counted[t] ? numel_f32(grads[t]) : 0);
  const int nt = threads_for(sizes, threads);
  const std::vector<int> owner = owners(sizes, nt);
  on_threads(nt, [&](int me) {
    for (std::size_t t = 0; t < grads.size(); ++t) {
      if (owner[t] != me || sizes[t] == 0) continue;
      const float* p = grads[t].as<float>();
      const std::int64_t n = sizes[t];
      double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) a[k] += static_cast<double>(p[i + k]) * p[i + k];
      for (; i < n; ++i) a[0] += static_cast<double>(p[i]) * p[i];
      std::copy(a, a + 8, acc[t].begin());
    }
  });
  double total = 0;
  for (std::size_t t = 0; t < grads.size(); ++t)
    if (sizes[t] > 0)
      for (double a : acc[t]) total += a;
  return total;
}

namespace {

Status check_f32(const HostTensor& t, const std::string& what) {
  if (t.dtype != HP_F32)
    return Error(Errc::bad_input, fmt::format("{} '{}' is {}, the optimizer updates f32 only", what,
                                              t.name, exec::dtype_label(t.dtype)));
  if (static_cast<std::int64_t>(t.data.size()) != t.numel() * 4)
    return Error(Errc::bad_input,
                 fmt::format("{} '{}' has {} bytes, its dims {} need {}", what, t.name,
                             t.data.size(), exec::dims_label(t.dims), t.numel() * 4));
  return {};
}

Status check_like(const HostTensor& t, const HostTensor& p, const std::string& what) {
  HP_TRY(check_f32(t, what));
  if (t.dims != p.dims)
    return Error(Errc::bad_input,
                 fmt::format("{} of '{}' has dims {}, the parameter {}", what, p.name,
                             exec::dims_label(t.dims), exec::dims_label(p.dims)));
  return {};
}

/// Optimizer state: empty (first step, created then) or one tensor per parameter shaped like it.
Status check_state_list(const std::vector<HostTensor>& list, const std::vector<HostTensor>& params,
                        const std::string& what) {
  if (list.empty()) return {};
  if (list.size() != params.size())
    return Error(Errc::bad_input, fmt::format("optimizer state has {} {} tensors for {} parameters",
                                              list.size(), what, params.size()));
  for (std::size_t i = 0; i < list.size(); ++i) HP_TRY(check_like(list[i], params[i], what));
  return {};
}

Status validate(const OptimizerConfig& c, const std::vector<HostTensor>& params,
                const std::vector<HostTensor>& grads, const OptimizerState& state) {
  if (params.size() != grads.size())
    return Error(Errc::bad_input,
                 fmt::format("{} gradients for {} parameters", grads.size(), params.size()));
  for (std::size_t i = 0; i < params.size(); ++i) {
    HP_TRY(check_f32(params[i], "parameter"));
    HP_TRY(check_like(grads[i], params[i], "gradient"));
  }
  HP_TRY(check_state_list(state.exp_avg, params,
                          c.kind == OptimizerKind::sgd ? "momentum_buffer" : "exp_avg"));
  if (c.kind == OptimizerKind::adamw) {
    HP_TRY(check_state_list(state.exp_avg_sq, params, "exp_avg_sq"));
    if (state.exp_avg.empty() != state.exp_avg_sq.empty())
      return Error(Errc::bad_input, "optimizer state has exp_avg or exp_avg_sq but not both");
  }
  return {};
}

HostTensor zeros_like(const HostTensor& p) {
  HostTensor t;
  t.name = p.name;
  t.dtype = HP_F32;
  t.dims = p.dims;
  t.data.assign(p.data.size(), 0);
  return t;
}

/// torch.optim.AdamW (amsgrad, maximize, capturable off), step k >= 1:
///   param.mul_(1 - lr*wd); exp_avg.mul_(b1).add_(g, alpha=1-b1);
///   exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2);
///   denom = (exp_avg_sq.sqrt() / sqrt(1-b2^k)).add_(eps);
///   param.addcdiv_(exp_avg, denom, value=-lr/(1-b1^k)).
/// Over elements [lo, hi), the new values also written to `q` when not null.
void adamw_update(const OptimizerConfig& c, double lr, std::int64_t k, HostTensor& param,
                  const HostTensor& grad, HostTensor& exp_avg, HostTensor& exp_avg_sq,
                  std::int64_t lo, std::int64_t hi, float* __restrict q) {
  const double bc1 = 1 - std::pow(c.beta1, static_cast<double>(k));
  const double bc2 = 1 - std::pow(c.beta2, static_cast<double>(k));
  const float decay = static_cast<float>(1 - lr * c.weight_decay);
  const float b1 = static_cast<float>(c.beta1), one_minus_b1 = static_cast<float>(1 - c.beta1);
  const float b2 = static_cast<float>(c.beta2), one_minus_b2 = static_cast<float>(1 - c.beta2);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(c.eps);
  const float neg_step = static_cast<float>(-(lr / bc1));
  float* __restrict p = param.as<float>();
  const float* __restrict g = grad.as<float>();
  float* __restrict m = exp_avg.as<float>();
  float* __restrict v = exp_avg_sq.as<float>();
  auto one = [&](std::int64_t i) {
    const float gi = g[i];
    const float pi = p[i] * decay;
    const float mi = m[i] * b1 + one_minus_b1 * gi;
    const float vi = v[i] * b2 + one_minus_b2 * gi * gi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    return pi + neg_step * mi / denom;  // addcdiv: self + value * t1 / t2
  };
  if (q) {
    for (std::int64_t i = lo; i < hi; ++i) q[i] = p[i] = one(i);
  } else {
    for (std::int64_t i = lo; i < hi; ++i) p[i] = one(i);
  }
}

/// torch.optim.SGD (dampening 0, nesterov and maximize off):
///   d_p = g + wd*param; buf = d_p on the first step, else buf.mul_(mu).add_(d_p);
///   param.add_(buf or d_p, alpha=-lr).
/// Over elements [lo, hi), the new values also written to `q` when not null.
void sgd_update(const OptimizerConfig& c, double lr, HostTensor& param, const HostTensor& grad,
                HostTensor* buffer, bool first, std::int64_t lo, std::int64_t hi,
                float* __restrict q) {
  const float wd = static_cast<float>(c.weight_decay);
  const float mu = static_cast<float>(c.momentum);
  const float neg_lr = static_cast<float>(-lr);
  float* __restrict p = param.as<float>();
  const float* __restrict g = grad.as<float>();
  float* __restrict b = buffer ? buffer->as<float>() : nullptr;
  for (std::int64_t i = lo; i < hi; ++i) {
    const float d = g[i] + wd * p[i];
    float step = d;
    if (b) {
      step = first ? d : b[i] * mu + d;
      b[i] = step;
    }
    p[i] = p[i] + neg_lr * step;
    if (q) q[i] = p[i];
  }
}

}  // namespace

Expected<StepInfo> optimizer_step(const OptimizerConfig& c, std::vector<HostTensor>& params,
                                  std::vector<HostTensor>& grads, OptimizerState& state) {
  HP_TRY(validate(c, params, grads, state));
  return optimizer_step(c, params, grads, state, global_norm(grads, c.threads), Mirror{});
}

Expected<StepInfo> optimizer_step(const OptimizerConfig& c, std::vector<HostTensor>& params,
                                  std::vector<HostTensor>& grads, OptimizerState& state,
                                  double grad_norm) {
  return optimizer_step(c, params, grads, state, grad_norm, Mirror{});
}

Expected<StepInfo> optimizer_step(const OptimizerConfig& c, std::vector<HostTensor>& params,
                                  std::vector<HostTensor>& grads, OptimizerState& state,
                                  double grad_norm, const Mirror& mirror) {
  HP_TRY(validate(c, params, grads, state));
  if (!mirror.to.empty() && mirror.to.size() != params.size())
    return Error(Errc::internal,
                 fmt::format("{} mirrors for {} parameters", mirror.to.size(), params.size()));
  std::vector<std::int64_t> sizes;
  for (const HostTensor& p : params) sizes.push_back(numel_f32(p));
  const int nt = threads_for(sizes, c.threads);
  StepInfo info;
  info.grad_norm = grad_norm;
  if (!std::isfinite(info.grad_norm))
    return Error(Errc::runtime,
                 fmt::format("the gradient norm is {} at step {}: a gradient holds inf or NaN",
                             info.grad_norm, state.step + 1),
                 "", "lower the learning rate or enable clip_norm");
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (total_norm + 1e-6), clamped to 1. torch
  // multiplies by the clamped coefficient unconditionally; multiplying by 1 changes nothing.
  if (c.clip_norm > 0) {
    const double coef = c.clip_norm / (info.grad_norm + 1e-6);
    if (coef < 1) {
      info.clip_scale = coef;
      const float s = static_cast<float>(coef);
      on_threads(nt, [&](int me) {
        for_share(sizes, me, nt, [&](std::size_t t, std::int64_t lo, std::int64_t hi) {
          float* p = grads[t].as<float>();
          for (std::int64_t i = lo; i < hi; ++i) p[i] *= s;
        });
      });
    }
  }
  const std::int64_t k = state.step + 1;
  info.lr = learning_rate(c, k);
  if (c.kind == OptimizerKind::adamw && state.exp_avg.empty()) {
    for (const HostTensor& p : params) {
      state.exp_avg.push_back(zeros_like(p));
      state.exp_avg_sq.push_back(zeros_like(p));
    }
  }
  auto to = [&](std::size_t t) { return mirror.to.empty() ? nullptr : mirror.to[t]; };
  if (c.kind == OptimizerKind::adamw) {
    on_threads(nt, [&](int me) {
      for_share(sizes, me, nt, [&](std::size_t t, std::int64_t lo, std::int64_t hi) {
        adamw_update(c, info.lr, k, params[t], grads[t], state.exp_avg[t], state.exp_avg_sq[t], lo,
                     hi, to(t));
      });
    });
  } else {
    // The momentum buffer is created from the first step's gradient (torch: buf = clone(d_p)).
    const bool momentum = c.momentum != 0;
    const bool first = momentum && state.exp_avg.empty();
    if (first)
      for (const HostTensor& p : params) state.exp_avg.push_back(zeros_like(p));
    on_threads(nt, [&](int me) {
      for_share(sizes, me, nt, [&](std::size_t t, std::int64_t lo, std::int64_t hi) {
        sgd_update(c, info.lr, params[t], grads[t], momentum ? &state.exp_avg[t] : nullptr, first,
                   lo, hi, to(t));
      });
    });
  }
  state.step = k;
  return info;
}

}  // namespace hp::train
