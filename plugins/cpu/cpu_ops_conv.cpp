// Conv on the cpu backend, and the fused convolutions the executor writes
// (libs/exec/src/exec_fuse.cpp, exec_layout.cpp).
//
// Conv in float32 runs as Winograd F(2x2, 3x3) where that applies (3x3, stride 1, channels in
// multiples of 16, AVX-512: cpu_winograd.cpp), else on oneDNN's convolution primitive
// (cpu_conv.cpp); float64, and any geometry oneDNN rejects, run a direct loop (any spatial rank,
// groups, dilations, explicit or auto padding) that accumulates in double. com.microsoft's
// FusedConv (ONNX Runtime's contrib op, which the executor's fusion pass writes for Conv [+ Add] +
// Relu, libs/exec/src/exec_fuse.cpp) is the same kernel with an optional fourth input Z added to
// the convolution and an activation after it.
//
// hp.nn.FusedConv is FusedConv with channels-last operands (see conv()).
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_bcast.h"
#include "cpu_internal.h"
#include "cpu_kernels.h"
#include "cpu_winograd.h"

namespace hp_cpu {
namespace {

/// The direct convolution of conv() once the output's dims and the pads are known; accumulates in
/// double, output elements split across threads by (n, m).
template <class T>
void conv_loop(const View& x, const View& w, const View& bias, View& y, const Dims& out,
               const Dims& strides, const Dims& dil, const Dims& pads, int64_t group) {
  const size_t sp = x.dims.size() - 2;
  const int64_t N = x.dims[0], C = x.dims[1], M = w.dims[0];
  const Dims xs = strides_of(x.dims), ws = strides_of(w.dims), ys = strides_of(out);
  const int64_t cg = C / group, mg = M / group;
  Dims ksz(w.dims.begin() + 2, w.dims.end()), osz(out.begin() + 2, out.end());
  const int64_t kn = numel(ksz), on = numel(osz);
#pragma omp parallel for schedule(static) collapse(2) if (N * M * on * cg * kn >= (1 << 16))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      Dims oo(sp);
      const int64_t g = m / mg;
      for (int64_t op = 0; op < on; ++op) {
        int64_t rest = op;
        for (size_t d = sp; d-- > 0;) {
          oo[d] = rest % osz[d];
          rest /= osz[d];
        }
        double acc = bias.present() ? bias.as<T>()[m] : 0.0;
        for (int64_t ci = 0; ci < cg; ++ci)
          for (int64_t kp = 0; kp < kn; ++kp) {
            int64_t rem = kp, xoff = n * xs[0] + (g * cg + ci) * xs[1],
                    woff = m * ws[0] + ci * ws[1];
            bool inside = true;
            for (size_t d = sp; d-- > 0;) {
              const int64_t kd = rem % ksz[d];
              rem /= ksz[d];
              const int64_t pos = oo[d] * strides[d] - pads[d] + kd * dil[d];
              if (pos < 0 || pos >= x.dims[2 + d]) {
                inside = false;
                break;
              }
              xoff += pos * xs[2 + d];
              woff += kd * ws[2 + d];
            }
            if (inside) acc += static_cast<double>(x.as<T>()[xoff]) * w.as<T>()[woff];
          }
        y.as<T>()[n * ys[0] + m * ys[1] + op] = static_cast<T>(acc);
      }
    }
}

/// N x H x W x C <-> N x C x H x W copies of a 4-D tensor (dims of the NCHW side), for the
/// channels-last operands of hp.nn.FusedConv on the direct loop's path.
template <class T>
void nhwc_nchw(const T* from, T* to, const Dims& nchw, bool to_nchw) {
  const int64_t N = nchw[0], C = nchw[1], HW = nchw[2] * nchw[3];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t p = 0; p < HW; ++p)
      for (int64_t ch = 0; ch < C; ++ch) {
        const int64_t cl = (n * HW + p) * C + ch, cf = (n * C + ch) * HW + p;
        if (to_nchw)
          to[cf] = from[cl];
        else
          to[cl] = from[cf];
      }
}

Dims nchw_of(const Dims& nhwc) { return {nhwc[0], nhwc[3], nhwc[1], nhwc[2]}; }
Dims nhwc_of(const Dims& nchw) { return {nchw[0], nchw[2], nchw[3], nchw[1]}; }

/// Conv, and FusedConv when `fused`: Y = activation(conv(X, W) + B + Z) with Z (input 3) optional
/// and the activation "Relu" or none. hp.nn.FusedConv (`channels_last`) is FusedConv with the
/// attribute channels_last = [x, z, y]: each nonzero one says that operand is stored N x H x W x C
/// (its dims in that order), which the executor sets between consecutive convolutions
/// (libs/exec/src/exec_layout.cpp) so that oneDNN's channels-last kernels need no reorder there.
void conv(OpCall& c, bool fused, bool channels_last = false) {
  View x = c.need(0);
  const View &w = c.need(1), &bias = c.in(2);
  View z = c.in(3);  // absent for Conv (three inputs at most)
  bool cl[3] = {false, false, false};
  if (channels_last) {
    const std::vector<int64_t> v = c.ints("channels_last");
    if (v.size() != 3) c.fail("channels_last must have 3 values (x, z, y)");
    for (int i = 0; i < 3; ++i) cl[i] = v[static_cast<size_t>(i)] != 0;
    if ((cl[0] && x.dims.size() != 4) || (cl[1] && z.present() && z.dims.size() != 4))
      c.fail("channels_last operands must be 4-D");
    if (cl[0]) x.dims = nchw_of(x.dims);
    if (cl[1] && z.present()) z.dims = nchw_of(z.dims);
  }
  const size_t sp = x.dims.size() < 3 ? 0 : x.dims.size() - 2;
  if (sp == 0 || w.dims.size() != x.dims.size())
    c.fail("conv needs N x C x spatial input and matching weights");
  const int64_t group = c.i("group", 1), N = x.dims[0], C = x.dims[1], M = w.dims[0];
  if (group < 1 || C != w.dims[1] * group || M % group)
    c.fail("channels do not match the weights and groups");
  if (bias.present() && bias.numel() != M) c.fail("bias must have one value per output channel");
  const std::string act = fused ? c.s("activation", "") : "";
  if (!act.empty() && act != "Relu") c.fail("FusedConv activation '" + act + "' not supported");
  std::vector<int64_t> strides = c.ints("strides"), dil = c.ints("dilations"),
                       pads = c.ints("pads");
  strides.resize(sp, 1);
  dil.resize(sp, 1);
  for (auto& v : strides) v = v ? v : 1;
  for (auto& v : dil) v = v ? v : 1;
  pads.resize(2 * sp, 0);
  const std::string ap = c.s("auto_pad", "NOTSET");
  Dims out{N, M};
  for (size_t d = 0; d < sp; ++d) {
    const int64_t in = x.dims[2 + d], kk = (w.dims[2 + d] - 1) * dil[d] + 1;
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      const int64_t o = (in + strides[d] - 1) / strides[d];
      const int64_t total = std::max<int64_t>((o - 1) * strides[d] + kk - in, 0);
      pads[d] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      pads[d + sp] = total - pads[d];
    } else if (ap == "VALID") {
      pads[d] = pads[d + sp] = 0;
    }
    if (strides[d] < 1 || dil[d] < 1 || pads[d] < 0 || pads[d + sp] < 0)
      c.fail("strides and dilations must be >= 1 and pads >= 0");
    if (in + pads[d] + pads[d + sp] < kk) c.fail("the kernel is larger than the padded input");
    out.push_back((in + pads[d] + pads[d + sp] - kk) / strides[d] + 1);
  }
  const bool sum = fused && z.present() && z.numel() > 0;
  if (sum && z.dtype != x.dtype) c.fail("FusedConv's Z differs from X in dtype");
  // Z as the Add it replaces: broadcast against the convolution's output, usually of its shape
  // (a residual), which the oneDNN primitive adds as a post-op.
  const Dims ydims = sum ? broadcast_shapes(out, z.dims, c) : out;
  const bool same = !sum || z.dims == out;
  if (cl[2] && ydims.size() != 4) c.fail("channels_last operands must be 4-D");
  View y = c.out(0, x.dtype, cl[2] ? nhwc_of(ydims) : ydims);
  y.dims = ydims;
  if (numel(ydims) == 0) return;
  if (x.dtype == HP_F32 && same) {
    ConvShape s{x.dims, w.dims, out, strides, dil, pads, group, bias.present(), sum, act == "Relu"};
    s.x_nhwc = cl[0];
    s.z_nhwc = sum && cl[1];
    s.y_nhwc = cl[2];
    s.bf16 = c.ctx()->bf16;
    if (conv_forward_winograd(c.ctx(), s, x.as<float>(), w.as<float>(),
                              s.bias ? bias.as<float>() : nullptr, sum ? z.as<float>() : nullptr,
                              y.as<float>(), c.i("hp_weight_b", 0)))
      return;
    if (conv_forward_dnnl(c.ctx(), c.stream(), s, x.as<float>(), w.as<float>(),
                          s.bias ? bias.as<float>() : nullptr, sum ? z.as<float>() : nullptr,
                          y.as<float>(), c.i("hp_weight_b", 0)))
      return;
  }
  auto loop = [&](auto tag) {
    using T = decltype(tag);
    // Channels-last operands go through N x C x H x W copies: the loop indexes that layout.
    std::vector<T> xt, zt, yt;
    if (cl[0]) {
      xt.resize(static_cast<size_t>(x.numel()));
      nhwc_nchw(x.as<T>(), xt.data(), x.dims, true);
      x.data = xt.data();
    }
    if (cl[1] && sum) {
      zt.resize(static_cast<size_t>(z.numel()));
      nhwc_nchw(z.as<T>(), zt.data(), z.dims, true);
      z.data = zt.data();
    }
    T* const y_user = y.as<T>();
    if (cl[2]) {
      yt.resize(static_cast<size_t>(numel(ydims)));
      y.data = yt.data();
    }
    std::vector<T> tmp(same ? 0 : static_cast<size_t>(numel(out)));
    View conv_out = y;
    if (!same) {
      conv_out.dims = out;
      conv_out.data = tmp.data();
    }
    conv_loop<T>(x, w, bias, conv_out, out, strides, dil, pads, group);
    if (sum) binary_bcast<T, T, T>(conv_out, z, y, [](T a, T b) { return a + b; });
    T* py = y.as<T>();
    const int64_t n = numel(ydims);
    if (act == "Relu")
      for (int64_t i = 0; i < n; ++i) py[i] = std::max(py[i], T(0));
    if (cl[2]) nhwc_nchw(yt.data(), y_user, ydims, false);
  };
  if (x.dtype == HP_F64)
    loop(double{});
  else
    loop(float{});
}

}  // namespace

void register_conv_ops(OpTable& t) {
  t["Conv"] = {[](OpCall& c) { conv(c, false); }, same_float};
  t["com.microsoft.FusedConv"] = {[](OpCall& c) { conv(c, true); }, same_float};
  t["hp.nn.FusedConv"] = {[](OpCall& c) { conv(c, true, true); }, same_float};
}

}  // namespace hp_cpu
