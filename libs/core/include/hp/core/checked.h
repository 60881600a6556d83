// Overflow-checked integer arithmetic for element counts, byte sizes and their sums.
//
// Every size hp derives from a file (a tensor's dims, a recipe's dims, a bound --dim) is attacker-
// or typo-controlled: dims of 2^40 x 2^40 wrap an int64 product to 0, and 10^15 x 4 bytes x a few
// dims goes negative. So sizes are multiplied and added only through these helpers, which report
// overflow instead of wrapping, and are bounded by the documented limits below (docs/hardening.md,
// "Bad files"), refused with the offending name before anything is allocated or inferred.
#pragma once

#include <cstdint>
#include <optional>

namespace hp {

/// The largest dim hp accepts anywhere (a bound --dim, a recipe's dims, a model's declared or
/// inferred dim): 2^40, far above any real tensor axis yet small enough that a product of two
/// cannot overflow an int64.
inline constexpr std::int64_t kMaxDim = std::int64_t{1} << 40;
/// The largest element count of one tensor: 2^56, so that its size in bytes (at most 16 bytes an
/// element) still fits an int64 with room for sums.
inline constexpr std::int64_t kMaxElements = std::int64_t{1} << 56;

/// a * b, or nullopt when the product overflows an int64.
inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// a + b, or nullopt when the sum overflows an int64.
inline std::optional<std::int64_t> checked_add(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// a + b clamped to the int64 range (totals that are only printed: a sum of many bounded tensors).
inline std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return a > 0 ? INT64_MAX : INT64_MIN;
  return r;
}

/// The product of `dims` when every dim is in [0, kMaxDim] and the product is at most
/// kMaxElements; nullopt otherwise (a negative dim, a dim or a product beyond the limits).
template <class Range>
std::optional<std::int64_t> bounded_numel(const Range& dims) {
  std::int64_t n = 1;
  for (auto d : dims) {
    auto v = static_cast<std::int64_t>(d);
    if (v < 0 || v > kMaxDim) return std::nullopt;
    auto p = checked_mul(n, v);
    if (!p || *p > kMaxElements) return std::nullopt;
    n = *p;
  }
  return n;
}

}  // namespace hp
