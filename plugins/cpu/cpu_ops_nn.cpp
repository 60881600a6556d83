// Neural-network ONNX ops on the cpu backend: MatMul and Gemm (float32 through the same oneDNN
// matmul path as the ABI's gemm entry, so primitives are cached by shape; float64 through a plain
// loop over the same descriptor), hp.nn.MatMulAdd (a linear layer with its bias and activation),
// Softmax/LogSoftmax and LayerNormalization. Conv is in cpu_ops_conv.cpp.
//
// Float64 is there for `hp verify --grad` (docs/training.md), which runs whole models in double to
// compare gradients with finite differences: correct and simple loops rather than fast ones.
//
// MatMul follows numpy: 1-D operands get a dim inserted and removed again, batch dims broadcast.
// When B has no batch (the weight of a linear layer) A's batch is folded into M and one GEMM runs;
// when the batch shapes are equal one strided batched GEMM runs; other broadcasts loop over the
// batch.
//
// Softmax before opset 13 flattens the input to 2-D at `axis`; from 13 it works along `axis` only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpu_bcast.h"
#include "cpu_internal.h"
#include "cpu_kernels.h"

namespace hp_cpu {
namespace {

hp_gemm_desc gemm_desc(int64_t m, int64_t n, int64_t k, bool ta, bool tb, const void* a,
                       const void* b, void* c, double alpha = 1.0, int dtype = HP_F32) {
  hp_gemm_desc d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.trans_a = ta;
  d.trans_b = tb;
  d.m = m;
  d.n = n;
  d.k = k;
  d.lda = ta ? m : k;
  d.ldb = tb ? k : n;
  d.ldc = n;
  d.batch = 1;
  d.alpha = alpha;
  d.beta = 0;
  d.type_a = d.type_b = d.type_c = d.type_compute = dtype;
  d.a = a;
  d.b = b;
  d.c = c;
  return d;
}

/// C = alpha * op(A) op(B) in double, rows spread across threads (beta is 0 here).
void gemm_f64(const hp_gemm_desc& d) {
  const auto* A = static_cast<const double*>(d.a);
  const auto* B = static_cast<const double*>(d.b);
  auto* C = static_cast<double*>(d.c);
#pragma omp parallel for schedule(static) collapse(2) if (d.batch * d.m * d.n * d.k >= (1 << 16))
  for (int64_t q = 0; q < d.batch; ++q)
    for (int64_t i = 0; i < d.m; ++i) {
      const double* a = A + q * d.stride_a;
      const double* b = B + q * d.stride_b;
      double* row = C + q * d.stride_c + i * d.ldc;
      for (int64_t j = 0; j < d.n; ++j) row[j] = 0;
      for (int64_t p = 0; p < d.k; ++p) {
        const double av = d.alpha * (d.trans_a ? a[p * d.lda + i] : a[i * d.lda + p]);
        if (d.trans_b)
          for (int64_t j = 0; j < d.n; ++j) row[j] += av * b[j * d.ldb + p];
        else
          for (int64_t j = 0; j < d.n; ++j) row[j] += av * b[p * d.ldb + j];
      }
    }
}

/// `weight_id`: the executor's name for a constant B (node attribute hp_weight_b), packed once.
void run_gemm(OpCall& c, const hp_gemm_desc& d, int64_t weight_id = 0) {
  if (d.m == 0 || d.n == 0) return;
  const size_t elem = d.type_c == HP_F64 ? sizeof(double) : sizeof(float);
  if (d.k == 0) {
    std::memset(d.c, 0, static_cast<size_t>(d.m * d.n * d.batch) * elem);
    return;
  }
  if (d.type_c == HP_F64) return gemm_f64(d);
  GemmEpilogue e;
  e.weight_id = weight_id;
  if (hp_status* st =
          weight_id != 0 ? gemm_fused(c.ctx(), c.stream(), d, e) : gemm(c.ctx(), c.stream(), &d)) {
    std::string m = st->message;
    delete st;
    c.fail(m);
  }
}

/// MatMul of a and b (numpy semantics) into the view `alloc(dtype, dims)` returns.
template <class Alloc>
View matmul_into(OpCall& c, View a, View b, Alloc&& alloc) {
  const bool a1 = a.dims.size() == 1, b1 = b.dims.size() == 1;
  if (a.dims.empty() || b.dims.empty()) c.fail("matmul operands must have rank >= 1");
  if (a1) a.dims.insert(a.dims.begin(), 1);
  if (b1) b.dims.push_back(1);
  const int64_t m = a.dims[a.dims.size() - 2], k = a.dims.back(), n = b.dims.back();
  if (b.dims[b.dims.size() - 2] != k)
    c.fail("inner dims differ: " + dims_str(a.dims) + " x " + dims_str(b.dims));
  Dims ab(a.dims.begin(), a.dims.end() - 2), bb(b.dims.begin(), b.dims.end() - 2);
  Dims batch = broadcast_shapes(ab, bb, c);
  Dims out = batch;
  if (!a1) out.push_back(m);
  if (!b1) out.push_back(n);
  if (a.dtype != b.dtype) c.fail("matmul operands have different element types");
  const int dt = a.dtype;
  View y = alloc(dt, out);
  const size_t es = dt == HP_F64 ? sizeof(double) : sizeof(float);
  const auto* pa = static_cast<const unsigned char*>(a.data);
  const auto* pb = static_cast<const unsigned char*>(b.data);
  auto* py = static_cast<unsigned char*>(y.data);
  const int64_t nb = numel(batch);
  if (numel(bb) == 1 && numel(ab) == nb) {
    run_gemm(c, gemm_desc(nb * m, n, k, false, false, pa, pb, py, 1.0, dt), c.i("hp_weight_b", 0));
  } else if (ab == bb) {
    hp_gemm_desc d = gemm_desc(m, n, k, false, false, pa, pb, py, 1.0, dt);
    d.batch = nb;
    d.stride_a = m * k;
    d.stride_b = k * n;
    d.stride_c = m * n;
    if (nb > 0) run_gemm(c, d);
  } else {
    Dims sa = broadcast_strides(ab, batch), sb = broadcast_strides(bb, batch);
    Dims idx(batch.size(), 0);
    for (int64_t q = 0; q < nb; ++q) {
      int64_t oa = 0, ob = 0;
      for (size_t d = 0; d < batch.size(); ++d) {
        oa += idx[d] * sa[d];
        ob += idx[d] * sb[d];
      }
      run_gemm(c, gemm_desc(m, n, k, false, false, pa + es * static_cast<size_t>(oa * m * k),
                            pb + es * static_cast<size_t>(ob * k * n),
                            py + es * static_cast<size_t>(q * m * n), 1.0, dt));
      for (size_t d = batch.size(); d-- > 0;) {
        if (++idx[d] < batch[d]) break;
        idx[d] = 0;
      }
    }
  }
  return y;
}

void matmul(OpCall& c) {
  matmul_into(c, c.need(0), c.need(1), [&](int dt, const Dims& d) { return c.out(0, dt, d); });
}

/// hp.nn.MatMulAdd: Y = activation(MatMul(A, B) + Z) [+ R], activation "" / "Relu" / "Gelu"
/// (exact), which the executor writes for a linear layer's MatMul -> Add [-> Gelu | Relu] chain
/// [-> Add(., R)], the last Add a residual connection (libs/exec/src/exec_fuse.cpp). When B is a
/// matrix, Z one value per column (a bias), as exported linear layers are, and R absent or shaped
/// as the product, it is one oneDNN matmul with bias, eltwise and binary post-ops; any other shapes
/// (and float64) run the MatMul, the broadcast Adds and the activation in turn, so the node means
/// exactly the chain it replaced.
void matmul_add(OpCall& c) {
  const View &a = c.need(0), &b = c.need(1), &z = c.need(2), &r = c.in(3);
  const std::string act = c.s("activation", "");
  if (!act.empty() && act != "Relu" && act != "Gelu")
    c.fail("MatMulAdd activation '" + act + "' not supported");
  const int64_t n = b.dims.empty() ? 0 : b.dims.back();
  // One value per column: Z's last dim is n and any before it 1 (a [n, 1] Z holds one per row).
  bool bias = z.dims.size() >= 1 && z.dims.size() <= a.dims.size() && z.dims.back() == n;
  for (size_t d = 0; bias && d + 1 < z.dims.size(); ++d) bias = z.dims[d] == 1;
  Dims prod = a.dims;
  if (!prod.empty()) prod.back() = n;
  if (a.dtype == HP_F32 && b.dtype == HP_F32 && z.dtype == HP_F32 && a.dims.size() >= 2 &&
      b.dims.size() == 2 && b.dims[0] == a.dims.back() && bias && n > 0 && b.dims[0] > 0 &&
      (!r.present() || (r.dtype == HP_F32 && r.dims == prod))) {
    View y = c.out(0, HP_F32, prod);
    const int64_t k = a.dims.back(), m = numel(a.dims) / k;
    if (m == 0) return;
    const GemmEpilogue e{z.as<float>(),
                         act == "Relu"   ? GemmAct::relu
                         : act == "Gelu" ? GemmAct::gelu_erf
                                         : GemmAct::none,
                         c.i("hp_weight_b", 0), r.present() ? r.as<float>() : nullptr};
    if (hp_status* st = gemm_fused(c.ctx(), c.stream(),
                                   gemm_desc(m, n, k, false, false, a.data, b.data, y.data), e)) {
      std::string msg = st->message;
      delete st;
      c.fail(msg);
    }
    return;
  }
  if (a.dtype != z.dtype) c.fail("MatMulAdd's Z differs from A in dtype");
  if (r.present() && r.dtype != a.dtype) c.fail("MatMulAdd's R differs from A in dtype");
  std::vector<unsigned char> tmp, tmp2;
  const View t = matmul_into(c, a, b, [&](int dt, const Dims& d) {
    tmp.resize(static_cast<size_t>(numel(d)) * (dt == HP_F64 ? sizeof(double) : sizeof(float)));
    return View{dt, d, tmp.data()};
  });
  const Dims biased = broadcast_shapes(t.dims, z.dims, c);
  // Without R the activation's result is the output; with R an intermediate it is added to.
  View u{t.dtype, biased, nullptr};
  if (r.present()) {
    tmp2.resize(static_cast<size_t>(numel(biased)) * dtype_size(t.dtype));
    u.data = tmp2.data();
  } else {
    u = c.out(0, t.dtype, biased);
  }
  auto finish = [&](auto tag) {
    using T = decltype(tag);
    binary_bcast<T, T, T>(t, z, u, [](T p, T q) { return p + q; });
    T* pu = u.as<T>();
    const int64_t len = u.numel();
    if (act == "Relu")
      for (int64_t i = 0; i < len; ++i) pu[i] = std::max(pu[i], T(0));
    if (act == "Gelu") {
      if constexpr (std::is_same_v<T, float>)
        gelu_span(pu, pu, len);
      else
        for (int64_t i = 0; i < len; ++i) pu[i] = 0.5 * pu[i] * (1 + std::erf(pu[i] * M_SQRT1_2));
    }
    if (r.present()) {
      View y = c.out(0, t.dtype, broadcast_shapes(u.dims, r.dims, c));
      binary_bcast<T, T, T>(u, r, y, [](T p, T q) { return p + q; });
    }
  };
  if (t.dtype == HP_F64)
    finish(double{});
  else
    finish(float{});
}

void gemm_op(OpCall& c) {
  const View &a = c.need(0), &b = c.need(1), &bias = c.in(2);
  if (a.dims.size() != 2 || b.dims.size() != 2) c.fail("gemm operands must be 2-D");
  const bool ta = c.i("transA", 0) != 0, tb = c.i("transB", 0) != 0;
  const int64_t m = ta ? a.dims[1] : a.dims[0], k = ta ? a.dims[0] : a.dims[1];
  const int64_t n = tb ? b.dims[0] : b.dims[1];
  if ((tb ? b.dims[1] : b.dims[0]) != k) c.fail("inner dims differ");
  View y = c.out(0, a.dtype, {m, n});
  run_gemm(c, gemm_desc(m, n, k, ta, tb, a.data, b.data, y.data, c.f("alpha", 1.0), a.dtype),
           c.i("hp_weight_b", 0));
  if (!bias.present() || bias.numel() == 0) return;
  // C must broadcast to [M, N] one way (ONNX's unidirectional broadcasting).
  const Dims mn = {m, n};
  bool fits = bias.dims.size() <= 2;
  for (size_t d = 0; fits && d < bias.dims.size(); ++d) {
    const int64_t have = bias.dims[bias.dims.size() - 1 - d], want = mn[1 - d];
    fits = have == 1 || have == want;
  }
  if (!fits) c.fail("C " + dims_str(bias.dims) + " does not broadcast to " + dims_str(mn));
  Dims st = broadcast_strides(bias.dims, mn);
  auto add_bias = [&](auto tag) {
    using T = decltype(tag);
    const T beta = static_cast<T>(c.f("beta", 1.0));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        y.as<T>()[i * n + j] += beta * bias.as<T>()[i * st[0] + j * st[1]];
  };
  if (a.dtype == HP_F64)
    add_bias(double{});
  else
    add_bias(float{});
}

/// The common case: float32 along the innermost axis, contiguous rows (cpu_kernels.cpp).
void softmax_rows_f32(const float* x, float* y, int64_t rows, int64_t len, bool log) {
#pragma omp parallel for schedule(static) if (rows * len >= (1 << 15))
  for (int64_t o = 0; o < rows; ++o) softmax_row(x + o * len, y + o * len, len, log);
}

template <class T>
void softmax_rows(const T* x, T* y, int64_t outer, int64_t len, int64_t inner, bool log) {
#pragma omp parallel for schedule(static) collapse(2) if (outer * len * inner >= (1 << 15))
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      const T* px = x + o * len * inner + in;
      T* py = y + o * len * inner + in;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < len; ++i) mx = std::max(mx, px[i * inner]);
      T sum = 0;
      for (int64_t i = 0; i < len; ++i) {
        T e = std::exp(px[i * inner] - mx);
        sum += e;
        if (!log) py[i * inner] = e;
      }
      if (log) {
        const T ls = std::log(sum);
        for (int64_t i = 0; i < len; ++i) py[i * inner] = px[i * inner] - mx - ls;
      } else {
        const T inv = T(1) / sum;
        for (int64_t i = 0; i < len; ++i) py[i * inner] *= inv;
      }
    }
}

void softmax(OpCall& c, bool log) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  View y = c.out(0, x.dtype, x.dims);
  const int64_t a = c.axis(c.i("axis", c.opset() >= 13 ? -1 : 1), std::max<int64_t>(r, 1));
  int64_t outer = 1, len = 1, inner = 1;
  for (int64_t d = 0; d < r; ++d) {
    const int64_t v = x.dims[static_cast<size_t>(d)];
    if (d < a)
      outer *= v;
    else if (d == a || c.opset() < 13)
      len *= v;
    else
      inner *= v;
  }
  if (x.numel() == 0) return;
  if (x.dtype == HP_F32 && inner == 1) {
    if (c.ctx()->softmaxes.run(c.ctx()->engine, c.stream()->dnnl_stream, x.as<float>(),
                               y.as<float>(), outer, len, log))
      return;
    return softmax_rows_f32(x.as<float>(), y.as<float>(), outer, len, log);
  }
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>)
      softmax_rows<T>(x.as<T>(), y.as<T>(), outer, len, inner, log);
  });
}

/// LayerNormalization in double: the statistics (also outputs 1 and 2, which then hold double
/// rather than the float32 of stash_type) and the epsilon as the attribute holds it.
void layer_norm_f64(OpCall& c, const View& x, const View& scale, const View& bias, View& y,
                    int64_t outer, int64_t len, const Dims& stat_dims) {
  const double eps = c.f("epsilon", 1e-5);
  double* mean_out = c.n_outputs() > 1 ? c.out(1, HP_F64, stat_dims).as<double>() : nullptr;
  double* rstd_out = c.n_outputs() > 2 ? c.out(2, HP_F64, stat_dims).as<double>() : nullptr;
  const double* ps = scale.as<double>();
  const double* pb = bias.present() && bias.numel() > 0 ? bias.as<double>() : nullptr;
  const int64_t ss = scale.numel() == 1 ? 0 : 1, bs = pb && bias.numel() == len ? 1 : 0;
#pragma omp parallel for schedule(static) if (outer * len >= (1 << 15))
  for (int64_t o = 0; o < outer; ++o) {
    const double* px = x.as<double>() + o * len;
    double* py = y.as<double>() + o * len;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < len; ++i) mean += px[i];
    mean /= static_cast<double>(len);
    for (int64_t i = 0; i < len; ++i) var += (px[i] - mean) * (px[i] - mean);
    const double rstd = 1 / std::sqrt(var / static_cast<double>(len) + eps);
    for (int64_t i = 0; i < len; ++i)
      py[i] = (px[i] - mean) * rstd * ps[i * ss] + (pb ? pb[i * bs] : 0.0);
    if (mean_out) mean_out[o] = mean;
    if (rstd_out) rstd_out[o] = rstd;
  }
}

void layer_norm(OpCall& c) {
  const View &x = c.need(0), &scale = c.need(1), &bias = c.in(2);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  const int64_t a = c.axis(c.i("axis", -1), r);
  const float eps = static_cast<float>(c.f("epsilon", 1e-5));
  int64_t outer = 1, len = 1;
  for (int64_t d = 0; d < r; ++d) (d < a ? outer : len) *= x.dims[static_cast<size_t>(d)];
  if (scale.numel() != len && scale.numel() != 1)
    c.fail("scale does not match the normalised dims");
  View y = c.out(0, x.dtype, x.dims);
  Dims stat_dims = x.dims;
  for (int64_t d = a; d < r; ++d) stat_dims[static_cast<size_t>(d)] = 1;
  if (x.dtype == HP_F64) return layer_norm_f64(c, x, scale, bias, y, outer, len, stat_dims);
  float* mean_out = c.n_outputs() > 1 ? c.out(1, HP_F32, stat_dims).as<float>() : nullptr;
  float* rstd_out = c.n_outputs() > 2 ? c.out(2, HP_F32, stat_dims).as<float>() : nullptr;
  const float* px = x.as<float>();
  float* py = y.as<float>();
  const float* ps = scale.as<float>();
  const float* pb = bias.present() && bias.numel() > 0 ? bias.as<float>() : nullptr;
  const int64_t ss = scale.numel() == 1 ? 0 : 1, bs = pb && bias.numel() == len ? 1 : 0;
#pragma omp parallel for schedule(static) if (outer * len >= (1 << 15))
  for (int64_t o = 0; o < outer; ++o)
    layer_norm_row(px + o * len, py + o * len, len, ps, ss, pb, bs, eps,
                   mean_out ? mean_out + o : nullptr, rstd_out ? rstd_out + o : nullptr);
}

bool floats(const std::vector<int32_t>& d) {
  for (int32_t t : d)
    if (t != -1 && t != HP_F32 && t != HP_F64) return false;
  return !d.empty() && d[0] != -1;
}

}  // namespace

void register_nn_ops(OpTable& t) {
  t["MatMul"] = {matmul, same_float};
  t["Gemm"] = {gemm_op, same_float};
  t["Softmax"] = {[](OpCall& c) { softmax(c, false); }, floats};
  t["LogSoftmax"] = {[](OpCall& c) { softmax(c, true); }, floats};
  t["LayerNormalization"] = {layer_norm, same_float};
  t["hp.nn.MatMulAdd"] = {matmul_add, same_float};
}

}  // namespace hp_cpu
