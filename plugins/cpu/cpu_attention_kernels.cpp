// The two products of hp.nn.Attention (cpu_ops_attention.cpp) on packed, zero-padded operands:
// four query rows at a time against up to 64 columns, so the 4 x 64 accumulators of a tile stay in
// registers (16 AVX-512 registers; GCC splits the 64-byte vectors into two AVX2 or four SSE ones on
// the other clones). Built with -O3 -ffp-contract=fast (CMakeLists.txt): the multiply-adds become
// FMAs, as in oneDNN's matmul that the unfused graph runs.
#include <cstdint>

#include "cpu_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define HP_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HP_CPU_CLONES
#endif

namespace hp_cpu {

namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));  // unaligned loads and stores

#define HP_INLINE __attribute__((always_inline)) inline

// s[r][16 NV] = sum_k q[r][k] kt[k][16 NV] for the 4 rows of q (row stride qs).
template <int NV>
HP_INLINE void scores_tile(const float* q, int64_t qs, const float* kt, int64_t ldk, int64_t d,
                           float* s, int64_t lds) {
  v16 acc[4][NV] = {};
  for (int64_t k = 0; k < d; ++k) {
    v16 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = *reinterpret_cast<const v16u*>(kt + k * ldk + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const float a = q[r * qs + k];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) *reinterpret_cast<v16u*>(s + r * lds + 16 * v) = acc[r][v];
}

// o[r][16 NV] = sum_{j < n} p[r][j] v[j][16 NV] for the 4 rows of p.
template <int NV>
HP_INLINE void values_tile(const float* p, int64_t lds, const float* v, int64_t ldv, int64_t n,
                           float* o, int64_t ldo) {
  v16 acc[4][NV] = {};
  for (int64_t j = 0; j < n; ++j) {
    v16 b[NV];
#pragma GCC unroll 4
    for (int w = 0; w < NV; ++w) b[w] = *reinterpret_cast<const v16u*>(v + j * ldv + 16 * w);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const float a = p[r * lds + j];
#pragma GCC unroll 4
      for (int w = 0; w < NV; ++w) acc[r][w] += a * b[w];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
    for (int w = 0; w < NV; ++w) *reinterpret_cast<v16u*>(o + r * ldo + 16 * w) = acc[r][w];
}

}  // namespace

HP_CPU_CLONES void attention_scores(const float* q, int64_t qs, const float* kt, int64_t ldk,
                                    int64_t d, float* s, int64_t lds, int64_t cols) {
  int64_t j = 0;
  for (; j + 64 <= cols; j += 64) scores_tile<4>(q, qs, kt + j, ldk, d, s + j, lds);
  switch ((cols - j) / 16) {
    case 3: scores_tile<3>(q, qs, kt + j, ldk, d, s + j, lds); break;
    case 2: scores_tile<2>(q, qs, kt + j, ldk, d, s + j, lds); break;
    case 1: scores_tile<1>(q, qs, kt + j, ldk, d, s + j, lds); break;
    default: break;
  }
}

HP_CPU_CLONES void attention_values(const float* p, int64_t lds, const float* v, int64_t ldv,
                                    int64_t n, float* o, int64_t ldo, int64_t cols) {
  int64_t c = 0;
  for (; c + 64 <= cols; c += 64) values_tile<4>(p, lds, v + c, ldv, n, o + c, ldo);
  switch ((cols - c) / 16) {
    case 3: values_tile<3>(p, lds, v + c, ldv, n, o + c, ldo); break;
    case 2: values_tile<2>(p, lds, v + c, ldv, n, o + c, ldo); break;
    case 1: values_tile<1>(p, lds, v + c, ldv, n, o + c, ldo); break;
    default: break;
  }
}

}  // namespace hp_cpu
