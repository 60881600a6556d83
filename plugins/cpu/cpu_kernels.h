// Hot float32 loops of the cpu kernels, compiled three times (GCC target_clones, HP_CPU_CLONES):
// for x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA) and the baseline, picked once at load time by the
// CPU the plugin runs on. The plugin is built for baseline x86-64 (a distribution binary), where
// these loops run 3-4x slower; everything else stays baseline. The loops are serial over a span;
// callers split work across OpenMP threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define HP_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HP_CPU_CLONES
#endif

namespace hp_cpu {

/// Calls f(begin, end) over [0, n) in spans of 16K elements, spread across OpenMP threads when n is
/// large enough for that to pay.
template <class F>
void for_spans(int64_t n, F&& f) {
  constexpr int64_t kSpan = int64_t{1} << 14;
  const int64_t spans = (n + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t s = 0; s < spans; ++s) f(s * kSpan, std::min(n, (s + 1) * kSpan));
}

/// y = x * (1 + erf(x / sqrt 2)) / 2 (the exact GELU).
void gelu_span(const float* x, float* y, int64_t n);
/// dx = dy (Phi(x) + x phi(x)), the exact GELU's derivative times the incoming gradient.
void gelu_grad_span(const float* x, const float* dy, float* dx, int64_t n);
/// y = erf(x).
void erf_span(const float* x, float* y, int64_t n);
/// One softmax (or log-softmax) over a contiguous row of `len` values.
void softmax_row(const float* x, float* y, int64_t len, bool log);
/// Softmax over a row of Where(hit, fill, scale * x), where hit is (mask[i] != 0) == fill_where
/// (mask null: no hits): hp.nn.MaskedSoftmax's row in one call, so the row stays in cache.
void masked_softmax_row(const float* x, const unsigned char* mask, bool fill_where, float scale,
                        float fill, float* y, int64_t len);
/// hp.nn.Attention's two products (cpu_attention_kernels.cpp), on 4 rows at a time of packed
/// operands zero-padded to multiples of 16 columns: c[r][0, cols) = sum_{k < n} a[r][k] b[k][0,
/// cols) for r < 4 (rows lda, ldb and ldc apart). Q K'^T with a = Q's rows and b = K' packed as
/// [d, keys]; P V' with a = the probabilities and b = V'.
void rows4_product(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t n, float* c,
                   int64_t ldc, int64_t cols);
/// One LayerNormalization row: y = (x - mean) * rstd * scale + bias, where scale and bias are `len`
/// long, or one value when their stride is 0, and bias may be null. Returns mean and rstd.
void layer_norm_row(const float* x, float* y, int64_t len, const float* scale, int64_t scale_stride,
                    const float* bias, int64_t bias_stride, float eps, float* mean_out,
                    float* rstd_out);

/// log_softmax of a contiguous row into y (the sum of exponentials accumulated in double, the
/// outputs x - lse rounded once); returns lse.
double log_softmax_row_f64sum(const float* x, float* y, int64_t n);
/// y = k * exp(x) over a row (SoftmaxCrossEntropyGrad's softmax from the log-probabilities).
void scaled_exp_row(const float* x, float* y, int64_t n, float k);
/// One row of LayerNormGrad (cpu_ops_grad.cpp), in double whatever T: with xh = (x - mean) * rstd
/// and gw = g * w, dX = rstd * (gw - mean(gw) - xh * mean(gw * xh)) into `out`, and when `ps` is
/// not null the row's dScale and dBias terms (g * xh, g) added to ps and pb. The float32 build goes
/// through layer_norm_grad_row below (its AVX2 clone); float64 calls this directly. Always inlined:
/// left to GCC, the clone called the baseline build and lost the AVX2 loops (LayerNormGrad took 6
/// ms instead of 3.5 on the benchmark GPT).
template <class T>
__attribute__((always_inline)) inline void layer_norm_grad_row_t(const T* x, const T* g, const T* w,
                                                                 T* out, int64_t len, double eps,
                                                                 double* ps, double* pb) {
  double mean = 0, var = 0, sg = 0, sgx = 0;
#pragma omp simd reduction(+ : mean)
  for (int64_t i = 0; i < len; ++i) mean += x[i];
  mean /= static_cast<double>(len);
#pragma omp simd reduction(+ : var)
  for (int64_t i = 0; i < len; ++i) var += (x[i] - mean) * (x[i] - mean);
  const double rstd = 1.0 / std::sqrt(var / static_cast<double>(len) + eps);
#pragma omp simd reduction(+ : sg, sgx)
  for (int64_t i = 0; i < len; ++i) {
    const double gw = static_cast<double>(g[i]) * w[i];
    sg += gw;
    sgx += gw * (x[i] - mean) * rstd;
  }
  sg /= static_cast<double>(len);
  sgx /= static_cast<double>(len);
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) {
    const double xh = (x[i] - mean) * rstd;
    out[i] = static_cast<T>(rstd * (static_cast<double>(g[i]) * w[i] - sg - xh * sgx));
  }
  if (ps) {
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      ps[i] += static_cast<double>(g[i]) * (x[i] - mean) * rstd;
      pb[i] += g[i];
    }
  }
}
void layer_norm_grad_row(const float* x, const float* g, const float* w, float* out, int64_t len,
                         double eps, double* ps, double* pb);

}  // namespace hp_cpu
