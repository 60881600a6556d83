// The two row kernels of the vocabulary-parallel cross entropy (libs/train/src/loss_vocab.cpp),
// each one pass over a member's [N, C] block of the logits:
//
//   hp.train.RowMaxSumExp(X) -> M, S     M[n] = max_c X[n, c], S[n] = sum_c exp(X[n, c] - M[n])
//                                        (both [N, 1]; the loss graph combines the members')
//   hp.train.VocabParallelCEGrad(X, M, S, Col, Coef) -> dX
//                                        dX[n, c] = (exp(X[n, c] - M[n]) / S[n] - [c == Col[n]])
//                                                   * Coef[n]
//   with M and S the whole row's (all-reduced), Col the label's column in this block (-1 when
//   another member owns it, or the label is ignored) and Coef 1/count on kept rows, 0 on the
//   others.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu_grad.h"
#include "cpu_math.h"

namespace hp_cpu {
namespace {

using namespace grad;

inline float exp_row(float x) { return exp_f(x); }
inline double exp_row(double x) { return std::exp(x); }

void check_rows(OpCall& c, const View& x) {
  if (x.dims.size() != 2) c.fail("X must be [N, C], got " + dims_str(x.dims));
}

void check_column(OpCall& c, const View& v, int64_t n, const char* what) {
  if (v.numel() != n)
    c.fail(std::string(what) + " must have one value per row (" + std::to_string(n) + "), got " +
           dims_str(v.dims));
}

void row_max_sum_exp(OpCall& c) {
  const View& x = c.need(0);
  check_rows(c, x);
  const int64_t N = x.dims[0], C = x.dims[1];
  View m = c.out(0, x.dtype, {N, 1}), s = c.out(1, x.dtype, {N, 1});
  dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    T *pm = m.as<T>(), *ps = s.as<T>();
    split_range(N, N * C, [&](int64_t lo, int64_t hi, int) {
      for (int64_t n = lo; n < hi; ++n) {
        const T* row = px + n * C;
        T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < C; ++j) mx = std::max(mx, row[j]);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < C; ++j) sum += exp_row(row[j] - mx);
        pm[n] = mx;
        ps[n] = sum;
      }
    });
  });
}

void vocab_ce_grad(OpCall& c) {
  const View &x = c.need(0), &m = c.need(1), &s = c.need(2), &col = c.need(3), &k = c.need(4);
  check_rows(c, x);
  const int64_t N = x.dims[0], C = x.dims[1];
  check_column(c, m, N, "M");
  check_column(c, s, N, "S");
  check_column(c, col, N, "Col");
  check_column(c, k, N, "Coef");
  const std::vector<int64_t> cols = col.ints();
  for (int64_t at : cols)
    if (at >= C)
      c.fail("Col " + std::to_string(at) + " is outside the block's " + std::to_string(C) +
             " columns");
  View dx = c.out(0, x.dtype, x.dims);
  dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>(), *pm = m.as<T>(), *ps = s.as<T>(), *pk = k.as<T>();
    T* pd = dx.as<T>();
    split_range(N, N * C, [&](int64_t lo, int64_t hi, int) {
      for (int64_t n = lo; n < hi; ++n) {
        const T* row = px + n * C;
        T* out = pd + n * C;
        const T mx = pm[n], scale = pk[n] / ps[n];
        if (pk[n] == 0) {
          std::fill(out, out + C, T(0));
          continue;
        }
#pragma omp simd
        for (int64_t j = 0; j < C; ++j) out[j] = exp_row(row[j] - mx) * scale;
        const int64_t at = cols[static_cast<size_t>(n)];
        if (at >= 0) out[at] -= pk[n];
      }
    });
  });
}

}  // namespace

void register_vocab_ops(OpTable& t) {
  t["hp.train.RowMaxSumExp"] = {row_max_sum_exp, types("f")};
  t["hp.train.VocabParallelCEGrad"] = {vocab_ce_grad, types("fffif")};
}

}  // namespace hp_cpu
