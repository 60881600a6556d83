// Small data-movement and selection ops on the cpu backend: Hardmax, EyeLike, NonZero, Compress,
// Shrink, BitShift, ReverseSequence, Unique, DepthToSpace and SpaceToDepth. Each is a plain loop
// over row-major data: none of them does enough arithmetic for a library kernel to matter.
#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_bcast.h"
#include "cpu_kernels.h"

namespace hp_cpu {
namespace {

/// Hardmax: 1 at the first maximum along the axis, 0 elsewhere. Before opset 13 the input is
/// seen as 2-D [outer, inner] split at `axis` and the maximum is taken over each whole row.
void hardmax(OpCall& c) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  const int64_t ax = c.axis(c.i("axis", c.opset() >= 13 ? -1 : 1), r);
  int64_t outer = 1, len = 1, inner = 1;
  if (c.opset() >= 13) {
    for (int64_t d = 0; d < ax; ++d) outer *= x.dims[d];
    len = x.dims[ax];
    for (int64_t d = ax + 1; d < r; ++d) inner *= x.dims[d];
  } else {
    for (int64_t d = 0; d < ax; ++d) outer *= x.dims[d];
    for (int64_t d = ax; d < r; ++d) len *= x.dims[d];
  }
  View y = c.out(0, x.dtype, x.dims);
  dispatch_num(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    T* py = y.as<T>();
    std::fill(py, py + x.numel(), T(0));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t base = o * len * inner + i;
        int64_t best = 0;
        for (int64_t k = 1; k < len; ++k)
          if (px[base + k * inner] > px[base + best * inner]) best = k;
        if (len > 0) py[base + best * inner] = T(1);
      }
  });
}

int onnx_to_hp(int64_t onnx_type) {
  switch (onnx_type) {
    case 1: return HP_F32;
    case 2: return HP_U8;
    case 3: return HP_I8;
    case 4: return HP_U16;
    case 5: return HP_I16;
    case 6: return HP_I32;
    case 7: return HP_I64;
    case 9: return HP_BOOL;
    case 11: return HP_F64;
    case 12: return HP_U32;
    case 13: return HP_U64;
    default: return -1;
  }
}

void eye_like(OpCall& c) {
  const View& x = c.need(0);
  if (x.dims.size() != 2) c.fail("input must be 2-D, got " + dims_str(x.dims));
  const int dt = c.has("dtype") ? onnx_to_hp(c.i("dtype", 1)) : x.dtype;
  if (dt < 0) throw OpError("dtype is not supported", HP_UNSUPPORTED);
  const int64_t k = c.i("k", 0), rows = x.dims[0], cols = x.dims[1];
  View y = c.out(0, dt, x.dims);
  dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    T* py = y.as<T>();
    std::fill(py, py + rows * cols, T(0));
    for (int64_t i = 0; i < rows; ++i)
      if (i + k >= 0 && i + k < cols) py[i * cols + i + k] = T(1);
  });
}

/// NonZero: the indices of the nonzero elements, one column per element in row-major order.
void non_zero(OpCall& c) {
  const View& x = c.need(0);
  const int64_t n = x.numel(), r = static_cast<int64_t>(x.dims.size());
  std::vector<int64_t> hits;
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < n; ++i)
      if (x.as<T>()[i] != T(0)) hits.push_back(i);
  });
  const int64_t nz = static_cast<int64_t>(hits.size());
  View y = c.out(0, HP_I64, {r, nz});
  const Dims st = strides_of(x.dims);
  for (int64_t j = 0; j < nz; ++j)
    for (int64_t d = 0; d < r; ++d) y.as<int64_t>()[d * nz + j] = hits[j] / st[d] % x.dims[d];
}

/// Compress: the slices along `axis` (of the flattened input without one) whose condition is true;
/// a condition shorter than the axis leaves the rest out.
void compress(OpCall& c) {
  const View &x = c.need(0), &cond = c.need(1);
  Dims dims = x.dims;
  int64_t ax = 0;
  if (c.has("axis"))
    ax = c.axis(c.i("axis", 0), static_cast<int64_t>(dims.size()));
  else
    dims = {x.numel()};
  const std::vector<int64_t> keep = cond.ints();
  if (static_cast<int64_t>(keep.size()) > dims[ax])
    c.fail("condition has " + std::to_string(keep.size()) + " values, the axis only " +
           std::to_string(dims[ax]));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < ax; ++d) outer *= dims[d];
  for (size_t d = ax + 1; d < dims.size(); ++d) inner *= dims[d];
  std::vector<int64_t> sel;
  for (size_t k = 0; k < keep.size(); ++k)
    if (keep[k]) sel.push_back(static_cast<int64_t>(k));
  Dims od = dims;
  od[ax] = static_cast<int64_t>(sel.size());
  View y = c.out(0, x.dtype, od);
  const int64_t es = dtype_size(x.dtype);
  auto* py = static_cast<unsigned char*>(y.data);
  const auto* px = static_cast<const unsigned char*>(x.data);
  for (int64_t o = 0; o < outer; ++o)
    for (size_t k = 0; k < sel.size(); ++k)
      std::memcpy(py + ((o * od[ax] + static_cast<int64_t>(k)) * inner) * es,
                  px + ((o * dims[ax] + sel[k]) * inner) * es, static_cast<size_t>(inner * es));
}

void shrink(OpCall& c) {
  const View& x = c.need(0);
  const double lambd = c.f("lambd", 0.5), bias = c.f("bias", 0.0);
  View y = c.out(0, x.dtype, x.dims);
  dispatch_num(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      const double v = static_cast<double>(x.as<T>()[i]);
      y.as<T>()[i] = static_cast<T>(v < -lambd ? v + bias : v > lambd ? v - bias : 0.0);
    }
  });
}

void bit_shift(OpCall& c) {
  const View &a = c.need(0), &b = c.need(1);
  const std::string dir = c.s("direction", "");
  if (dir != "LEFT" && dir != "RIGHT") c.fail("direction must be LEFT or RIGHT, got '" + dir + "'");
  const bool left = dir == "LEFT";
  View y = c.out(0, a.dtype, broadcast_shapes(a.dims, b.dims, c));
  dispatch(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_unsigned_v<T>) {
      binary_bcast<T, T, T>(a, b, y, [&](T p, T q) -> T {
        if (q >= sizeof(T) * 8) return T(0);  // a shift by the width or more is undefined in C++
        return left ? static_cast<T>(p << q) : static_cast<T>(p >> q);
      });
    }
  });
}

/// ReverseSequence: reverses the first seq_len[b] steps along time_axis of each batch entry.
void reverse_sequence(OpCall& c) {
  const View &x = c.need(0), &lens_v = c.need(1);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  if (r < 2) c.fail("input must have rank >= 2");
  const int64_t ba = c.axis(c.i("batch_axis", 1), r), ta = c.axis(c.i("time_axis", 0), r);
  if (ba == ta) c.fail("batch_axis and time_axis must differ");
  const std::vector<int64_t> lens = lens_v.ints();
  if (static_cast<int64_t>(lens.size()) != x.dims[ba])
    c.fail("sequence_lens must have one value per batch entry");
  View y = c.out(0, x.dtype, x.dims);
  const int64_t es = dtype_size(x.dtype), n = x.numel();
  const Dims st = strides_of(x.dims);
  auto* py = static_cast<unsigned char*>(y.data);
  const auto* px = static_cast<const unsigned char*>(x.data);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / st[ba] % x.dims[ba], t = i / st[ta] % x.dims[ta];
    const int64_t len = std::clamp<int64_t>(lens[b], 0, x.dims[ta]);
    const int64_t src = t < len ? i + (len - 1 - 2 * t) * st[ta] : i;
    std::memcpy(py + i * es, px + src * es, static_cast<size_t>(es));
  }
}

/// DepthToSpace (to_space) and SpaceToDepth on [N, C, H, W]: output element (n, c, h, w) comes from
/// the input element the ONNX definition's reshape-transpose-reshape maps it to.
void depth_space(OpCall& c, bool to_space) {
  const View& x = c.need(0);
  if (x.dims.size() != 4) c.fail("input must be 4-D [N,C,H,W], got " + dims_str(x.dims));
  const int64_t b = c.i("blocksize", 0);
  if (b <= 0 || b > (int64_t{1} << 20)) c.fail("blocksize must lie in [1, 2^20]");
  const int64_t N = x.dims[0], C = x.dims[1], H = x.dims[2], W = x.dims[3];
  const bool crd = c.s("mode", "DCR") == "CRD";
  Dims od;
  if (to_space) {
    if (C % (b * b)) c.fail("channels are not divisible by blocksize^2");
    od = {N, C / (b * b), H * b, W * b};
  } else {
    if (H % b || W % b) c.fail("height and width must be divisible by blocksize");
    od = {N, C * b * b, H / b, W / b};
  }
  View y = c.out(0, x.dtype, od);
  const int64_t es = dtype_size(x.dtype);
  auto* py = static_cast<unsigned char*>(y.data);
  const auto* px = static_cast<const unsigned char*>(x.data);
  const int64_t oc = od[1], oh = od[2], ow = od[3];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ch = 0; ch < oc; ++ch)
      for (int64_t h = 0; h < oh; ++h)
        for (int64_t w = 0; w < ow; ++w) {
          int64_t src;
          if (to_space) {
            const int64_t i = h % b, j = w % b;
            const int64_t ic = crd ? ch * b * b + i * b + j : (i * b + j) * oc + ch;
            src = ((n * C + ic) * H + h / b) * W + w / b;
          } else {
            const int64_t blk = ch / C, ic = ch % C, i = blk / b, j = blk % b;
            src = ((n * C + ic) * H + h * b + i) * W + w * b + j;
          }
          std::memcpy(py + (((n * oc + ch) * oh + h) * ow + w) * es, px + src * es,
                      static_cast<size_t>(es));
        }
}

/// Unique: the distinct elements (or slices along `axis`), sorted ascending or in order of first
/// appearance, with the index of each one's first occurrence, the inverse map and the counts.
void unique(OpCall& c) {
  const View& x = c.need(0);
  Dims dims = x.dims;
  const bool has_axis = c.has("axis");
  int64_t ax = 0;
  if (has_axis)
    ax = c.axis(c.i("axis", 0), static_cast<int64_t>(dims.size()));
  else
    dims = {x.numel()};
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < ax; ++d) outer *= dims[d];
  for (size_t d = ax + 1; d < dims.size(); ++d) inner *= dims[d];
  const int64_t len = dims[ax], es = dtype_size(x.dtype);
  const auto* px = static_cast<const unsigned char*>(x.data);
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* v = x.as<T>();
    // slice k: elements (o, k, i) for every o, i
    auto less = [&](int64_t a, int64_t b) {
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
          const T p = v[(o * len + a) * inner + i], q = v[(o * len + b) * inner + i];
          if (p != q) return p < q;
        }
      return false;
    };
    auto equal = [&](int64_t a, int64_t b) { return !less(a, b) && !less(b, a); };
    std::vector<int64_t> first;  // first occurrence of each distinct slice, in appearance order
    std::vector<int64_t> inverse(static_cast<size_t>(len));
    for (int64_t k = 0; k < len; ++k) {
      size_t u = 0;
      while (u < first.size() && !equal(first[u], k)) ++u;
      if (u == first.size()) first.push_back(k);
      inverse[k] = static_cast<int64_t>(u);
    }
    std::vector<size_t> order(first.size());
    for (size_t u = 0; u < order.size(); ++u) order[u] = u;
    if (c.i("sorted", 1))
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return less(first[a], first[b]); });
    std::vector<int64_t> rank(order.size());
    for (size_t u = 0; u < order.size(); ++u) rank[order[u]] = static_cast<int64_t>(u);
    const int64_t nu = static_cast<int64_t>(first.size());
    Dims od = dims;
    od[ax] = nu;
    View y = c.out(0, x.dtype, od);
    auto* py = static_cast<unsigned char*>(y.data);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t u = 0; u < nu; ++u)
        std::memcpy(py + (o * nu + u) * inner * es, px + (o * len + first[order[u]]) * inner * es,
                    static_cast<size_t>(inner * es));
    if (c.n_outputs() > 1) {
      View idx = c.out(1, HP_I64, {nu});
      for (int64_t u = 0; u < nu; ++u) idx.as<int64_t>()[u] = first[order[u]];
    }
    if (c.n_outputs() > 2) {
      View inv = c.out(2, HP_I64, {len});
      for (int64_t k = 0; k < len; ++k) inv.as<int64_t>()[k] = rank[inverse[k]];
    }
    if (c.n_outputs() > 3) {
      View cnt = c.out(3, HP_I64, {nu});
      std::fill(cnt.as<int64_t>(), cnt.as<int64_t>() + nu, 0);
      for (int64_t k = 0; k < len; ++k) ++cnt.as<int64_t>()[rank[inverse[k]]];
    }
  });
}

bool any_first(const std::vector<int32_t>& d) { return !d.empty() && dtype_size(d[0]) > 0; }
bool num_first(const std::vector<int32_t>& d) { return !d.empty() && is_num(d[0]); }

}  // namespace

void register_misc_ops(OpTable& t) {
  t["Hardmax"] = {hardmax, num_first};
  t["EyeLike"] = {eye_like, [](const std::vector<int32_t>& d) {
                    return d.size() == 1 && (is_num(d[0]) || d[0] == HP_BOOL);
                  }};
  t["NonZero"] = {non_zero, [](const std::vector<int32_t>& d) {
                    return d.size() == 1 && (is_num(d[0]) || d[0] == HP_BOOL);
                  }};
  t["Compress"] = {compress, [](const std::vector<int32_t>& d) {
                     return d.size() == 2 && any_first(d) && d[1] == HP_BOOL;
                   }};
  t["Shrink"] = {shrink, num_first};
  t["BitShift"] = {bit_shift, [](const std::vector<int32_t>& d) {
                     return d.size() == 2 && d[0] == d[1] &&
                            (d[0] == HP_U8 || d[0] == HP_U16 || d[0] == HP_U32 || d[0] == HP_U64);
                   }};
  t["ReverseSequence"] = {reverse_sequence, [](const std::vector<int32_t>& d) {
                            return d.size() == 2 && any_first(d) && d[1] == HP_I64;
                          }};
  t["Unique"] = {unique, [](const std::vector<int32_t>& d) {
                   return d.size() == 1 && (is_num(d[0]) || d[0] == HP_BOOL);
                 }};
  t["DepthToSpace"] = {[](OpCall& c) { depth_space(c, true); }, any_first};
  t["SpaceToDepth"] = {[](OpCall& c) { depth_space(c, false); }, any_first};
}

}  // namespace hp_cpu
