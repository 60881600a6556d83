// Gradient ops of the "hp.train" domain on the cpu backend (f32, f64): the nodes autodiff emits
// where ONNX needs several ops or static shapes (docs/training.md, "The hp.train domain", is the
// contract: names, input order, attributes). ConvGrad and the pool gradients are in
// cpu_ops_grad_conv.cpp, the scatters back of slices and gathers in cpu_ops_grad_index.cpp.
//
// SumTo, SoftmaxGrad, LogSoftmaxGrad, LayerNormGrad, SoftmaxCrossEntropyGrad and GatherGrad run at
// every training step on the largest activations (logits of [batch * seq, vocab]), so their inner
// loops run over contiguous memory and the work is split across OpenMP threads so that each thread
// writes its own part of the output (no atomics): by output rows, by kept columns (SumTo to a bias
// shape), by destination rows (GatherGrad of an embedding), or into per-thread partial sums that
// are added at the end (LayerNormGrad's dScale and dBias). Sums are accumulated in double.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_grad.h"
#include "cpu_kernels.h"
#include "cpu_math.h"

namespace hp_cpu {
namespace {

using namespace grad;

/// exp that vectorises for float (cpu_math.h, within float rounding of std::exp); libm's for
/// double.
inline float exp_of(float x) { return exp_f(x); }
inline double exp_of(double x) { return std::exp(x); }

// ---- SumTo
// ---------------------------------------------------------------------------------------

/// dY's dims with size-1 dims dropped and neighbours of the same kind (kept or summed) merged, so
/// the loop nest is as shallow as the broadcast pattern allows and the innermost loop is the
/// longest contiguous run.
struct SumPlan {
  Dims size, dy_st, y_st;  // y_st 0 on summed dims
  std::vector<char> summed;
  int split = -1;  // the dim whose range is restricted to [lo, hi)
};

template <class T>
void sum_rec(const SumPlan& p, size_t lvl, const T* x, T* y, int64_t lo, int64_t hi) {
  const bool sp = static_cast<int>(lvl) == p.split;
  const int64_t b = sp ? lo : 0, e = sp ? hi : p.size[lvl];
  if (lvl + 1 == p.size.size()) {  // innermost: contiguous in dY
    if (p.summed[lvl]) {
      double acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = b; i < e; ++i) acc += x[i];
      *y += static_cast<T>(acc);
    } else {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) y[i] += x[i];
    }
    return;
  }
  for (int64_t i = b; i < e; ++i)
    sum_rec(p, lvl + 1, x + i * p.dy_st[lvl], y + i * p.y_st[lvl], lo, hi);
}

void sum_to(OpCall& c) {
  const View& dy = c.need(0);
  const Dims s = shape_arg(c, 1);
  const size_t R = dy.dims.size(), r = s.size();
  if (r > R) c.fail("cannot sum " + dims_str(dy.dims) + " to the larger rank " + dims_str(s));
  SumPlan p;
  for (size_t k = 0; k < R; ++k) {
    const int64_t t = k < R - r ? 1 : s[k - (R - r)], d = dy.dims[k];
    if (t != d && t != 1) c.fail("cannot sum " + dims_str(dy.dims) + " to " + dims_str(s));
    if (d == 1) continue;
    const char summed = t == 1;
    if (!p.size.empty() && p.summed.back() == summed) {
      p.size.back() *= d;
    } else {
      p.size.push_back(d);
      p.summed.push_back(summed);
    }
  }
  View y = c.out(0, dy.dtype, s);
  dispatch_float(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    zero<T>(y);
    if (dy.numel() == 0 || y.numel() == 0) return;
    const T* px = dy.as<T>();
    T* py = y.as<T>();
    if (p.size.empty()) {  // every dim is 1
      py[0] = px[0];
      return;
    }
    const size_t m = p.size.size();
    p.dy_st.assign(m, 1);
    p.y_st.assign(m, 0);
    for (size_t k = m - 1; k-- > 0;) p.dy_st[k] = p.dy_st[k + 1] * p.size[k + 1];
    int64_t ys = 1;
    for (size_t k = m; k-- > 0;)
      if (!p.summed[k]) {
        p.y_st[k] = ys;
        ys *= p.size[k];
      }
    // When the outermost dim is summed and the output small, threads split that dim into
    // per-thread partial sums (each reads whole contiguous rows); else they split the longest kept
    // dim if it has a part for each.
    const int nt = max_threads();
    const int64_t n = dy.numel(), ny = y.numel();
    int best = -1;
    for (size_t k = 0; k < m; ++k)
      if (!p.summed[k] && (best < 0 || p.size[k] > p.size[static_cast<size_t>(best)]))
        best = static_cast<int>(k);
    if (n >= kParallelMin && nt > 1 && p.summed[0] && p.size[0] >= nt && ny * nt * 4 <= n) {
      p.split = 0;
      std::vector<T> part(static_cast<size_t>(ny * nt), T(0));
      split_range(p.size[0], n, [&](int64_t lo, int64_t hi, int t) {
        sum_rec(p, 0, px, part.data() + t * ny, lo, hi);
      });
      split_range(ny, ny * nt, [&](int64_t lo, int64_t hi, int) {
        for (int t = 0; t < nt; ++t) {
          const T* src = part.data() + t * ny;
#pragma omp simd
          for (int64_t i = lo; i < hi; ++i) py[i] += src[i];
        }
      });
    } else if (n >= kParallelMin && nt > 1 && best >= 0 &&
               p.size[static_cast<size_t>(best)] >= nt) {
      p.split = best;
      split_range(p.size[static_cast<size_t>(best)], n,
                  [&](int64_t lo, int64_t hi, int) { sum_rec(p, 0, px, py, lo, hi); });
    } else {
      sum_rec(p, 0, px, py, 0, p.size[0]);
    }
  });
}

/// dX = Y * (dY - sum_axis(dY * Y)) (softmax) or dY - exp(Y) * sum_axis(dY) (log-softmax).
void softmax_grad(OpCall& c, bool log) {
  const View &dy = c.need(0), &yv = c.need(1);
  if (dy.dims != yv.dims || dy.dtype != yv.dtype)
    c.fail("dY " + dims_str(dy.dims) + " and Y " + dims_str(yv.dims) + " must match");
  const int64_t r = static_cast<int64_t>(yv.dims.size());
  if (r == 0) c.fail("Y must have rank >= 1");
  const int64_t a = c.axis(c.i("axis", -1), r);
  int64_t outer, len, inner;
  split_at(yv.dims, a, outer, len, inner);
  View dx = c.out(0, dy.dtype, dy.dims);
  dispatch_float(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *pg = dy.as<T>(), *py = yv.as<T>();
    T* px = dx.as<T>();
    if (dy.numel() == 0) return;
    if (inner == 1) {  // the common case: the axis is the last dim, rows are contiguous
      split_range(outer, dy.numel(), [&](int64_t lo, int64_t hi, int) {
        for (int64_t o = lo; o < hi; ++o) {
          const T *g = pg + o * len, *yr = py + o * len;
          T* xr = px + o * len;
          double acc = 0;
          if (log) {
#pragma omp simd reduction(+ : acc)
            for (int64_t i = 0; i < len; ++i) acc += g[i];
            const T sv = static_cast<T>(acc);
#pragma omp simd
            for (int64_t i = 0; i < len; ++i) xr[i] = g[i] - exp_of(yr[i]) * sv;
          } else {
#pragma omp simd reduction(+ : acc)
            for (int64_t i = 0; i < len; ++i) acc += static_cast<double>(g[i]) * yr[i];
            const T sv = static_cast<T>(acc);
#pragma omp simd
            for (int64_t i = 0; i < len; ++i) xr[i] = yr[i] * (g[i] - sv);
          }
        }
      });
      return;
    }
    // The axis has a stride: sums for a whole [len, inner] block, the inner loops contiguous.
    split_range(outer, dy.numel(), [&](int64_t lo, int64_t hi, int) {
      std::vector<double> acc(static_cast<size_t>(inner));
      for (int64_t o = lo; o < hi; ++o) {
        const T *g = pg + o * len * inner, *yr = py + o * len * inner;
        T* xr = px + o * len * inner;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t l = 0; l < len; ++l)
          for (int64_t i = 0; i < inner; ++i)
            acc[static_cast<size_t>(i)] +=
                log ? g[l * inner + i] : static_cast<double>(g[l * inner + i]) * yr[l * inner + i];
        for (int64_t l = 0; l < len; ++l)
          for (int64_t i = 0; i < inner; ++i) {
            const int64_t e = l * inner + i;
            const T sv = static_cast<T>(acc[static_cast<size_t>(i)]);
            xr[e] = log ? g[e] - exp_of(yr[e]) * sv : yr[e] * (g[e] - sv);
          }
      }
    });
  });
}

// ---- LayerNormGrad
// -------------------------------------------------------------------------------

/// With xh = (x - mean) * rstd over each row of the normalised dims and g = dY * scale:
/// dX = rstd * (g - mean(g) - xh * mean(g * xh)), dScale = sum over rows of dY * xh, dBias = sum
/// over rows of dY. Outputs past the node's last are not computed.
void layer_norm_grad(OpCall& c) {
  const View &dy = c.need(0), &x = c.need(1), &scale = c.need(2);
  if (dy.dims != x.dims || dy.dtype != x.dtype || scale.dtype != x.dtype)
    c.fail("dY " + dims_str(dy.dims) + " and X " + dims_str(x.dims) + " must match");
  const int64_t r = static_cast<int64_t>(x.dims.size());
  if (r == 0) c.fail("X must have rank >= 1");
  const int64_t a = c.axis(c.i("axis", -1), r);
  int64_t rows = 1, len = 1;
  for (int64_t k = 0; k < r; ++k) (k < a ? rows : len) *= x.dims[static_cast<size_t>(k)];
  if (scale.numel() != len)
    c.fail("scale " + dims_str(scale.dims) + " must have the " + std::to_string(len) +
           " elements of X's normalised dims");
  const double eps = c.f("epsilon", 1e-5);
  View dx = c.out(0, x.dtype, x.dims);
  View ds, db;
  if (c.n_outputs() > 1) ds = c.out(1, x.dtype, scale.dims);
  if (c.n_outputs() > 2) db = c.out(2, x.dtype, scale.dims);
  dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *pg = dy.as<T>(), *px = x.as<T>(), *pw = scale.as<T>();
    const bool params = ds.data || db.data;
    const int nt = max_threads();
    std::vector<double> part(params ? static_cast<size_t>(2 * len * nt) : 0, 0.0);
    if (len > 0)
      split_range(rows, rows * len, [&](int64_t lo, int64_t hi, int t) {
        double* ps = params ? part.data() + 2 * len * t : nullptr;
        double* pb = params ? ps + len : nullptr;
        for (int64_t o = lo; o < hi; ++o) {
          const T *xr = px + o * len, *g = pg + o * len;
          T* out = dx.as<T>() + o * len;
          if constexpr (std::is_same_v<T, float>)
            layer_norm_grad_row(xr, g, pw, out, len, eps, ps, pb);  // built for AVX2 too
          else
            layer_norm_grad_row_t(xr, g, pw, out, len, eps, ps, pb);
        }
      });
    for (int64_t i = 0; i < len && params; ++i) {
      double s = 0, b = 0;
      for (int t = 0; t < nt; ++t) {
        s += part[static_cast<size_t>(2 * len * t + i)];
        b += part[static_cast<size_t>(2 * len * t + len + i)];
      }
      if (ds.data) ds.as<T>()[i] = static_cast<T>(s);
      if (db.data) db.as<T>()[i] = static_cast<T>(b);
    }
  });
}

// ---- SoftmaxCrossEntropyGrad
// ---------------------------------------------------------------------

/// dScores = dLoss * (exp(log_prob) - onehot(label)) / count on rows whose label is not
/// ignore_index, 0 on the others. count: the kept rows ("mean"), 1 ("sum"), and with "none" dLoss
/// has one value per row.
void sce_grad(OpCall& c) {
  const View &dl = c.need(0), &lp = c.need(1), &lab = c.need(2);
  if (lp.dims.size() != 2) c.fail("log_prob must be [N, C], got " + dims_str(lp.dims));
  const int64_t N = lp.dims[0], C = lp.dims[1];
  if (lab.dims != Dims{N}) c.fail("labels must be [" + std::to_string(N) + "]");
  if (dl.dtype != lp.dtype) c.fail("dLoss and log_prob differ in dtype");
  const std::string red = c.s("reduction", "mean");
  if (red != "mean" && red != "sum" && red != "none") c.fail("unknown reduction '" + red + "'");
  if (red == "none" ? dl.numel() != N : dl.numel() != 1)
    c.fail("dLoss " + dims_str(dl.dims) + " does not fit reduction '" + red + "'");
  const int64_t ii = c.i("ignore_index", -100);
  const std::vector<int64_t> t = lab.ints();
  int64_t kept = 0;
  for (int64_t v : t) {
    if (v == ii) continue;
    if (v < 0 || v >= C)
      c.fail("label " + std::to_string(v) + " is outside [0, " + std::to_string(C) + ")");
    ++kept;
  }
  View dx = c.out(0, lp.dtype, lp.dims);
  dispatch_float(lp.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *pl = lp.as<T>(), *pd = dl.as<T>();
    T* px = dx.as<T>();
    const double count = red == "mean" ? static_cast<double>(kept) : 1.0;
    split_range(N, N * C, [&](int64_t lo, int64_t hi, int) {
      for (int64_t n = lo; n < hi; ++n) {
        T* row = px + n * C;
        const int64_t label = t[static_cast<size_t>(n)];
        if (label == ii) {
          std::fill(row, row + C, T(0));
          continue;
        }
        const T k = static_cast<T>((red == "none" ? pd[n] : pd[0]) / count);
        const T* lr = pl + n * C;
        if constexpr (std::is_same_v<T, float>) {
          scaled_exp_row(lr, row, C, k);  // the loop built for AVX2 too
        } else {
#pragma omp simd
          for (int64_t j = 0; j < C; ++j) row[j] = k * exp_of(lr[j]);
        }
        row[label] -= k;
      }
    });
  });
}

/// GeluGrad(dY, X) = dY (Phi(x) + x phi(x)), the exact GELU's derivative in one pass (the
/// exported five-node chain would take a dozen elementwise ops backward). Float32 goes through
/// gelu_grad_span (cpu_kernels.cpp: erf as the forward's gelu_f computes it, built for AVX2 too).
void gelu_grad(OpCall& c) {
  const View &dy = c.need(0), &x = c.need(1);
  if (dy.dims != x.dims)
    c.fail("dY " + dims_str(dy.dims) + " and X " + dims_str(x.dims) + " differ in shape");
  if (dy.dtype != x.dtype) c.fail("dY and X differ in dtype");
  View dx = c.out(0, x.dtype, x.dims);
  const int64_t n = x.numel();
  if (x.dtype == HP_F32) {
    split_range(n, n, [&](int64_t lo, int64_t hi, int) {
      gelu_grad_span(x.as<float>() + lo, dy.as<float>() + lo, dx.as<float>() + lo, hi - lo);
    });
    return;
  }
  dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    const T* pd = dy.as<T>();
    T* po = dx.as<T>();
    split_range(n, n, [&](int64_t lo, int64_t hi, int) {
      for (int64_t i = lo; i < hi; ++i) {
        const double v = static_cast<double>(px[i]);
        const double d = 0.5 * (1.0 + std::erf(v * 0.70710678118654752440)) +
                         v * 0.39894228040143267794 * std::exp(-0.5 * v * v);
        po[i] = static_cast<T>(pd[i] * d);
      }
    });
  });
}

}  // namespace

void register_grad_ops(OpTable& t) {
  t["hp.train.GeluGrad"] = {gelu_grad, types("ff")};
  t["hp.train.SumTo"] = {sum_to, types("fi")};
  t["hp.train.SoftmaxGrad"] = {[](OpCall& c) { softmax_grad(c, false); }, types("ff")};
  t["hp.train.LogSoftmaxGrad"] = {[](OpCall& c) { softmax_grad(c, true); }, types("ff")};
  t["hp.train.LayerNormGrad"] = {layer_norm_grad, types("fff")};
  t["hp.train.SoftmaxCrossEntropyGrad"] = {sce_grad, types("ffi")};
  register_grad_index_ops(t);
  register_grad_conv_ops(t);
  register_grad_rnn_ops(t);
}

}  // namespace hp_cpu
