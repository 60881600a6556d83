// The two products of hp.nn.Attention (cpu_ops_attention.cpp) on packed, zero-padded operands:
// four rows at a time against up to 64 columns, so the 4 x 64 accumulators of a tile stay in
// registers (16 AVX-512 registers; GCC splits the 64-byte vectors into two AVX2 or four SSE ones on
// the other clones). Built with -O3 -ffp-contract=fast (CMakeLists.txt): the multiply-adds become
// FMAs, as in oneDNN's matmul that the unfused graph runs.
#include <cstdint>

#include "cpu_kernels.h"

namespace hp_cpu {

namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));  // unaligned loads and stores

// c[r][16 NV] = sum_{k < n} a[r][k] b[k][16 NV] for the 4 rows of a.
template <int NV>
__attribute__((always_inline)) inline void rows4_tile(const float* a, int64_t lda, const float* b,
                                                      int64_t ldb, int64_t n, float* c,
                                                      int64_t ldc) {
  v16 acc[4][NV] = {};
  for (int64_t k = 0; k < n; ++k) {
    v16 x[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) x[v] = *reinterpret_cast<const v16u*>(b + k * ldb + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const float s = a[r * lda + k];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += s * x[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) *reinterpret_cast<v16u*>(c + r * ldc + 16 * v) = acc[r][v];
}

}  // namespace

HP_CPU_CLONES void rows4_product(const float* a, int64_t lda, const float* b, int64_t ldb,
                                 int64_t n, float* c, int64_t ldc, int64_t cols) {
  int64_t j = 0;
  for (; j + 64 <= cols; j += 64) rows4_tile<4>(a, lda, b + j, ldb, n, c + j, ldc);
  switch ((cols - j) / 16) {
    case 3: rows4_tile<3>(a, lda, b + j, ldb, n, c + j, ldc); break;
    case 2: rows4_tile<2>(a, lda, b + j, ldb, n, c + j, ldc); break;
    case 1: rows4_tile<1>(a, lda, b + j, ldb, n, c + j, ldc); break;
    default: break;
  }
}

}  // namespace hp_cpu
