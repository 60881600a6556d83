// Quantised convolutions on the cpu backend: ConvInteger (int32 output) and QLinearConv
// (requantised to 8 bits), the Conv of int8/uint8 exports.
//
// Both accumulate sum (x - x_zero) * (w - w_zero[m]) exactly in int64 over the same geometry as
// Conv (groups, strides, dilations, explicit or auto padding; padding reads as x_zero, that is as
// 0 after the shift). QLinearConv then adds its int32 bias and maps the sum to
// saturate(round(sum * x_scale * w_scale[m] / y_scale) + y_zero), rounding halves to even.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

struct ConvGeom {
  Dims out;  ///< [N, M, spatial...]
  std::vector<int64_t> strides, dil, pads;
};

ConvGeom conv_geom(const OpCall& c, const View& x, const View& w) {
  const size_t sp = x.dims.size() < 3 ? 0 : x.dims.size() - 2;
  if (sp == 0 || w.dims.size() != x.dims.size())
    c.fail("conv needs N x C x spatial input and matching weights");
  const int64_t group = c.i("group", 1), C = x.dims[1], M = w.dims[0];
  if (group <= 0 || C != w.dims[1] * group || M % group)
    c.fail("channels do not match the weights and groups");
  ConvGeom g;
  g.strides = c.ints("strides");
  g.dil = c.ints("dilations");
  g.pads = c.ints("pads");
  g.strides.resize(sp, 1);
  g.dil.resize(sp, 1);
  g.pads.resize(2 * sp, 0);
  const std::string ap = c.s("auto_pad", "NOTSET");
  g.out = {x.dims[0], M};
  for (size_t d = 0; d < sp; ++d) {
    const int64_t in = x.dims[2 + d], kk = (w.dims[2 + d] - 1) * g.dil[d] + 1, s = g.strides[d];
    if (s <= 0 || g.dil[d] <= 0) c.fail("strides and dilations must be positive");
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      const int64_t o = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>((o - 1) * s + kk - in, 0);
      g.pads[d] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      g.pads[d + sp] = total - g.pads[d];
    } else if (ap == "VALID") {
      g.pads[d] = g.pads[d + sp] = 0;
    }
    g.out.push_back((in + g.pads[d] + g.pads[d + sp] - kk) / s + 1);
  }
  return g;
}

/// The shifted integer convolution, [N, M, spatial...] in row-major order.
std::vector<int64_t> int_conv(const OpCall& c, const View& x, const View& w, const View& xzp,
                              const View& wzp, const ConvGeom& g) {
  const size_t sp = x.dims.size() - 2;
  const int64_t N = x.dims[0], C = x.dims[1], M = w.dims[0], G = c.i("group", 1);
  const int64_t cg = C / G, mg = M / G;
  const std::vector<int64_t> xv = x.ints(), wv = w.ints();
  const int64_t xz = xzp.present() && xzp.numel() > 0 ? xzp.ints()[0] : 0;
  const std::vector<int64_t> wz = wzp.present() && wzp.numel() > 0 ? wzp.ints() : Dims{0};
  if (wz.size() != 1 && static_cast<int64_t>(wz.size()) != M)
    c.fail("w_zero_point must be a scalar or have one value per output channel");
  const Dims ksz(w.dims.begin() + 2, w.dims.end()), osz(g.out.begin() + 2, g.out.end());
  const Dims xs = strides_of(x.dims), ws = strides_of(w.dims), kst = strides_of(ksz),
             ost = strides_of(osz);
  const int64_t kn = numel(ksz), on = numel(osz);
  std::vector<int64_t> y(static_cast<size_t>(N * M * on));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t grp = m / mg, wzm = wz[wz.size() == 1 ? 0 : m];
      for (int64_t op = 0; op < on; ++op) {
        int64_t acc = 0;
        for (int64_t ci = 0; ci < cg; ++ci)
          for (int64_t kp = 0; kp < kn; ++kp) {
            int64_t xoff = n * xs[0] + (grp * cg + ci) * xs[1];
            bool inside = true;
            for (size_t d = 0; d < sp && inside; ++d) {
              const int64_t pos = (op / ost[d] % osz[d]) * g.strides[d] - g.pads[d] +
                                  (kp / kst[d] % ksz[d]) * g.dil[d];
              inside = pos >= 0 && pos < x.dims[2 + d];
              xoff += pos * xs[2 + d];
            }
            if (inside) acc += (xv[xoff] - xz) * (wv[m * ws[0] + ci * ws[1] + kp] - wzm);
          }
        y[(n * M + m) * on + op] = acc;
      }
    }
  return y;
}

void conv_integer(OpCall& c) {
  const View &x = c.need(0), &w = c.need(1);
  const ConvGeom g = conv_geom(c, x, w);
  const std::vector<int64_t> acc = int_conv(c, x, w, c.in(2), c.in(3), g);
  View y = c.out(0, HP_I32, g.out);
  for (size_t i = 0; i < acc.size(); ++i) y.as<int32_t>()[i] = static_cast<int32_t>(acc[i]);
}

void qlinear_conv(OpCall& c) {
  const View &x = c.need(0), &xs = c.need(1), &w = c.need(3), &ws = c.need(4), &ys = c.need(6),
             &yz = c.need(7), &bias = c.in(8);
  const ConvGeom g = conv_geom(c, x, w);
  const std::vector<int64_t> acc = int_conv(c, x, w, c.need(2), c.need(5), g);
  const int64_t M = g.out[1], on = numel(Dims(g.out.begin() + 2, g.out.end()));
  if (ws.numel() != 1 && ws.numel() != M)
    c.fail("w_scale must be a scalar or have one value per output channel");
  View y = c.out(0, yz.dtype, g.out);
  auto store = [&](auto tag) {
    using Q = decltype(tag);
    const double z = yz.as<Q>()[0];
    for (size_t i = 0; i < acc.size(); ++i) {
      const int64_t m = static_cast<int64_t>(i) / on % M;
      const double k =
          double(xs.as<float>()[0]) * ws.as<float>()[ws.numel() == 1 ? 0 : m] / ys.as<float>()[0];
      const double sum = double(acc[i] + (bias.present() ? bias.as<int32_t>()[m] : 0));
      const double v = std::nearbyint(sum * k) + z;
      y.as<Q>()[i] = static_cast<Q>(std::clamp(v, double(std::numeric_limits<Q>::lowest()),
                                               double(std::numeric_limits<Q>::max())));
    }
  };
  if (yz.dtype == HP_U8)
    store(uint8_t{});
  else
    store(int8_t{});
}

bool q8(int32_t t) { return t == HP_U8 || t == HP_I8; }

}  // namespace

void register_qconv_ops(OpTable& t) {
  t["ConvInteger"] = {conv_integer, [](const std::vector<int32_t>& d) {
                        return d.size() >= 2 && q8(d[0]) && q8(d[1]);
                      }};
  t["QLinearConv"] = {qlinear_conv, [](const std::vector<int32_t>& d) {
                        return d.size() >= 8 && q8(d[0]) && q8(d[3]) && q8(d[7]) &&
                               (d.size() < 9 || d[8] == -1 || d[8] == HP_I32);
                      }};
}

}  // namespace hp_cpu
