// Window functions of the ONNX signal ops on the cpu backend: HannWindow, HammingWindow and
// BlackmanWindow (what STFT front ends multiply frames by).
//
// Each is a cosine sum w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N) for n in [0, size), with
// N = size for a periodic window (the default, for spectral analysis) and size - 1 for a symmetric
// one (filter design). Hamming's coefficients are ONNX's 25/46 and 21/46.
#include <cmath>
#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

int onnx_float_type(const OpCall& c) {
  switch (c.i("output_datatype", 1)) {
    case 1: return HP_F32;
    case 11: return HP_F64;
    default: throw OpError("output_datatype must be float or double", HP_UNSUPPORTED);
  }
}

void window(OpCall& c, double a0, double a1, double a2) {
  const View& s = c.need(0);
  if (s.numel() != 1) c.fail("size must be a scalar");
  const int64_t size = s.ints()[0];
  if (size < 0) c.fail("size must not be negative");
  const double N = c.i("periodic", 1) ? double(size) : double(size - 1);
  const int dt = onnx_float_type(c);
  View y = c.out(0, dt, {size});
  for (int64_t n = 0; n < size; ++n) {
    const double x = N > 0 ? 2 * M_PI * double(n) / N : 0.0;
    const double v = a0 - a1 * std::cos(x) + a2 * std::cos(2 * x);
    if (dt == HP_F32)
      y.as<float>()[n] = static_cast<float>(v);
    else
      y.as<double>()[n] = v;
  }
}

bool int_scalar(const std::vector<int32_t>& d) {
  return d.size() == 1 && (d[0] == HP_I32 || d[0] == HP_I64);
}

}  // namespace

void register_signal_ops(OpTable& t) {
  t["HannWindow"] = {[](OpCall& c) { window(c, 0.5, 0.5, 0); }, int_scalar};
  t["HammingWindow"] = {[](OpCall& c) { window(c, 25.0 / 46, 21.0 / 46, 0); }, int_scalar};
  t["BlackmanWindow"] = {[](OpCall& c) { window(c, 0.42, 0.5, 0.08); }, int_scalar};
}

}  // namespace hp_cpu
