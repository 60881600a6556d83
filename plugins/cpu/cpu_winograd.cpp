// Winograd F(2x2, 3x3) for float32 3x3 convolutions (stride 1, no dilation, one group), on CPUs
// with AVX-512.
//
// Why our own: oneDNN 2.6 (Debian 12) offers Winograd only as its F(4x4, 3x3) kernels, for
// avx512_core with channel counts and batch sizes these models do not meet, and F(4x4, 3x3)
// rounds too coarsely for the 1e-5 our outputs are held to. F(2x2, 3x3) multiplies 16 times per
// 2x2 output tile and channel pair where the direct convolution multiplies 36 times, and its
// transforms use only 1, -1 and 1/2, so its results stay within a few ulps of a direct sum.
//
// One convolution, with U = G g G^T the 4x4 transform of each 3x3 filter (kept for a constant
// weight the executor names, hp_weight_b as for the packed GEMM weights; else computed per call):
//   for each block of output tiles (2x2 outputs each) on one thread:
//     V[p][t][c]   = (B^T d B)[p] of tile t's 4x4 input patch, channel c   (p = one of 16 points)
//     Mt[p][t][m]  = sum_c V[p][t][c] U[p][c][m]                           (16 small GEMMs)
//     y(2x2)[t][m] = A^T Mt[.][t][m] A, + bias, + the residual z, Relu
// The block's V and Mt stay in the core's caches; activations are channels-last (N x H x W x C)
// so that 16 channels are one vector in every transform, and operands stored channels-first go
// through a channels-last copy. The GEMM is a register-blocked AVX-512 kernel (rows x 16*NV
// columns of accumulators).
#include "cpu_winograd.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "cpu_scratch.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HP_WINO 1
#define HP_AVX512 __attribute__((target("avx512f,fma")))
#endif

namespace hp_cpu {

#ifdef HP_WINO
namespace {

/// `count` floats of a thread's scratch buffer: try_f (null on failure, inside OpenMP regions) or
/// need (std::bad_alloc).
float* try_f(ScratchBuffer& b, size_t count) {
  return static_cast<float*>(b.try_get(count * sizeof(float)));
}
float* need(ScratchBuffer& b, size_t count) {
  return static_cast<float*>(b.get(count * sizeof(float)));
}

/// N x C x H x W <-> N x H x W x C (threads split images and channels, so batch 1 splits too).
void to_channels_last(const float* from, float* to, int64_t N, int64_t C, int64_t HW) {
#pragma omp parallel for collapse(2) schedule(static) if (N * C * HW >= (1 << 16))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t p = 0; p < HW; ++p) to[(n * HW + p) * C + ch] = from[(n * C + ch) * HW + p];
}
void to_channels_first(const float* from, float* to, int64_t N, int64_t C, int64_t HW) {
#pragma omp parallel for collapse(2) schedule(static) if (N * C * HW >= (1 << 16))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t p = 0; p < HW; ++p) to[(n * C + ch) * HW + p] = from[(n * HW + p) * C + ch];
}

/// U[p][c][m] = (G g G^T)[p] for g = w[m][c] (3x3), G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1].
/// Input channels outer and output channels inner, so each of the 16 planes is written in order
/// (the other way round every store lands on another cache line: 10 ms for 256 x 256 filters).
void transform_weights(const float* w, float* u, int64_t M, int64_t C) {
#pragma omp parallel for schedule(static) if (M * C >= 4096)
  for (int64_t c = 0; c < C; ++c)
    for (int64_t m = 0; m < M; ++m) {
      const float* g = w + (m * C + c) * 9;
      float t[4][3];  // G g
      for (int j = 0; j < 3; ++j) {
        t[0][j] = g[j];
        t[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
        t[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
        t[3][j] = g[6 + j];
      }
      for (int i = 0; i < 4; ++i) {
        const float r[4] = {t[i][0], 0.5f * (t[i][0] + t[i][1] + t[i][2]),
                            0.5f * (t[i][0] - t[i][1] + t[i][2]), t[i][2]};
        for (int j = 0; j < 4; ++j) u[((i * 4 + j) * C + c) * M + m] = r[j];
      }
    }
}

struct Geometry {
  int64_t N, C, H, W, M, OH, OW, pt, pl, th, tw;  // th x tw tiles per image
};

/// V[p][row][c] of `rows` consecutive tiles from `t0` (tiles past the last are zeros).
HP_AVX512 void input_transform(const Geometry& g, const float* x, int64_t t0, int64_t rows,
                               int64_t tb, float* v) {
  const int64_t tiles = g.N * g.th * g.tw, C = g.C, plane = tb * C;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = t0 + r;
    if (t >= tiles) {
      for (int p = 0; p < 16; ++p) std::memset(v + p * plane + r * C, 0, C * sizeof(float));
      continue;
    }
    const int64_t n = t / (g.th * g.tw), rest = t % (g.th * g.tw);
    const int64_t iy0 = (rest / g.tw) * 2 - g.pt, ix0 = (rest % g.tw) * 2 - g.pl;
    // Element offsets of the patch's rows; a row or column outside the image is padding, read as
    // zero (its offset is never turned into a pointer).
    int64_t row[4];
    bool in_y[4], in_x[4];
    for (int i = 0; i < 4; ++i) {
      in_y[i] = iy0 + i >= 0 && iy0 + i < g.H;
      in_x[i] = ix0 + i >= 0 && ix0 + i < g.W;
      row[i] = ((n * g.H + (iy0 + i)) * g.W + ix0) * C;
    }
    for (int64_t c = 0; c < C; c += 16) {
      __m512 d[4][4];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j)
          d[i][j] =
              in_y[i] && in_x[j] ? _mm512_loadu_ps(x + (row[i] + j * C + c)) : _mm512_setzero_ps();
      __m512 t[4][4];  // B^T d, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
      for (int j = 0; j < 4; ++j) {
        t[0][j] = _mm512_sub_ps(d[0][j], d[2][j]);
        t[1][j] = _mm512_add_ps(d[1][j], d[2][j]);
        t[2][j] = _mm512_sub_ps(d[2][j], d[1][j]);
        t[3][j] = _mm512_sub_ps(d[1][j], d[3][j]);
      }
      float* out = v + r * C + c;
      for (int i = 0; i < 4; ++i) {  // (B^T d) B
        _mm512_storeu_ps(out + (i * 4 + 0) * plane, _mm512_sub_ps(t[i][0], t[i][2]));
        _mm512_storeu_ps(out + (i * 4 + 1) * plane, _mm512_add_ps(t[i][1], t[i][2]));
        _mm512_storeu_ps(out + (i * 4 + 2) * plane, _mm512_sub_ps(t[i][2], t[i][1]));
        _mm512_storeu_ps(out + (i * 4 + 3) * plane, _mm512_sub_ps(t[i][1], t[i][3]));
      }
    }
  }
}

/// out[tb x M] = a[tb x K] b[K x M], tb a multiple of RB and M of 16 * NV: RB x NV accumulators
/// held in registers over the whole K loop.
template <int RB, int NV>
HP_AVX512 void gemm(const float* a, const float* b, float* out, int64_t tb, int64_t K, int64_t M) {
  for (int64_t r0 = 0; r0 < tb; r0 += RB)
    for (int64_t j0 = 0; j0 < M; j0 += 16 * NV) {
      __m512 acc[RB][NV];
#pragma GCC unroll 32
      for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
      const float* ar = a + r0 * K;
      for (int64_t k = 0; k < K; ++k) {
        __m512 bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + k * M + j0 + 16 * v);
#pragma GCC unroll 32
        for (int r = 0; r < RB; ++r) {
          const __m512 av = _mm512_set1_ps(ar[r * K + k]);
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
      }
#pragma GCC unroll 32
      for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + (r0 + r) * M + j0 + 16 * v, acc[r][v]);
    }
}

/// y's 2x2 outputs of `rows` tiles from t0 from Mt[p][row][m]: A^T Mt A (A^T = [1 1 1 0; 0 1 -1
/// -1]), + bias, + z, Relu; outputs past the image's edge are dropped.
HP_AVX512 void output_transform(const Geometry& g, const float* mt, int64_t t0, int64_t rows,
                                int64_t tb, const float* bias, const float* z, bool relu,
                                float* y) {
  const int64_t tiles = g.N * g.th * g.tw, M = g.M, plane = tb * M;
  for (int64_t r = 0; r < rows && t0 + r < tiles; ++r) {
    const int64_t t = t0 + r, n = t / (g.th * g.tw), rest = t % (g.th * g.tw);
    const int64_t oy = (rest / g.tw) * 2, ox = (rest % g.tw) * 2;
    const bool y1 = oy + 1 < g.OH, x1 = ox + 1 < g.OW;
    const int64_t o00 = ((n * g.OH + oy) * g.OW + ox) * M;
    const int64_t off[4] = {o00, o00 + M, o00 + g.OW * M, o00 + (g.OW + 1) * M};
    const bool keep[4] = {true, x1, y1, y1 && x1};
    for (int64_t m = 0; m < M; m += 16) {
      const float* in = mt + r * M + m;
      __m512 s[2][4];  // A^T Mt
      for (int j = 0; j < 4; ++j) {
        const __m512 m0 = _mm512_loadu_ps(in + (0 + j) * plane),
                     m1 = _mm512_loadu_ps(in + (4 + j) * plane),
                     m2 = _mm512_loadu_ps(in + (8 + j) * plane),
                     m3 = _mm512_loadu_ps(in + (12 + j) * plane);
        s[0][j] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
        s[1][j] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
      }
      const __m512 b = bias ? _mm512_loadu_ps(bias + m) : _mm512_setzero_ps();
      __m512 o[4];
      for (int i = 0; i < 2; ++i) {
        o[2 * i] = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s[i][0], s[i][1]), s[i][2]), b);
        o[2 * i + 1] = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s[i][1], s[i][2]), s[i][3]), b);
      }
      for (int q = 0; q < 4; ++q) {
        if (!keep[q]) continue;
        __m512 val = o[q];
        if (z) val = _mm512_add_ps(val, _mm512_loadu_ps(z + off[q] + m));
        // Relu as std::max(v, 0.f) computes it: negatives to zero, NaN kept (a masked move,
        // which also avoids GCC 12's false uninitialised warning on _mm512_max_ps).
        if (relu)
          val = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(val, _mm512_setzero_ps(), _CMP_NLT_UQ), val);
        _mm512_storeu_ps(y + off[q] + m, val);
      }
    }
  }
}

/// The tile loop over channels-last x, z, y with the filters' transform u.
template <int RB, int NV>
void run(const Geometry& g, const float* x, const float* u, const float* bias, const float* z,
         bool relu, float* y) {
  const int64_t tiles = g.N * g.th * g.tw;
  // About 32 tiles a block (of 16, 32, 64 and 128 the fastest on the benchmark CNN): V and Mt of
  // a block (16 x tb x (C + M) floats) stay in L1/L2.
  const int64_t tb = std::max<int64_t>(1, 32 / RB) * RB, blocks = (tiles + tb - 1) / tb;
  // An exception cannot leave an OpenMP region: a thread whose scratch allocation fails skips its
  // blocks and the failure is thrown after the region.
  std::atomic<bool> out_of_memory{false};
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    thread_local ScratchBuffer vb, mb;
    float* v = try_f(vb, static_cast<size_t>(16 * tb * g.C));
    float* mt = try_f(mb, static_cast<size_t>(16 * tb * g.M));
    if (!v || !mt) {
      out_of_memory = true;
      continue;
    }
    const int64_t t0 = blk * tb;
    input_transform(g, x, t0, tb, tb, v);
    for (int p = 0; p < 16; ++p)
      gemm<RB, NV>(v + p * tb * g.C, u + p * g.C * g.M, mt + p * tb * g.M, tb, g.C, g.M);
    output_transform(g, mt, t0, tb, tb, bias, z, relu, y);
  }
  if (out_of_memory) throw std::bad_alloc();
}

bool cpu_has_avx512() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes;
}

bool enabled() {
  static const bool on = [] {
    const char* e = std::getenv("HP_CPU_WINOGRAD");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

}  // namespace

bool winograd_applies(const ConvShape& s) {
  if (!enabled() || !cpu_has_avx512() || s.bf16 || s.group != 1 || s.x.size() != 4) return false;
  if (s.w[2] != 3 || s.w[3] != 3 || s.x[1] % 16 || s.w[0] % 16) return false;
  for (size_t d = 0; d < 2; ++d)
    if (s.strides[d] != 1 || s.dilations[d] != 1 || s.pads[d] > 2 || s.pads[d + 2] > 2)
      return false;
  // Below a few tiles the transforms and the per-call filter transform dominate.
  return s.y[0] * s.y[2] * s.y[3] >= 64;
}

bool conv_forward_winograd(hp_ctx* ctx, const ConvShape& s, const float* x, const float* w,
                           const float* b, const float* z, float* y, int64_t weight_id) {
  if (!winograd_applies(s)) return false;
  Geometry g{s.x[0], s.x[1], s.x[2], s.x[3], s.w[0], s.y[2], s.y[3], s.pads[0], s.pads[1], 0, 0};
  g.th = (g.OH + 1) / 2;
  g.tw = (g.OW + 1) / 2;
  thread_local ScratchBuffer ub, xb, zb, yb;
  const float* u = nullptr;
  std::shared_ptr<std::vector<unsigned char>> kept;
  if (weight_id != 0 && ctx) {
    // A constant filter: transformed once, kept under the executor's id (keyed also by the filter
    // and transform shapes, as the packed GEMM weights are by their layouts).
    using dnnl::memory;
    const memory::desc from({g.M, g.C, 3, 3}, memory::data_type::f32, memory::format_tag::oihw);
    const memory::desc md({16, g.C, g.M}, memory::data_type::f32, memory::format_tag::abc);
    kept = ctx->packed.get(weight_id, from, md, [&](void* buf) {
      transform_weights(w, static_cast<float*>(buf), g.M, g.C);
    });
    if (kept) u = reinterpret_cast<const float*>(kept->data());
  }
  if (!u) {
    float* t = need(ub, static_cast<size_t>(16 * g.C * g.M));
    transform_weights(w, t, g.M, g.C);
    u = t;
  }
  const int64_t out_n = g.N * g.OH * g.OW * g.M;
  if (!s.x_nhwc) {
    float* t = need(xb, static_cast<size_t>(g.N * g.H * g.W * g.C));
    to_channels_last(x, t, g.N, g.C, g.H * g.W);
    x = t;
  }
  if (s.sum && !s.z_nhwc) {
    float* t = need(zb, static_cast<size_t>(out_n));
    to_channels_last(z, t, g.N, g.M, g.OH * g.OW);
    z = t;
  }
  float* yd = s.y_nhwc ? y : need(yb, static_cast<size_t>(out_n));
  const float* bias = s.bias ? b : nullptr;
  const float* zz = s.sum ? z : nullptr;
  if (g.M % 64 == 0)
    run<6, 4>(g, x, u, bias, zz, s.relu, yd);
  else if (g.M % 32 == 0)
    run<12, 2>(g, x, u, bias, zz, s.relu, yd);
  else
    run<24, 1>(g, x, u, bias, zz, s.relu, yd);
  if (!s.y_nhwc) to_channels_first(yd, y, g.N, g.M, g.OH * g.OW);
  return true;
}

#else

bool winograd_applies(const ConvShape&) { return false; }
bool conv_forward_winograd(hp_ctx*, const ConvShape&, const float*, const float*, const float*,
                           const float*, float*, int64_t) {
  return false;
}

#endif

}  // namespace hp_cpu
