// Random ops on the cpu backend: Bernoulli and RandomUniformLike (f32, f64 outputs; Bernoulli may
// also produce integers or bool), and the training mode of Dropout.
//
// Draws come from a 64-bit Mersenne Twister, seeded by the node's `seed` attribute when it has one
// (so a seeded node repeats its draws from run to run) and from std::random_device otherwise. The
// values cannot match another implementation's generator, so the ONNX tests of these ops can only
// check shapes, dtypes and the range of the values (onnx_backend_conformance_test.cpp).
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

std::mt19937_64 generator(const OpCall& c) {
  // A float attribute for the random ops, an int one for Dropout.
  if (c.has("seed"))
    return std::mt19937_64(static_cast<uint64_t>(c.f("seed", 0.0)) ^
                           static_cast<uint64_t>(c.i("seed", 0)));
  std::random_device rd;
  return std::mt19937_64((uint64_t{rd()} << 32) ^ rd());
}

int output_type(const OpCall& c, int dflt) {
  if (!c.has("dtype")) return dflt;
  switch (c.i("dtype", 1)) {
    case 1: return HP_F32;
    case 11: return HP_F64;
    case 2: return HP_U8;
    case 6: return HP_I32;
    case 7: return HP_I64;
    case 9: return HP_BOOL;
    default: throw OpError("dtype is not supported", HP_UNSUPPORTED);
  }
}

/// Bernoulli: 1 with probability x[i], else 0.
void bernoulli(OpCall& c) {
  const View& x = c.need(0);
  const int dt = output_type(c, x.dtype);
  View y = c.out(0, dt, x.dims);
  auto gen = generator(c);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  dispatch(x.dtype, [&](auto tin) {
    using I = decltype(tin);
    dispatch(dt, [&](auto tout) {
      using O = decltype(tout);
      for (int64_t i = 0, n = x.numel(); i < n; ++i)
        y.as<O>()[i] = u(gen) < double(x.as<I>()[i]) ? O(1) : O(0);
    });
  });
}

void random_uniform_like(OpCall& c) {
  const View& x = c.need(0);
  const int dt = output_type(c, x.dtype);
  if (dt != HP_F32 && dt != HP_F64) throw OpError("dtype must be float or double", HP_UNSUPPORTED);
  const double lo = c.f("low", 0.0), hi = c.f("high", 1.0);
  if (!(lo <= hi)) c.fail("low must not exceed high");
  View y = c.out(0, dt, x.dims);
  auto gen = generator(c);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    if (dt == HP_F32)
      y.as<float>()[i] = static_cast<float>(u(gen));
    else
      y.as<double>()[i] = u(gen);
  }
}

}  // namespace

void dropout_training(OpCall& c, double ratio) {
  const View& x = c.need(0);
  if (!(ratio >= 0 && ratio < 1)) c.fail("ratio must be in [0, 1)");
  View y = c.out(0, x.dtype, x.dims);
  uint8_t* mask = c.n_outputs() > 1 ? c.out(1, HP_BOOL, x.dims).as<uint8_t>() : nullptr;
  auto gen = generator(c);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double scale = 1.0 / (1.0 - ratio);
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      for (int64_t i = 0, n = x.numel(); i < n; ++i) {
        const bool keep = u(gen) >= ratio;
        y.as<T>()[i] = keep ? static_cast<T>(x.as<T>()[i] * scale) : T(0);
        if (mask) mask[i] = keep ? 1 : 0;
      }
    } else {
      throw OpError("dropout in training mode needs a float input", HP_UNSUPPORTED);
    }
  });
}

void register_random_ops(OpTable& t) {
  t["Bernoulli"] = {bernoulli, [](const std::vector<int32_t>& d) {
                      return d.size() == 1 && (d[0] == HP_F32 || d[0] == HP_F64);
                    }};
  t["RandomUniformLike"] = {random_uniform_like, [](const std::vector<int32_t>& d) {
                              return d.size() == 1 && d[0] >= 0;
                            }};
}

}  // namespace hp_cpu
