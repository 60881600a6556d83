// hp.nn.MaskedSoftmax: the middle of exported attention in one pass per row (the executor fuses
// Mul(scores, scale) -> Where(mask, fill, .) -> Softmax into it:
// libs/exec/src/exec_fuse_softmax.cpp). hp.nn.Attention, the whole of it (cpu_ops_sdpa.cpp).
//
//   Y = Softmax(Where(C, fill, scale * X)) along the last axis     (fill_where = 1)
//   Y = Softmax(Where(C, scale * X, fill)) along the last axis     (fill_where = 0)
//
// C (bool, optional: without it only the scale applies) and X broadcast together as the Where's
// operands do. The masked, scaled scores are written into Y in one pass and softmaxed there in
// place (float32 by oneDNN's softmax): two passes over the scores instead of three, and two kernel
// launches fewer.
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpu_bcast.h"
#include "cpu_internal.h"
#include "cpu_kernels.h"
#include "cpu_ops.h"

namespace hp_cpu {
namespace {

template <class T>
void softmax_row_generic(T* y, int64_t len) {
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < len; ++i) mx = std::max(mx, y[i]);
  if (mx == -std::numeric_limits<T>::infinity()) mx = 0;  // an all -inf row: NaNs, as Softmax
  T sum = 0;
  for (int64_t i = 0; i < len; ++i) sum += (y[i] = std::exp(y[i] - mx));
  for (int64_t i = 0; i < len; ++i) y[i] /= sum;
}

void masked_softmax(OpCall& c) {
  const View &x = c.need(0), &cond = c.in(1);
  if (cond.present() && cond.dtype != HP_BOOL) c.fail("the mask must be bool");
  const double scale = c.f("scale", 1.0), fill = c.f("fill", 0.0);
  const bool fill_where = c.i("fill_where", 1) != 0;
  // The Where's broadcast: the output takes X's and the mask's dims together.
  const Dims out = cond.present() ? broadcast_shapes(x.dims, cond.dims, c) : x.dims;
  if (out.empty()) c.fail("X must have rank >= 1");
  View y = c.out(0, x.dtype, out);
  if (y.numel() == 0) return;
  const Dims none(out.size(), 0);
  std::array<Dims, 2> st{broadcast_strides(x.dims, out),
                         cond.present() ? broadcast_strides(cond.dims, out) : none};
  const auto* mask = cond.present() ? static_cast<const unsigned char*>(cond.data) : nullptr;
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      const T* px = x.as<T>();
      T* py = y.as<T>();
      const T s = static_cast<T>(scale), f = static_cast<T>(fill);
      if constexpr (std::is_same_v<T, float>) {
        // Rows contiguous in X and the mask (the usual case): each row is masked, scaled and
        // softmaxed while it is in cache, one pass over the scores instead of two.
        if (st[0].back() == 1 && (!mask || st[1].back() == 1)) {
          bcast_rows<2>(out, st,
                        [&](int64_t o, const std::array<int64_t, 2>& off, int64_t n,
                            const std::array<int64_t, 2>&) {
                          masked_softmax_row(px + off[0], mask ? mask + off[1] : nullptr,
                                             fill_where, s, f, py + o, n);
                        });
          return;
        }
      }
      bcast_rows<2>(out, st,
                    [&](int64_t o, const std::array<int64_t, 2>& off, int64_t n,
                        const std::array<int64_t, 2>& in) {
                      const T* xr = px + off[0];
                      T* yr = py + o;
                      if (mask && in[0] == 1 && in[1] == 1) {  // float64's contiguous rows
                        const unsigned char* mr = mask + off[1];
                        const unsigned char fw = fill_where ? 1 : 0;
                        for (int64_t i = 0; i < n; ++i) {
                          const T v = s * xr[i];
                          yr[i] = static_cast<unsigned char>(mr[i] != 0) == fw ? f : v;
                        }
                      } else if (mask) {
                        const unsigned char* mr = mask + off[1];
                        for (int64_t i = 0; i < n; ++i)
                          yr[i] = (mr[i * in[1]] != 0) == fill_where ? f : s * xr[i * in[0]];
                      } else {
                        for (int64_t i = 0; i < n; ++i) yr[i] = s * xr[i * in[0]];
                      }
                      if constexpr (!std::is_same_v<T, float>) softmax_row_generic(yr, n);
                    });
      // Strided float32 rows go through oneDNN's softmax in place (cpu_softmax.cpp).
      if constexpr (std::is_same_v<T, float>) {
        const int64_t len = out.back(), rows = y.numel() / len;
        if (!c.ctx()->softmaxes.run(c.ctx()->engine, c.stream()->dnnl_stream, py, py, rows, len,
                                    false)) {
#pragma omp parallel for schedule(static) if (y.numel() >= (1 << 15))
          for (int64_t o = 0; o < rows; ++o) softmax_row(py + o * len, py + o * len, len, false);
        }
      }
    }
  });
}

bool masked_softmax_types(const std::vector<int32_t>& d) {
  if (d.empty() || (d[0] != HP_F32 && d[0] != HP_F64)) return false;
  return d.size() < 2 || d[1] == -1 || d[1] == HP_BOOL;
}

bool attention_types(const std::vector<int32_t>& d) {
  if (d.size() < 3 || (d[0] != HP_F32 && d[0] != HP_F64) || d[1] != d[0] || d[2] != d[0])
    return false;
  return d.size() < 4 || d[3] == -1 || d[3] == HP_BOOL;
}

}  // namespace

void register_attention_ops(OpTable& t) {
  t["hp.nn.MaskedSoftmax"] = {masked_softmax, masked_softmax_types};
  // HP_CPU_ATTENTION=0 leaves exported attention unfused (the executor fuses only what the
  // backend implements): the benchmark's baseline (tests/bench/executor/run.sh).
  const char* e = std::getenv("HP_CPU_ATTENTION");
  if (!(e && std::strcmp(e, "0") == 0)) t["hp.nn.Attention"] = {attention, attention_types};
}

}  // namespace hp_cpu
