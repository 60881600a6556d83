// compare_tensors: elementwise comparison with NaN/Inf handled as PyTorch's allclose does, and
// exact comparison for integer and bool tensors.
#include "hp/exec/compare.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "hp/plugin/hp_plugin.h"

namespace hp::exec {
namespace {

// The 16-bit floats are compared as the values they encode (IEEE half: 1 sign, 5 exponent and 10
// mantissa bits; bfloat16: the top half of a float's bits).
double half_bits_to_double(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0x1f) return man ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(man, -24);
  return sign * std::ldexp(1024 + man, exp - 25);
}

double bf16_bits_to_double(std::uint16_t b) {
  const std::uint32_t bits = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

double element_value(const HostTensor& t, std::int64_t i) {
  switch (t.dtype) {
    case HP_F32: return t.as<float>()[i];
    case HP_F64: return t.as<double>()[i];
    case HP_F16: return half_bits_to_double(t.as<std::uint16_t>()[i]);
    case HP_BF16: return bf16_bits_to_double(t.as<std::uint16_t>()[i]);
    case HP_I8: return t.as<std::int8_t>()[i];
    case HP_I16: return t.as<std::int16_t>()[i];
    case HP_I32: return t.as<std::int32_t>()[i];
    case HP_I64: return static_cast<double>(t.as<std::int64_t>()[i]);
    case HP_U16: return t.as<std::uint16_t>()[i];
    case HP_U32: return t.as<std::uint32_t>()[i];
    case HP_U64: return static_cast<double>(t.as<std::uint64_t>()[i]);
    default: return t.as<std::uint8_t>()[i];
  }
}

TensorSummary summarize_tensor(const HostTensor& t, int first) {
  TensorSummary s;
  s.name = t.name;
  s.dtype = dtype_label(t.dtype);
  s.dims = t.dims;
  // A tensor whose bytes do not cover its dims (a malformed file) is summarised by its header only.
  const std::int64_t n = t.numel();
  if (n <= 0 || dtype_size(t.dtype) <= 0 ||
      static_cast<std::int64_t>(t.data.size()) < n * dtype_size(t.dtype))
    return s;
  double sum = 0;
  s.min = INFINITY;
  s.max = -INFINITY;
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = element_value(t, i);
    if (i < first) s.first.push_back(v);
    if (std::isnan(v)) {
      ++s.nans;
      continue;
    }
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
    sum += v;
  }
  s.counted = n - s.nans;
  s.mean = s.counted > 0 ? sum / static_cast<double>(s.counted) : NAN;
  return s;
}

std::string format_summary(const TensorSummary& s) {
  std::string line =
      fmt::format("{} {} {}", s.name.empty() ? "(unnamed)" : s.name, s.dtype, dims_label(s.dims));
  if (s.counted > 0)
    line += fmt::format(": min {:.6g} max {:.6g} mean {:.6g}", s.min, s.max, s.mean);
  if (s.nans > 0) line += fmt::format(", {} NaN", s.nans);
  if (!s.first.empty()) {
    line += " [";
    for (std::size_t i = 0; i < s.first.size(); ++i)
      line += fmt::format("{}{:.6g}", i ? ", " : "", s.first[i]);
    line += s.counted + s.nans > static_cast<std::int64_t>(s.first.size()) ? ", ...]" : "]";
  }
  return line;
}

OutputCheck compare_tensors(const HostTensor& got, const HostTensor& want, double rtol,
                            double atol) {
  OutputCheck c;
  c.name = want.name.empty() ? got.name : want.name;
  if (got.dtype != want.dtype) {
    c.problem =
        fmt::format("dtype {} but expected {}", dtype_label(got.dtype), dtype_label(want.dtype));
    return c;
  }
  if (got.dims != want.dims) {
    c.problem =
        fmt::format("shape {} but expected {}", dims_label(got.dims), dims_label(want.dims));
    return c;
  }
  const std::int64_t n = want.numel();
  auto value = element_value;
  const bool exact =
      got.dtype != HP_F32 && got.dtype != HP_F64 && got.dtype != HP_F16 && got.dtype != HP_BF16;
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = value(got, i), w = value(want, i);
    if (std::isnan(g) && std::isnan(w)) continue;
    if (std::isinf(w) && g == w) continue;
    const double d = std::fabs(g - w);
    if (std::isnan(d)) {
      ++c.bad;
      c.max_abs = INFINITY;
      continue;
    }
    c.max_abs = std::max(c.max_abs, d);
    if (w != 0) c.max_rel = std::max(c.max_rel, d / std::fabs(w));
    if (exact ? d != 0 : d > atol + rtol * std::fabs(w)) ++c.bad;
  }
  return c;
}

std::string format_check(const OutputCheck& c) {
  if (!c.problem.empty()) return fmt::format("{}: MISMATCH: {}", c.name, c.problem);
  return fmt::format("{}: max abs error {:.3g}, max rel error {:.3g}: {}", c.name, c.max_abs,
                     c.max_rel,
                     c.ok() ? "ok" : fmt::format("MISMATCH ({} elements out of tolerance)", c.bad));
}

bool all_ok(const std::vector<OutputCheck>& checks) {
  for (const auto& c : checks)
    if (!c.ok()) return false;
  return true;
}

}  // namespace hp::exec
