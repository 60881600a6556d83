// Training losses on the cpu backend: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (f32,
// f64), the two losses classification exports end in.
//
// Both see the input as [N, C, D] with D the product of the trailing dims (1 for [N, C]) and the
// target as [N, D]. Each element's loss is -w[t] * x[n, t, d] for its target class t, where w is
// the optional per-class weight (1 without one); an element whose target is ignore_index
// contributes nothing and has weight 0. The reductions follow the ONNX definition: "none" keeps [N,
// d1, ...], "sum" adds every element, "mean" divides that sum by the sum of the weights of the
// elements not ignored (so it is a weighted mean, and a plain mean over the kept elements without a
// weight). SoftmaxCrossEntropyLoss is the same loss over log_softmax(scores) along dim 1, which it
// can also return as its second output.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_kernels.h"
#include "cpu_math.h"
#include "cpu_ops.h"

namespace hp_cpu {
namespace {

struct LossShape {
  int64_t n = 0, c = 0, d = 1;
  Dims none_dims;  ///< output dims of reduction "none": [N, d1, ...]
};

LossShape loss_shape(const OpCall& c, const View& x, const View& t) {
  if (x.dims.size() < 2) c.fail("input must have rank >= 2 (N, C, ...), got " + dims_str(x.dims));
  LossShape s;
  s.n = x.dims[0];
  s.c = x.dims[1];
  s.none_dims = {s.n};
  for (size_t k = 2; k < x.dims.size(); ++k) {
    s.d *= x.dims[k];
    s.none_dims.push_back(x.dims[k]);
  }
  if (t.dims != s.none_dims)
    c.fail("target dims " + dims_str(t.dims) + " must be " + dims_str(s.none_dims));
  return s;
}

/// The NLL of log-probabilities `lp` laid out [N, C, D], written to output 0.
template <class T>
void nll(OpCall& c, const T* lp, const LossShape& s, const View& target, const View& weight) {
  const std::string red = c.s("reduction", "mean");
  if (red != "none" && red != "sum" && red != "mean") c.fail("unknown reduction '" + red + "'");
  const bool has_ii = c.has("ignore_index");
  const int64_t ii = c.i("ignore_index", 0);
  if (weight.present() && (weight.dims.size() != 1 || weight.dims[0] != s.c))
    c.fail("weight must have dims [" + std::to_string(s.c) + "], got " + dims_str(weight.dims));
  const std::vector<int64_t> tgt = target.ints();
  const T* w = weight.present() ? weight.as<T>() : nullptr;
  std::vector<T> loss(tgt.size());
  double sum = 0, wsum = 0;
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t d = 0; d < s.d; ++d) {
      const size_t e = static_cast<size_t>(n * s.d + d);
      const int64_t t = tgt[e];
      if (has_ii && t == ii) {
        loss[e] = 0;
        continue;
      }
      if (t < 0 || t >= s.c)
        c.fail("target " + std::to_string(t) + " is outside [0, " + std::to_string(s.c) + ")");
      const T wt = w ? w[t] : T(1);
      loss[e] = -lp[(n * s.c + t) * s.d + d] * wt;
      sum += loss[e];
      wsum += wt;
    }
  if (red == "none") {
    View y = c.out(0, c.need(0).dtype, s.none_dims);
    std::copy(loss.begin(), loss.end(), y.as<T>());
    return;
  }
  View y = c.out(0, c.need(0).dtype, {});
  // A mean over no kept element is 0/0; ONNX's reference gives NaN too.
  y.as<T>()[0] = static_cast<T>(red == "sum" ? sum : sum / wsum);
}

void nll_loss(OpCall& c) {
  const View &x = c.need(0), &t = c.need(1), &w = c.in(2);
  const LossShape s = loss_shape(c, x, t);
  dispatch(x.dtype, [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_floating_point_v<T>) nll<T>(c, x.as<T>(), s, t, w);
  });
}

/// log_softmax of row (n, d) of `px` into `lp`: classes at stride s.d.
template <class T>
void log_softmax_row(const T* px, T* lp, const LossShape& s, int64_t n, int64_t d) {
  const int64_t base = n * s.c * s.d + d;
  if constexpr (std::is_same_v<T, float>) {
    if (s.d == 1) {  // the usual [N, C] layout: the loop built for AVX2 too (cpu_kernels.cpp)
      log_softmax_row_f64sum(px + base, lp + base, s.c);
      return;
    }
  }
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t k = 0; k < s.c; ++k) mx = std::max(mx, px[base + k * s.d]);
  double se = 0;
  if constexpr (std::is_same_v<T, float>) {
    if (s.d == 1) {  // the usual [N, C] layout: exp_f vectorises, the sum stays in double
      const float* row = px + base;
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t k = 0;
      for (; k + 8 <= s.c; k += 8)
        for (int j = 0; j < 8; ++j) part[j] += exp_f(row[k + j] - mx);
      for (int j = 0; j < 8; ++j) se += part[j];
      for (; k < s.c; ++k) se += exp_f(row[k] - mx);
    } else {
      for (int64_t k = 0; k < s.c; ++k) se += std::exp(double(px[base + k * s.d]) - mx);
    }
  } else {
    for (int64_t k = 0; k < s.c; ++k) se += std::exp(double(px[base + k * s.d]) - mx);
  }
  const double lse = mx + std::log(se);
  for (int64_t k = 0; k < s.c; ++k) lp[base + k * s.d] = static_cast<T>(px[base + k * s.d] - lse);
}

void softmax_cross_entropy(OpCall& c) {
  const View &x = c.need(0), &t = c.need(1), &w = c.in(2);
  const LossShape s = loss_shape(c, x, t);
  dispatch(x.dtype, [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_floating_point_v<T>) {
      const T* px = x.as<T>();
      // The log-probabilities go straight into output 1 when the node has it (training reads
      // them for the gradient), else into a scratch buffer.
      std::vector<T> scratch;
      T* lp = nullptr;
      if (c.n_outputs() > 1) {
        lp = c.out(1, x.dtype, x.dims).template as<T>();
      } else {
        scratch.resize(static_cast<size_t>(x.numel()));
        lp = scratch.data();
      }
#pragma omp parallel for schedule(static) collapse(2) if (s.n * s.c * s.d >= (1 << 16))
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t d = 0; d < s.d; ++d) log_softmax_row(px, lp, s, n, d);
      nll<T>(c, lp, s, t, w);
    }
  });
}

bool loss_types(const std::vector<int32_t>& d) {
  if (d.size() < 2 || (d[0] != HP_F32 && d[0] != HP_F64)) return false;
  if (d[1] != HP_I32 && d[1] != HP_I64) return false;
  return d.size() < 3 || d[2] == -1 || d[2] == d[0];
}

}  // namespace

void register_loss_ops(OpTable& t) {
  t["NegativeLogLikelihoodLoss"] = {nll_loss, loss_types};
  t["SoftmaxCrossEntropyLoss"] = {softmax_cross_entropy, loss_types};
}

}  // namespace hp_cpu
