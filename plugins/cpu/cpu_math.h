// Single-precision exp and erf written so that GCC vectorises loops calling them (no calls into
// libm, no data-dependent branches: both sides of every case are computed and one is selected).
// libm's expf and erf are scalar calls, which made Softmax and the exact GELU (x * (1 + erf(x /
// sqrt 2)) / 2, what PyTorch exports) the slowest float ops of a transformer after the GEMMs.
//
// exp_f: x = k ln2 + r with |r| <= ln2 / 2 (ln2 split in a high and low part so k ln2 is exact),
// then e^r by its Taylor series to r^7 (truncation error < 3e-9 relative) and 2^k put into the
// exponent bits. Results below FLT_MIN flush to 0, above FLT_MAX become +inf; NaN stays NaN.
//
// erf_f: |x| <= 1: the Maclaurin series (2 / sqrt pi) x sum (-1)^n x^2n / (n! (2n + 1)) to n = 12
// (error < 1e-10); |x| > 1: 1 - erfc(|x|) with the Chebyshev-fitted erfc(z) = t exp(-z^2 + P(t)), t
// = 1 / (1 + z / 2), whose relative error is below 1.2e-7 (Press et al., Numerical Recipes, erfcc),
// so the absolute error of erf there is below 2e-8. Both stay within float rounding of the
// double-precision std::erf.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace hp_cpu {

inline float exp_f(float x) {
  const float hi = 88.37626f, lo = -87.33654f;  // ln(FLT_MAX), ln(FLT_MIN)
  const float xc = x > hi ? hi : (x < lo ? lo : x);
  // Round to nearest by adding and subtracting 1.5 * 2^23 (no libm call, vectorises on plain SSE2).
  const float k = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r =
      (xc - k * 0.693359375f) + k * 2.12194440e-4f;  // ln2 = 0.693359375 - 2.12194440e-4
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const std::int32_t bits = (static_cast<std::int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float y = p * scale;
  y = x > hi ? INFINITY : y;
  y = x < lo ? 0.f : y;
  return x != x ? x : y;
}

/// erfc(|x|) for any x by the Chebyshev fit alone (see the file comment): relative error < 1.2e-7.
inline float erfc_abs_f(float x) {
  const float a = std::fabs(x);
  const float t = 1.f / (1.f + 0.5f * a);
  float q = 0.17087277f;
  q = q * t - 0.82215223f;
  q = q * t + 1.48851587f;
  q = q * t - 1.13520398f;
  q = q * t + 0.27886807f;
  q = q * t - 0.18628806f;
  q = q * t + 0.09678418f;
  q = q * t + 0.37409196f;
  q = q * t + 1.00002368f;
  q = q * t - 1.26551223f;
  return t * exp_f(-a * a + q);
}

/// The exact GELU, x (1 + erf(x / sqrt 2)) / 2, with erf = sign(x) (1 - erfc(|x|)) throughout: one
/// branch-free formula, absolute error of erf below 1.2e-7 (so of GELU below 6e-8 |x|); erf_f's
/// series for small |x| buys relative accuracy GELU does not need.
inline float gelu_f(float x) {
  const float e = 1.f - erfc_abs_f(x * 0.70710678118654752f);
  return 0.5f * x * (1.f + std::copysign(e, x));
}

inline float erf_f(float x) {
  const float a = std::fabs(x);
  // |x| <= 1: odd series in x^2 (coefficients (-1)^n 2 / (sqrt(pi) n! (2n + 1))).
  const float z2 = x * x;
  float s = 9.42275906e-11f;
  s = s * z2 - 1.22905553e-09f;
  s = s * z2 + 1.48071928e-08f;
  s = s * z2 - 1.63658447e-07f;
  s = s * z2 + 1.64621144e-06f;
  s = s * z2 - 1.49256504e-05f;
  s = s * z2 + 1.20553330e-04f;
  s = s * z2 - 8.54832702e-04f;
  s = s * z2 + 5.22397763e-03f;
  s = s * z2 - 2.68661706e-02f;
  s = s * z2 + 1.12837917e-01f;
  s = s * z2 - 3.76126389e-01f;
  s = s * z2 + 1.12837917f;
  const float small = x * s;
  // |x| > 1: 1 - erfc(|x|), with the sign of x.
  const float big = 1.f - erfc_abs_f(x);
  const float r = a <= 1.f ? small : std::copysign(big, x);
  return x != x ? x : r;
}

}  // namespace hp_cpu
