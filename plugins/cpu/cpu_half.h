// The 16-bit floats (IEEE half and bfloat16) as bit patterns, converted to and from float. The cpu
// kernels store them but compute in f32: Cast and CastLike convert, and the ops that accept them
// widen their inputs first.
//
// float -> half rounds to nearest, ties to even (values from 65520 up become infinity; below the
// smallest normal, 2^-14, the result is subnormal). float -> bfloat16 keeps the top 16 bits of the
// float, also rounded to nearest even (NaN stays a quiet NaN): what PyTorch and later ONNX do.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace hp_cpu {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    const float f = std::ldexp(float(man), -24);  // zero or subnormal: man * 2^-24
    return sign ? -f : f;
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to infinity
  if (ax < 0x38800000u) {                                  // below 2^-14: subnormal
    float a;
    std::memcpy(&a, &ax, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));  // units of 2^-24
  }
  uint32_t h = ((((ax >> 23) - 112) << 10) | ((ax & 0x7fffffu) >> 13));
  const uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;
  return uint16_t(sign | h);
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace hp_cpu
