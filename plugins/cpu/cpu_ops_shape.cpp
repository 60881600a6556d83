// Data-movement ONNX ops on the cpu backend: ops that only change a tensor's shape (Reshape,
// Flatten, Squeeze, Unsqueeze, Identity, Dropout at inference) copy the bytes; Transpose, Expand,
// Tile, Concat, Split and Slice move elements by index arithmetic and are dtype-agnostic (they work
// on element sizes); Shape, Size, Constant, ConstantOfShape and Range create tensors; Trilu masks a
// matrix.
//
// Attribute-vs-input forms follow the opset: Squeeze/Unsqueeze/Split take axes/split as inputs from
// opset 13, Slice takes starts/ends as inputs from opset 10.
#include <algorithm>
#include <cstring>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

bool any_dtype(const std::vector<int32_t>& d) {
  return !d.empty() && d[0] >= 0 && dtype_size(d[0]) > 0;
}

/// y = x's bytes; nothing when the executor gave y x's own buffer (a view whose input dies with
/// it: libs/exec/src/exec_run.cpp, alloc_output).
void copy_bytes(const View& x, View& y) {
  if (x.numel() > 0 && y.data != x.data)
    std::memcpy(y.data, x.data, static_cast<size_t>(x.numel() * dtype_size(x.dtype)));
}

void same_data(OpCall& c, const Dims& dims) {
  const View& x = c.need(0);
  if (numel(dims) != x.numel())
    c.fail("cannot reshape " + dims_str(x.dims) + " to " + dims_str(dims));
  View y = c.out(0, x.dtype, dims);
  copy_bytes(x, y);
}

void reshape(OpCall& c) {
  const View& x = c.need(0);
  std::vector<int64_t> shape = c.need(1).ints();
  const bool allowzero = c.i("allowzero", 0) != 0;
  int64_t known = 1, infer = -1;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 0 && !allowzero) {
      if (k >= x.dims.size()) c.fail("shape entry 0 at a position the input lacks");
      shape[k] = x.dims[k];
    }
    if (shape[k] == -1) {
      if (infer >= 0) c.fail("more than one -1 in the shape");
      infer = static_cast<int64_t>(k);
    } else if (shape[k] < 0 || __builtin_mul_overflow(known, shape[k], &known)) {
      c.fail("cannot reshape " + dims_str(x.dims) + " to " + dims_str(shape));
    }
  }
  if (infer >= 0) {
    if (known == 0 || x.numel() % known)
      c.fail("cannot infer the -1 of " + dims_str(shape) + " from " + dims_str(x.dims));
    shape[static_cast<size_t>(infer)] = x.numel() / known;
  }
  same_data(c, shape);
}

void flatten(OpCall& c) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  int64_t a = c.i("axis", 1);
  if (a < 0) a += r;
  if (a < 0 || a > r) c.fail("axis out of range");
  int64_t outer = 1;
  for (int64_t k = 0; k < a; ++k) outer *= x.dims[static_cast<size_t>(k)];
  same_data(c, {outer, outer == 0 ? 0 : x.numel() / std::max<int64_t>(outer, 1)});
}

std::vector<int64_t> axes_of(OpCall& c, size_t input_from_13) {
  if (c.opset() >= 13)
    return c.in(input_from_13).present() ? c.in(input_from_13).ints() : std::vector<int64_t>{};
  return c.ints("axes");
}

void squeeze(OpCall& c) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  std::vector<int64_t> axes = axes_of(c, 1);
  std::vector<bool> drop(x.dims.size(), false);
  if (axes.empty()) {
    for (size_t k = 0; k < x.dims.size(); ++k) drop[k] = x.dims[k] == 1;
  }
  for (int64_t a : axes) {
    int64_t k = c.axis(a, r);
    if (x.dims[static_cast<size_t>(k)] != 1)
      c.fail("cannot squeeze a dim of size " + std::to_string(x.dims[static_cast<size_t>(k)]));
    drop[static_cast<size_t>(k)] = true;
  }
  Dims out;
  for (size_t k = 0; k < x.dims.size(); ++k)
    if (!drop[k]) out.push_back(x.dims[k]);
  same_data(c, out);
}

void unsqueeze(OpCall& c) {
  const View& x = c.need(0);
  std::vector<int64_t> axes = axes_of(c, 1);
  const int64_t r = static_cast<int64_t>(x.dims.size() + axes.size());
  std::vector<bool> ins(static_cast<size_t>(r), false);
  for (int64_t a : axes) {
    auto&& at = ins[static_cast<size_t>(c.axis(a, r))];
    if (at) c.fail("axis " + std::to_string(a) + " is given twice");  // else dims run out below
    at = true;
  }
  Dims out;
  size_t src = 0;
  for (int64_t k = 0; k < r; ++k) out.push_back(ins[static_cast<size_t>(k)] ? 1 : x.dims[src++]);
  same_data(c, out);
}

template <class T>
void strided_row(const char* src, char* dst, int64_t n, int64_t stride) {
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = s[i * stride];
}

/// The strided copy of a (merged) shape whose innermost output dim reads with stride `strides[r-1]`
/// and whose dim `j` reads contiguously: a 2-D transpose of dims j and r-1 for every index of the
/// others (attention's key transpose [b,t,h,d] -> [b,h,d,t]). Done in square tiles, so that the
/// cache lines a tile reads and writes are all used before they are evicted; a row-at-a-time
/// strided loop touched a new source line for every element.
template <class T>
void transpose_tiles(const char* src, char* dst, const Dims& dims, const Dims& strides, size_t j,
                     int64_t base) {
  // Two cache lines of elements a side (16 x 16 for 8-byte elements up to 128 x 128 for bytes).
  constexpr int64_t kTile = 128 / sizeof(T);
  const size_t r = dims.size();
  Dims dst_st(r, 1);
  for (size_t d = r - 1; d-- > 0;) dst_st[d] = dst_st[d + 1] * dims[d + 1];
  const int64_t na = dims[j], nb = dims[r - 1], sb = strides[r - 1], da = dst_st[j];
  const int64_t ta = (na + kTile - 1) / kTile, tb = (nb + kTile - 1) / kTile;
  const int64_t outer = numel(dims) / (na * nb), units = outer * ta * tb;
  const T* s = reinterpret_cast<const T*>(src);
  T* y = reinterpret_cast<T*>(dst);
#pragma omp parallel for schedule(static) if (numel(dims) >= (1 << 16) && units > 1)
  for (int64_t u = 0; u < units; ++u) {
    int64_t rest = u / (ta * tb);
    const int64_t a0 = (u / tb % ta) * kTile, b0 = u % tb * kTile;
    int64_t so = base, doff = 0;
    for (size_t d = r - 1; d-- > 0;) {  // the outer index over every dim but j and r-1
      if (d == j) continue;
      so += (rest % dims[d]) * strides[d];
      doff += (rest % dims[d]) * dst_st[d];
      rest /= dims[d];
    }
    const int64_t a1 = std::min(na, a0 + kTile), b1 = std::min(nb, b0 + kTile);
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t a = a0; a < a1; ++a) y[doff + a * da + b] = s[so + a + b * sb];
  }
}

/// Copies `x` into `y` where y[i] = x[base + sum(idx_k * st_k)] over y's shape (general strided
/// gather: Transpose, Expand, Slice). Dims of size 1 are dropped and neighbours that are contiguous
/// in the source too are merged, so a Transpose that keeps the innermost dim (attention's [b,t,h,d]
/// -> [b,h,t,d]) becomes a few long memcpy rows; other rows are typed strided loops. Large copies
/// split their rows across OpenMP threads.
void strided_copy(const View& x, View& y, const Dims& st, int64_t base = 0) {
  const int es = dtype_size(x.dtype);
  const char* px = static_cast<const char*>(x.data);
  char* py = static_cast<char*>(y.data);
  const int64_t n = y.numel();
  if (n == 0) return;
  Dims dims, strides;
  for (size_t d = 0; d < y.dims.size(); ++d) {
    if (y.dims[d] == 1) continue;
    if (!dims.empty() && strides.back() == st[d] * y.dims[d]) {
      dims.back() *= y.dims[d];
      strides.back() = st[d];
    } else {
      dims.push_back(y.dims[d]);
      strides.push_back(st[d]);
    }
  }
  if (dims.empty()) {
    dims.push_back(1);
    strides.push_back(0);
  }
  const size_t r = dims.size();
  const int64_t len = dims[r - 1], inner = strides[r - 1], rows = n / len;
  if (inner != 1 && inner != 0 && len >= 8) {  // (stride 0: Expand's broadcast rows, a fill)
    for (size_t j = 0; j + 1 < r; ++j) {
      if (strides[j] != 1 || dims[j] < 8) continue;
      switch (es) {
        case 1: return transpose_tiles<uint8_t>(px, py, dims, strides, j, base);
        case 2: return transpose_tiles<uint16_t>(px, py, dims, strides, j, base);
        case 4: return transpose_tiles<uint32_t>(px, py, dims, strides, j, base);
        case 8: return transpose_tiles<uint64_t>(px, py, dims, strides, j, base);
        default: break;
      }
    }
  }
  auto row = [&](int64_t q) {
    int64_t off = base, rest = q;
    for (size_t d = r - 1; d-- > 0;) {
      off += (rest % dims[d]) * strides[d];
      rest /= dims[d];
    }
    const char* src = px + off * es;
    char* dst = py + q * len * es;
    if (inner == 1) {
      std::memcpy(dst, src, static_cast<size_t>(len * es));
      return;
    }
    switch (es) {
      case 1: strided_row<uint8_t>(src, dst, len, inner); break;
      case 2: strided_row<uint16_t>(src, dst, len, inner); break;
      case 4: strided_row<uint32_t>(src, dst, len, inner); break;
      case 8: strided_row<uint64_t>(src, dst, len, inner); break;
      default:
        for (int64_t i = 0; i < len; ++i)
          std::memcpy(dst + i * es, src + i * inner * es, static_cast<size_t>(es));
    }
  };
#pragma omp parallel for schedule(static) if (n >= (1 << 16) && rows > 1)
  for (int64_t q = 0; q < rows; ++q) row(q);
}

void transpose(OpCall& c) {
  const View& x = c.need(0);
  const size_t r = x.dims.size();
  std::vector<int64_t> perm = c.ints("perm");
  if (perm.empty())
    for (size_t k = 0; k < r; ++k) perm.push_back(static_cast<int64_t>(r - 1 - k));
  if (perm.size() != r) c.fail("perm has the wrong length");
  Dims in_st = strides_of(x.dims), out(r), st(r);
  std::vector<bool> used(r, false);
  for (size_t k = 0; k < r; ++k) {
    size_t p = static_cast<size_t>(c.axis(perm[k], static_cast<int64_t>(r)));
    // A repeated axis would read past the input (its strides are used twice).
    if (used[p]) c.fail("perm repeats axis " + std::to_string(p));
    used[p] = true;
    out[k] = x.dims[p];
    st[k] = in_st[p];
  }
  View y = c.out(0, x.dtype, out);
  strided_copy(x, y, st);
}

void expand(OpCall& c) {
  const View& x = c.need(0);
  Dims shape = broadcast_shapes(x.dims, c.need(1).ints(), c);
  View y = c.out(0, x.dtype, shape);
  strided_copy(x, y, broadcast_strides(x.dims, shape));
}

void tile(OpCall& c) {
  const View& x = c.need(0);
  std::vector<int64_t> rep = c.need(1).ints();
  if (rep.size() != x.dims.size()) c.fail("repeats must have one entry per dim");
  Dims out(x.dims.size());
  for (size_t k = 0; k < out.size(); ++k) out[k] = x.dims[k] * rep[k];
  View y = c.out(0, x.dtype, out);
  const int es = dtype_size(x.dtype);
  Dims st = strides_of(x.dims);
  Dims idx(out.size(), 0);
  for (int64_t i = 0, n = y.numel(); i < n; ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < out.size(); ++d) off += (idx[d] % x.dims[d]) * st[d];
    std::memcpy(static_cast<char*>(y.data) + i * es, static_cast<const char*>(x.data) + off * es,
                static_cast<size_t>(es));
    for (size_t d = out.size(); d-- > 0;) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
}

void concat(OpCall& c) {
  const View& first = c.need(0);
  const int64_t r = static_cast<int64_t>(first.dims.size());
  if (r == 0) c.fail("Concat takes inputs of rank 1 or more, input 0 is a scalar");
  const size_t a = static_cast<size_t>(c.axis(c.i("axis", 0), r));
  Dims out = first.dims;
  out[a] = 0;
  for (size_t k = 0; k < c.n_inputs(); ++k) {
    const View& v = c.need(k);
    if (v.dims.size() != first.dims.size()) c.fail("inputs differ in rank");
    for (size_t d = 0; d < out.size(); ++d)
      if (d != a && v.dims[d] != first.dims[d]) c.fail("inputs differ outside the concat axis");
    out[a] += v.dims[a];
  }
  View y = c.out(0, first.dtype, out);
  const int es = dtype_size(first.dtype);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < a; ++d) outer *= out[d];
  for (size_t d = a + 1; d < out.size(); ++d) inner *= out[d];
  int64_t pos = 0;
  for (size_t k = 0; k < c.n_inputs(); ++k) {
    const View& v = c.in(k);
    const int64_t chunk = v.dims[a] * inner * es;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(static_cast<char*>(y.data) + (o * out[a] * inner + pos) * es,
                  static_cast<const char*>(v.data) + o * chunk, static_cast<size_t>(chunk));
    pos += v.dims[a] * inner;
  }
}

void split(OpCall& c) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  const size_t a = static_cast<size_t>(c.axis(c.i("axis", 0), r));
  std::vector<int64_t> parts = c.opset() >= 13
                                   ? (c.in(1).present() ? c.in(1).ints() : std::vector<int64_t>{})
                                   : c.ints("split");
  const int64_t n_out = c.n_outputs();
  if (parts.empty()) {
    const int64_t num = c.has("num_outputs") ? c.i("num_outputs", n_out) : n_out;
    const int64_t each = (x.dims[a] + num - 1) / num;
    for (int64_t k = 0; k < num; ++k) parts.push_back(std::min(each, x.dims[a] - k * each));
  }
  if (static_cast<int64_t>(parts.size()) != n_out) c.fail("split sizes do not match the outputs");
  int64_t outer = 1, inner = 1, total = 0;
  for (int64_t p : parts) total += p;
  if (total != x.dims[a]) c.fail("split sizes do not add up to the axis length");
  for (size_t d = 0; d < a; ++d) outer *= x.dims[d];
  for (size_t d = a + 1; d < x.dims.size(); ++d) inner *= x.dims[d];
  const int es = dtype_size(x.dtype);
  int64_t pos = 0;
  for (int64_t k = 0; k < n_out; ++k) {
    Dims od = x.dims;
    od[a] = parts[static_cast<size_t>(k)];
    View y = c.out(k, x.dtype, od);
    const int64_t chunk = od[a] * inner * es;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(static_cast<char*>(y.data) + o * chunk,
                  static_cast<const char*>(x.data) + (o * x.dims[a] * inner + pos) * es,
                  static_cast<size_t>(chunk));
    pos += od[a] * inner;
  }
}

void slice(OpCall& c) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset() >= 10) {
    starts = c.need(1).ints();
    ends = c.need(2).ints();
    if (c.in(3).present()) axes = c.in(3).ints();
    if (c.in(4).present()) steps = c.in(4).ints();
  } else {
    starts = c.ints("starts");
    ends = c.ints("ends");
    axes = c.ints("axes");
  }
  if (axes.empty())
    for (size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<int64_t>(k));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    c.fail("starts, ends, axes and steps differ in length");
  Dims out = x.dims, st = strides_of(x.dims), ost = st;
  int64_t base = 0;
  for (size_t k = 0; k < starts.size(); ++k) {
    const size_t a = static_cast<size_t>(c.axis(axes[k], r));
    const int64_t dim = x.dims[a], step = steps[k];
    if (step == 0) c.fail("slice step 0");
    int64_t s = starts[k], e = ends[k];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      out[a] = e > s ? (e - s + step - 1) / step : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      out[a] = s > e ? (s - e + (-step) - 1) / (-step) : 0;
    }
    base += s * st[a];
    ost[a] = st[a] * step;
  }
  View y = c.out(0, x.dtype, out);
  if (y.numel() > 0) strided_copy(x, y, ost, base);
}

void trilu(OpCall& c) {
  const View& x = c.need(0);
  if (x.dims.size() < 2) c.fail("input must have rank >= 2");
  int64_t k = 0;
  if (c.in(1).present()) {
    const auto ks = c.in(1).ints();  // as integers: INT64_MAX does not survive a double
    if (ks.size() != 1) c.fail("k must hold one value");
    k = ks[0];
  }
  const bool upper = c.i("upper", 1) != 0;
  View y = c.out(0, x.dtype, x.dims);
  const int64_t rows = x.dims[x.dims.size() - 2], cols = x.dims.back();
  const int es = dtype_size(x.dtype);
  copy_bytes(x, y);
  char* p = static_cast<char*>(y.data);
  for (int64_t m = 0, n = rows > 0 && cols > 0 ? x.numel() / (rows * cols) : 0; m < n; ++m)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        if (upper ? j - i < k : j - i > k)
          std::memset(p + ((m * rows + i) * cols + j) * es, 0, static_cast<size_t>(es));
}

}  // namespace

void register_shape_ops(OpTable& t) {
  auto any = [](const std::vector<int32_t>& d) { return any_dtype(d); };
  t["Reshape"] = {reshape, any};
  t["Flatten"] = {flatten, any};
  t["Squeeze"] = {squeeze, any};
  t["Unsqueeze"] = {unsqueeze, any};
  t["Identity"] = {[](OpCall& c) { same_data(c, c.need(0).dims); }, any};
  t["Dropout"] = {
      [](OpCall& c) {
        const bool training = c.in(2).present() && c.in(2).numel() > 0 && c.in(2).scalar() != 0;
        const double ratio =
            c.in(1).present() && c.in(1).numel() > 0 ? c.in(1).scalar() : c.f("ratio", 0.5);
        if (training && ratio > 0) return dropout_training(c, ratio);
        same_data(c, c.need(0).dims);
        if (c.n_outputs() > 1) {
          View m = c.out(1, HP_BOOL, c.need(0).dims);
          if (m.numel() > 0) std::memset(m.data, 1, static_cast<size_t>(m.numel()));
        }
      },
      any};
  t["Transpose"] = {transpose, any};
  t["Expand"] = {expand, any};
  t["Tile"] = {tile, any};
  t["Concat"] = {concat, any};
  t["Split"] = {split, any};
  t["Slice"] = {slice, any};
  t["Trilu"] = {trilu, any};
}

}  // namespace hp_cpu
