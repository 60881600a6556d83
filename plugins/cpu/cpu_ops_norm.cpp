// Normalisations of CNN exports on the cpu backend (f32, f64): InstanceNormalization, LRN (local
// response normalisation across channels, AlexNet/GoogLeNet) and MeanVarianceNormalization. Each
// reduces over a small set of elements per output, so they are direct loops with double
// accumulators.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

/// y = scale[c] * (x - mean) / sqrt(var + epsilon) + B[c], mean and variance over the spatial dims
/// of each (n, c).
void instance_norm(OpCall& c) {
  const View &x = c.need(0), &scale = c.need(1), &bias = c.need(2);
  if (x.dims.size() < 2) c.fail("input must have rank >= 2");
  const int64_t N = x.dims[0], C = x.dims[1], S = x.numel() / std::max<int64_t>(1, N * C);
  if (scale.numel() != C || bias.numel() != C) c.fail("scale and B must have C values");
  const double eps = c.f("epsilon", 1e-5);
  View y = c.out(0, x.dtype, x.dims);
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      for (int64_t nc = 0; nc < N * C; ++nc) {
        const T* px = x.as<T>() + nc * S;
        T* py = y.as<T>() + nc * S;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < S; ++i) mean += px[i];
        mean /= static_cast<double>(S);
        for (int64_t i = 0; i < S; ++i) var += (px[i] - mean) * (px[i] - mean);
        var /= static_cast<double>(S);
        const double k = scale.as<T>()[nc % C] / std::sqrt(var + eps), b = bias.as<T>()[nc % C];
        for (int64_t i = 0; i < S; ++i) py[i] = static_cast<T>((px[i] - mean) * k + b);
      }
    }
  });
}

/// y = x / (bias + alpha / size * sum of x^2 over the `size` channels around c)^beta; the window
/// runs from c - floor((size-1)/2) to c + ceil((size-1)/2).
void lrn(OpCall& c) {
  const View& x = c.need(0);
  if (x.dims.size() < 2) c.fail("input must have rank >= 2");
  const int64_t size = c.i("size", 0);
  if (size <= 0) c.fail("size must be positive");
  const double alpha = c.f("alpha", 1e-4), beta = c.f("beta", 0.75), bias = c.f("bias", 1.0);
  const int64_t N = x.dims[0], C = x.dims[1], S = x.numel() / std::max<int64_t>(1, N * C);
  const int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
  View y = c.out(0, x.dtype, x.dims);
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      const T* px = x.as<T>();
      for (int64_t n = 0; n < N; ++n)
        for (int64_t ch = 0; ch < C; ++ch)
          for (int64_t s = 0; s < S; ++s) {
            double sq = 0;
            for (int64_t k = std::max<int64_t>(0, ch - lo); k <= std::min(C - 1, ch + hi); ++k) {
              const double v = px[(n * C + k) * S + s];
              sq += v * v;
            }
            const int64_t i = (n * C + ch) * S + s;
            y.as<T>()[i] = static_cast<T>(px[i] / std::pow(bias + alpha / size * sq, beta));
          }
    }
  });
}

/// MeanVarianceNormalization: (x - mean) / (sqrt(E[x^2] - mean^2) + 1e-9) over `axes` (default
/// [0, 2, 3]), the ONNX function body's formula.
void mvn(OpCall& c) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  std::vector<int64_t> axes = c.has("axes") ? c.ints("axes") : std::vector<int64_t>{0, 2, 3};
  std::vector<bool> reduce(static_cast<size_t>(r), false);
  for (int64_t a : axes) reduce[c.axis(a, r)] = true;
  // Group elements by their index over the kept dims.
  const Dims st = strides_of(x.dims);
  const int64_t n = x.numel();
  auto group_of = [&](int64_t i) {
    int64_t g = 0;
    for (int64_t d = 0; d < r; ++d)
      if (!reduce[d]) g = g * x.dims[d] + i / st[d] % x.dims[d];
    return g;
  };
  int64_t groups = 1;
  for (int64_t d = 0; d < r; ++d)
    if (!reduce[d]) groups *= x.dims[d];
  View y = c.out(0, x.dtype, x.dims);
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      const T* px = x.as<T>();
      std::vector<double> s1(groups, 0), s2(groups, 0), cnt(groups, 0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t g = group_of(i);
        s1[g] += px[i];
        s2[g] += double(px[i]) * px[i];
        cnt[g] += 1;
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t g = group_of(i);
        const double mean = s1[g] / cnt[g], var = s2[g] / cnt[g] - mean * mean;
        y.as<T>()[i] = static_cast<T>((px[i] - mean) / (std::sqrt(std::max(var, 0.0)) + 1e-9));
      }
    }
  });
}

bool floats_first(const std::vector<int32_t>& d) {
  if (d.empty() || (d[0] != HP_F32 && d[0] != HP_F64)) return false;
  for (int32_t t : d)
    if (t != d[0] && t != -1) return false;
  return true;
}

}  // namespace

void register_norm_ops(OpTable& t) {
  t["InstanceNormalization"] = {instance_norm, floats_first};
  t["LRN"] = {lrn, floats_first};
  t["MeanVarianceNormalization"] = {mvn, floats_first};
}

}  // namespace hp_cpu
