// See cpu_kernels.h. Built with -O3 -fno-trapping-math (CMakeLists.txt) so the selects in
// cpu_math.h vectorise; the reductions use OpenMP simd reductions (float partial sums per lane: the
// order differs from a serial sum by float rounding only).
#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu_math.h"

namespace hp_cpu {

HP_CPU_CLONES void gelu_span(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_f(x[i]);
}

HP_CPU_CLONES void gelu_grad_span(const float* __restrict x, const float* __restrict dy,
                                  float* __restrict dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float e = 1.f - erfc_abs_f(v * 0.70710678118654752f);
    const float cdf = 0.5f * (1.f + std::copysign(e, v));
    const float pdf = 0.39894228040143267794f * exp_f(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

HP_CPU_CLONES void erf_span(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = erf_f(x[i]);
}

/// y = exp(x - mx) / sum over the row (x may be y): the second half of a softmax row, inlined into
/// each clone of its callers.
__attribute__((always_inline)) inline void exp_normalize(const float* x, float* y, int64_t len,
                                                         float mx) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < len; ++i) {
    const float e = exp_f(x[i] - mx);
    y[i] = e;
    sum += e;
  }
  const float inv = 1.f / sum;
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) y[i] *= inv;
}

HP_CPU_CLONES void softmax_row(const float* x, float* y, int64_t len, bool log) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < len; ++i) mx = std::max(mx, x[i]);
  if (mx == -std::numeric_limits<float>::infinity())
    mx = 0;  // an all -inf row: NaNs, as libm gives
  if (log) {
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < len; ++i) sum += exp_f(x[i] - mx);
    const float ls = std::log(sum);
    for (int64_t i = 0; i < len; ++i) y[i] = x[i] - mx - ls;
    return;
  }
  exp_normalize(x, y, len, mx);
}

HP_CPU_CLONES void masked_softmax_row(const float* __restrict x,
                                      const unsigned char* __restrict mask, bool fill_where,
                                      float scale, float fill, float* __restrict y, int64_t len) {
  float mx = -std::numeric_limits<float>::infinity();
  if (mask) {
    const unsigned char fw = fill_where ? 1 : 0;
#pragma omp simd reduction(max : mx)
    for (int64_t i = 0; i < len; ++i) {
      const float v = scale * x[i];  // read unconditionally, so the select vectorises
      const float w = static_cast<unsigned char>(mask[i] != 0) == fw ? fill : v;
      y[i] = w;
      mx = std::max(mx, w);
    }
  } else {
#pragma omp simd reduction(max : mx)
    for (int64_t i = 0; i < len; ++i) {
      y[i] = scale * x[i];
      mx = std::max(mx, y[i]);
    }
  }
  if (mx == -std::numeric_limits<float>::infinity()) mx = 0;  // an all -inf row: NaNs, as Softmax
  exp_normalize(y, y, len, mx);
}

HP_CPU_CLONES void layer_norm_row(const float* x, float* y, int64_t len, const float* scale,
                                  int64_t scale_stride, const float* bias, int64_t bias_stride,
                                  float eps, float* mean_out, float* rstd_out) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < len; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(len);
  float var = 0;  // two passes: no cancellation when the mean is large against the spread
#pragma omp simd reduction(+ : var)
  for (int64_t i = 0; i < len; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<float>(len);
  const float rstd = 1.f / std::sqrt(var + eps);
  if (scale_stride == 1 && bias && bias_stride == 1) {
    for (int64_t i = 0; i < len; ++i) y[i] = (x[i] - mean) * rstd * scale[i] + bias[i];
  } else {
    for (int64_t i = 0; i < len; ++i) {
      float v = (x[i] - mean) * rstd * scale[i * scale_stride];
      if (bias) v += bias[i * bias_stride];
      y[i] = v;
    }
  }
  if (mean_out) *mean_out = mean;
  if (rstd_out) *rstd_out = rstd;
}

HP_CPU_CLONES void layer_norm_grad_row(const float* x, const float* g, const float* w, float* out,
                                       int64_t len, double eps, double* ps, double* pb) {
  layer_norm_grad_row_t(x, g, w, out, len, eps, ps, pb);
}

HP_CPU_CLONES double log_softmax_row_f64sum(const float* x, float* y, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t k = 0; k < n; ++k) mx = std::max(mx, x[k]);
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) part[j] += exp_f(x[k + j] - mx);
  double se = 0;
  for (int j = 0; j < 8; ++j) se += part[j];
  for (; k < n; ++k) se += exp_f(x[k] - mx);
  const double lse = mx + std::log(se);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] - lse);
  return lse;
}

HP_CPU_CLONES void scaled_exp_row(const float* x, float* y, int64_t n, float k) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = k * exp_f(x[j]);
}

}  // namespace hp_cpu
