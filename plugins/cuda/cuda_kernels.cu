// Elementwise kernels of the cuda backend: one grid-stride kernel per op family, the op chosen by a
// template parameter so each instantiation is a straight-line loop. Binary ops broadcast y over the
// trailing dimension with i % y_len (y_len == n is the plain case). Memory-bound, so no cleverness
// beyond enough blocks to fill the GPU; vectorised float4 loads would be the next step if profiles
// ask.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_internal.h"

namespace hp_cuda {
namespace {

template <int Op>
__device__ float apply_binary(float a, float b) {
  if constexpr (Op == HP_OP_ADD) return a + b;
  if constexpr (Op == HP_OP_SUB) return a - b;
  if constexpr (Op == HP_OP_MUL) return a * b;
  if constexpr (Op == HP_OP_DIV) return a / b;
  if constexpr (Op == HP_OP_MAX) return fmaxf(a, b);
  if constexpr (Op == HP_OP_MIN) return fminf(a, b);
  return 0.0f;
}

template <int Op>
__device__ float apply_unary(float v, float scalar) {
  if constexpr (Op == HP_OP_RELU) return v > 0.0f ? v : 0.0f;
  if constexpr (Op == HP_OP_GELU) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  if constexpr (Op == HP_OP_SILU) return v / (1.0f + expf(-v));
  if constexpr (Op == HP_OP_SIGMOID) return 1.0f / (1.0f + expf(-v));
  if constexpr (Op == HP_OP_TANH) return tanhf(v);
  if constexpr (Op == HP_OP_EXP) return expf(v);
  if constexpr (Op == HP_OP_NEG) return -v;
  if constexpr (Op == HP_OP_SQRT) return sqrtf(v);
  if constexpr (Op == HP_OP_SCALE) return v * scalar;
  return 0.0f;
}

template <int Op>
__global__ void binary_kernel(const float* x, const float* y, float* out, int64_t n,
                              int64_t y_len) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = apply_binary<Op>(x[i], y[y_len == n ? i : i % y_len]);
}

template <int Op>
__global__ void unary_kernel(const float* x, float* out, int64_t n, float scalar) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = apply_unary<Op>(x[i], scalar);
}

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 ? b : 65535);
}

template <int Op>
void binary(const hp_elementwise_desc& d, cudaStream_t s) {
  binary_kernel<Op><<<blocks_for(d.n), kThreads, 0, s>>>(
      static_cast<const float*>(d.x), static_cast<const float*>(d.y), static_cast<float*>(d.out),
      d.n, d.y_len == 0 ? d.n : d.y_len);
}

template <int Op>
void unary(const hp_elementwise_desc& d, cudaStream_t s) {
  unary_kernel<Op><<<blocks_for(d.n), kThreads, 0, s>>>(
      static_cast<const float*>(d.x), static_cast<float*>(d.out), d.n, float(d.scalar));
}

}  // namespace

cudaError_t launch_elementwise(const hp_elementwise_desc& d, cudaStream_t s) {
  if (d.n == 0) return cudaSuccess;
  switch (d.op) {
    case HP_OP_ADD: binary<HP_OP_ADD>(d, s); break;
    case HP_OP_SUB: binary<HP_OP_SUB>(d, s); break;
    case HP_OP_MUL: binary<HP_OP_MUL>(d, s); break;
    case HP_OP_DIV: binary<HP_OP_DIV>(d, s); break;
    case HP_OP_MAX: binary<HP_OP_MAX>(d, s); break;
    case HP_OP_MIN: binary<HP_OP_MIN>(d, s); break;
    case HP_OP_RELU: unary<HP_OP_RELU>(d, s); break;
    case HP_OP_GELU: unary<HP_OP_GELU>(d, s); break;
    case HP_OP_SILU: unary<HP_OP_SILU>(d, s); break;
    case HP_OP_SIGMOID: unary<HP_OP_SIGMOID>(d, s); break;
    case HP_OP_TANH: unary<HP_OP_TANH>(d, s); break;
    case HP_OP_EXP: unary<HP_OP_EXP>(d, s); break;
    case HP_OP_NEG: unary<HP_OP_NEG>(d, s); break;
    case HP_OP_SQRT: unary<HP_OP_SQRT>(d, s); break;
    case HP_OP_SCALE: unary<HP_OP_SCALE>(d, s); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace hp_cuda
