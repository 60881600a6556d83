// Broadcast iteration for the cpu kernels: walks an output shape row by row, giving each operand's
// offset at the start of the row and its stride along the innermost dim (0 when that operand is
// broadcast there), so the innermost loop is a plain strided loop the compiler vectorises in the
// common cases (stride 1 or 0).
#pragma once

#include <array>

#include "cpu_ops.h"

namespace hp_cpu {

/// Below this many elements a loop runs on one thread (fork/join costs more than it saves).
constexpr int64_t kParallelMin = 1 << 16;

/// Calls row(out_offset, offs, n, inner) once per innermost row of `out`: offs[k] is operand k's
/// element offset at the row start, inner[k] its innermost stride, n the row length. Large outputs
/// are split across OpenMP threads by rows (each row's offsets computed from its index); `row` must
/// then be safe to call concurrently for different rows.
template <size_t N, class F>
void bcast_rows(const Dims& out, const std::array<Dims, N>& st, F&& row) {
  const size_t r = out.size();
  if (numel(out) == 0) return;
  if (r >= 2 && numel(out) >= kParallelMin) {
    const int64_t n = out[r - 1], rows = numel(out) / n;
    std::array<int64_t, N> inner{};
    for (size_t k = 0; k < N; ++k) inner[k] = st[k][r - 1];
#pragma omp parallel for schedule(static)
    for (int64_t q = 0; q < rows; ++q) {
      std::array<int64_t, N> offs{};
      int64_t rest = q;
      for (size_t d = r - 1; d-- > 0;) {
        const int64_t i = rest % out[d];
        rest /= out[d];
        for (size_t k = 0; k < N; ++k) offs[k] += i * st[k][d];
      }
      row(q * n, offs, n, inner);
    }
    return;
  }
  if (r == 0) {
    std::array<int64_t, N> offs{}, inner{};
    row(int64_t{0}, offs, int64_t{1}, inner);
    return;
  }
  const int64_t n = out[r - 1];
  std::array<int64_t, N> inner{};
  for (size_t k = 0; k < N; ++k) inner[k] = st[k][r - 1];
  Dims idx(r, 0);
  std::array<int64_t, N> offs{};
  const int64_t rows = numel(out) / n;
  for (int64_t q = 0; q < rows; ++q) {
    row(q * n, offs, n, inner);
    // Advance the outer index (dims 0..r-2) like an odometer, updating offsets incrementally.
    for (size_t d = r - 1; d-- > 0;) {
      if (++idx[d] < out[d]) {
        for (size_t k = 0; k < N; ++k) offs[k] += st[k][d];
        break;
      }
      for (size_t k = 0; k < N; ++k) offs[k] -= st[k][d] * (out[d] - 1);
      idx[d] = 0;
    }
  }
}

/// out = f(a, b) with broadcasting; A, B, R the element types.
template <class A, class B, class R, class F>
void binary_bcast(const View& a, const View& b, const View& out, F&& f) {
  const A* pa = a.as<A>();
  const B* pb = b.as<B>();
  R* po = out.as<R>();
  if (a.dims == out.dims && b.dims == out.dims) {
    const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
    return;
  }
  std::array<Dims, 2> st{broadcast_strides(a.dims, out.dims), broadcast_strides(b.dims, out.dims)};
  bcast_rows<2>(out.dims, st,
                [&](int64_t o, const std::array<int64_t, 2>& off, int64_t n,
                    const std::array<int64_t, 2>& in) {
                  const A* x = pa + off[0];
                  const B* y = pb + off[1];
                  R* z = po + o;
                  if (in[0] == 1 && in[1] == 0) {
                    const B yv = *y;
                    for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], yv);
                  } else if (in[0] == 1 && in[1] == 1) {
                    for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], y[i]);
                  } else {
                    for (int64_t i = 0; i < n; ++i) z[i] = f(x[i * in[0]], y[i * in[1]]);
                  }
                });
}

}  // namespace hp_cpu
