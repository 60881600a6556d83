// Linear quantisation on the cpu backend: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
// MatMulInteger and QLinearMatMul, the ops of int8/uint8 exports (ONNX Runtime's quantiser).
//
// The mapping is q = saturate(round(x / scale) + zero_point) and x = (q - zero_point) * scale:
// x / scale is a float division rounded, halves to even (std::nearbyint in the default rounding
// mode), before the zero point is added, as in the ONNX reference (rounding after the addition, or
// dividing in double, moves some halves), then saturated to the range of the 8-bit type. Scale and
// zero point are scalars or, along `axis`, one per slice. The integer matmuls accumulate (a -
// a_zero) * (b - b_zero) exactly in int32.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

/// Per-element index into a scale/zero-point tensor: 0 for a scalar, else the index along `axis`.
struct PerAxis {
  int64_t axis_stride = 0, axis_len = 1;  ///< stride of the axis in x; 1 for a scalar
  int64_t at(int64_t i) const { return axis_len == 1 ? 0 : i / axis_stride % axis_len; }
};

PerAxis per_axis(const OpCall& c, const View& x, const View& scale) {
  PerAxis p;
  if (scale.numel() <= 1) return p;
  const int64_t r = static_cast<int64_t>(x.dims.size());
  const int64_t ax = c.axis(c.i("axis", 1), r);
  if (scale.dims.size() != 1 || scale.dims[0] != x.dims[ax])
    c.fail("scale " + dims_str(scale.dims) + " must be a scalar or have x's dim " +
           std::to_string(ax));
  p.axis_stride = strides_of(x.dims)[ax];
  p.axis_len = x.dims[ax];
  return p;
}

template <class Q>
Q saturate(double v) {
  v = std::nearbyint(v);
  return static_cast<Q>(std::clamp(v, double(std::numeric_limits<Q>::lowest()),
                                   double(std::numeric_limits<Q>::max())));
}

/// Calls f(Q{}) for the 8-bit quantised types.
template <class F>
void dispatch_q(int dtype, F&& f) {
  if (dtype == HP_U8)
    f(uint8_t{});
  else if (dtype == HP_I8)
    f(int8_t{});
  else
    throw OpError("quantised type must be uint8 or int8", HP_UNSUPPORTED);
}

void quantize(OpCall& c) {
  const View &x = c.need(0), &scale = c.need(1), &zp = c.in(2);
  const int qt = zp.present() ? zp.dtype : HP_U8;
  const PerAxis pa = per_axis(c, x, scale);
  if (zp.present() && zp.numel() != scale.numel())
    c.fail("the zero point must have as many values as the scale");
  View y = c.out(0, qt, x.dims);
  dispatch_q(qt, [&](auto tag) {
    using Q = decltype(tag);
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      const int64_t k = pa.at(i);
      const double z = zp.present() ? zp.as<Q>()[k] : 0;
      y.as<Q>()[i] = saturate<Q>(std::nearbyint(x.as<float>()[i] / scale.as<float>()[k]) + z);
    }
  });
}

void dequantize(OpCall& c) {
  const View &x = c.need(0), &scale = c.need(1), &zp = c.in(2);
  const PerAxis pa = per_axis(c, x, scale);
  if (zp.present() && (zp.numel() != scale.numel() || zp.dtype != x.dtype))
    c.fail("the zero point must have the input's type and as many values as the scale");
  View y = c.out(0, HP_F32, x.dims);
  dispatch(x.dtype, [&](auto tag) {
    using Q = decltype(tag);
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      const int64_t k = pa.at(i);
      const double z = zp.present() ? double(zp.as<Q>()[k]) : 0.0;
      y.as<float>()[i] = static_cast<float>((double(x.as<Q>()[i]) - z) * scale.as<float>()[k]);
    }
  });
}

/// uint8 quantisation of x over [min(0, x), max(0, x)], returning its scale and zero point too.
void dynamic_quantize(OpCall& c) {
  const View& x = c.need(0);
  const float* px = x.as<float>();
  const int64_t n = x.numel();
  float lo = 0, hi = 0;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, px[i]);
    hi = std::max(hi, px[i]);
  }
  const float scale = (hi - lo) / 255.f;
  const uint8_t zp = scale == 0 ? 0 : saturate<uint8_t>((0.f - lo) / scale);
  View y = c.out(0, HP_U8, x.dims);
  for (int64_t i = 0; i < n; ++i)
    y.as<uint8_t>()[i] = scale == 0 ? zp : saturate<uint8_t>(std::nearbyint(px[i] / scale) + zp);
  c.out(1, HP_F32, {}).as<float>()[0] = scale;
  c.out(2, HP_U8, {}).as<uint8_t>()[0] = zp;
}

/// The int32 product (a - a_zero) @ (b - b_zero) with numpy batch broadcasting; a_zero may hold one
/// value per row of A, b_zero one per column of B.
std::vector<int32_t> int_matmul(const OpCall& c, const View& a, const View& b, const View& azp,
                                const View& bzp, Dims& out) {
  if (a.dims.size() < 2 || b.dims.size() < 2) c.fail("operands must have rank >= 2");
  const int64_t m = a.dims[a.dims.size() - 2], k = a.dims.back(), n = b.dims.back();
  if (b.dims[b.dims.size() - 2] != k) c.fail("inner dims differ");
  Dims ab(a.dims.begin(), a.dims.end() - 2), bb(b.dims.begin(), b.dims.end() - 2);
  const Dims batch = broadcast_shapes(ab, bb, c);
  const Dims sa = broadcast_strides(ab, batch), sb = broadcast_strides(bb, batch);
  out = batch;
  out.push_back(m);
  out.push_back(n);
  const int64_t nb = numel(batch);
  std::vector<int32_t> y(static_cast<size_t>(nb * m * n));
  const std::vector<int64_t> av = a.ints(), bv = b.ints();
  const std::vector<int64_t> az = azp.present() ? azp.ints() : std::vector<int64_t>{0};
  const std::vector<int64_t> bz = bzp.present() ? bzp.ints() : std::vector<int64_t>{0};
  if ((az.size() != 1 && static_cast<int64_t>(az.size()) != m) ||
      (bz.size() != 1 && static_cast<int64_t>(bz.size()) != n))
    c.fail("a zero point holds one value, or one per row of A (column of B)");
  for (int64_t q = 0; q < nb; ++q) {
    int64_t oa = 0, ob = 0, rest = q;
    for (size_t d = batch.size(); d-- > 0;) {
      oa += rest % batch[d] * sa[d];
      ob += rest % batch[d] * sb[d];
      rest /= batch[d];
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        int64_t acc = 0;
        const int64_t za = az[az.size() == 1 ? 0 : i], zb = bz[bz.size() == 1 ? 0 : j];
        for (int64_t p = 0; p < k; ++p)
          acc += (av[(oa * m + i) * k + p] - za) * (bv[(ob * k + p) * n + j] - zb);
        y[(q * m + i) * n + j] = static_cast<int32_t>(acc);
      }
  }
  return y;
}

void matmul_integer(OpCall& c) {
  Dims out;
  const std::vector<int32_t> y = int_matmul(c, c.need(0), c.need(1), c.in(2), c.in(3), out);
  View v = c.out(0, HP_I32, out);
  std::copy(y.begin(), y.end(), v.as<int32_t>());
}

/// QLinearMatMul: the integer product requantised to y's scale and zero point.
void qlinear_matmul(OpCall& c) {
  const View &a = c.need(0), &as = c.need(1), &b = c.need(3), &bs = c.need(4), &ys = c.need(6),
             &yz = c.need(7);
  if (as.numel() != 1 || bs.numel() != 1 || ys.numel() != 1)
    throw OpError("per-axis scales are not supported in QLinearMatMul", HP_UNSUPPORTED);
  Dims out;
  const std::vector<int32_t> acc = int_matmul(c, a, b, c.need(2), c.need(5), out);
  const double k = double(as.as<float>()[0]) * bs.as<float>()[0] / ys.as<float>()[0];
  View y = c.out(0, yz.dtype, out);
  dispatch_q(yz.dtype, [&](auto tag) {
    using Q = decltype(tag);
    const double z = yz.as<Q>()[0];
    for (size_t i = 0; i < acc.size(); ++i) y.as<Q>()[i] = saturate<Q>(acc[i] * k + z);
  });
}

bool q8(int32_t t) { return t == HP_U8 || t == HP_I8; }

}  // namespace

void register_quant_ops(OpTable& t) {
  t["QuantizeLinear"] = {quantize, [](const std::vector<int32_t>& d) {
                           return d.size() >= 2 && d[0] == HP_F32 && d[1] == HP_F32 &&
                                  (d.size() < 3 || d[2] == -1 || q8(d[2]));
                         }};
  t["DequantizeLinear"] = {dequantize, [](const std::vector<int32_t>& d) {
                             return d.size() >= 2 && (q8(d[0]) || d[0] == HP_I32) &&
                                    d[1] == HP_F32 && (d.size() < 3 || d[2] == -1 || d[2] == d[0]);
                           }};
  t["DynamicQuantizeLinear"] = {dynamic_quantize, all_f32};
  t["MatMulInteger"] = {matmul_integer, [](const std::vector<int32_t>& d) {
                          return d.size() >= 2 && q8(d[0]) && q8(d[1]);
                        }};
  t["QLinearMatMul"] = {qlinear_matmul, [](const std::vector<int32_t>& d) {
                          return d.size() == 8 && q8(d[0]) && q8(d[3]) && q8(d[7]);
                        }};
}

}  // namespace hp_cpu
