// Elementwise ops on the cpu backend. Each op is one loop over contiguous floats with no aliasing
// assumptions broken (out may equal x), which GCC vectorises at -O2/-O3 for the arithmetic ops; the
// transcendental ones (exp, tanh, erf) call libm per element. Large arrays are split across threads
// with OpenMP when it is available: below ~64 Ki elements the fork/join costs more than it saves.
// Binary ops broadcast y over the trailing dimension when y_len < n (bias adds): the loop then runs
// row by row so the inner loop stays contiguous and vectorisable.
#include <algorithm>
#include <cmath>

#include "cpu_internal.h"

namespace hp_cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 16;

template <class F>
void unary_loop(const float* x, float* out, int64_t n, F f) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = f(x[i]);
}

template <class F>
void binary_loop(const float* x, const float* y, float* out, int64_t n, int64_t y_len, F f) {
  if (y_len == n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = f(x[i], y[i]);
    return;
  }
  int64_t rows = n / y_len;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * y_len;
    float* outr = out + r * y_len;
    for (int64_t j = 0; j < y_len; ++j) outr[j] = f(xr[j], y[j]);
  }
}

float gelu(float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); }
float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

hp_status* elementwise(hp_ctx* ctx, hp_stream* s, const hp_elementwise_desc* in) {
  if (!ctx || !s || !in)
    return hp_common::make_status(HP_INVALID, "cpu: elementwise: null argument");
  hp_elementwise_desc d = hp_common::copy_in(in);
  if (hp_status* st = hp_common::check_elementwise(kCpu, d)) return st;
  if (d.n == 0) return nullptr;
  const float* x = static_cast<const float*>(d.x);
  const float* y = static_cast<const float*>(d.y);
  float* out = static_cast<float*>(d.out);
  int64_t y_len = d.y_len == 0 ? d.n : d.y_len;
  const float scalar = float(d.scalar);
  switch (d.op) {
    case HP_OP_ADD:
      binary_loop(x, y, out, d.n, y_len, [](float a, float b) { return a + b; });
      break;
    case HP_OP_SUB:
      binary_loop(x, y, out, d.n, y_len, [](float a, float b) { return a - b; });
      break;
    case HP_OP_MUL:
      binary_loop(x, y, out, d.n, y_len, [](float a, float b) { return a * b; });
      break;
    case HP_OP_DIV:
      binary_loop(x, y, out, d.n, y_len, [](float a, float b) { return a / b; });
      break;
    case HP_OP_MAX:
      binary_loop(x, y, out, d.n, y_len, [](float a, float b) { return a > b ? a : b; });
      break;
    case HP_OP_MIN:
      binary_loop(x, y, out, d.n, y_len, [](float a, float b) { return a < b ? a : b; });
      break;
    case HP_OP_RELU: unary_loop(x, out, d.n, [](float v) { return v > 0.0f ? v : 0.0f; }); break;
    case HP_OP_GELU: unary_loop(x, out, d.n, gelu); break;
    case HP_OP_SILU: unary_loop(x, out, d.n, [](float v) { return v * sigmoid(v); }); break;
    case HP_OP_SIGMOID: unary_loop(x, out, d.n, sigmoid); break;
    case HP_OP_TANH: unary_loop(x, out, d.n, [](float v) { return std::tanh(v); }); break;
    case HP_OP_EXP: unary_loop(x, out, d.n, [](float v) { return std::exp(v); }); break;
    case HP_OP_NEG: unary_loop(x, out, d.n, [](float v) { return -v; }); break;
    case HP_OP_SQRT: unary_loop(x, out, d.n, [](float v) { return std::sqrt(v); }); break;
    case HP_OP_SCALE: unary_loop(x, out, d.n, [scalar](float v) { return v * scalar; }); break;
    default: return hp_common::make_status(HP_UNSUPPORTED, "cpu: elementwise: unknown op %d", d.op);
  }
  return nullptr;
}

}  // namespace hp_cpu
