// Index-driven ops exporters emit for cache updates, masks and labels, on the cpu backend:
// ScatterND, ScatterElements (reduction none/add/mul/max/min), GatherND (batch_dims), OneHot, IsInf
// and IsNaN.
//
// Scatter ops start from a copy of the data and write the updates in index order, so with duplicate
// indices and no reduction the last update wins (ONNX leaves that case undefined). Negative indices
// count from the end; an index outside the dim is an error naming it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

int64_t checked_index(int64_t i, int64_t dim, const OpCall& c) {
  if (i < -dim || i >= dim)
    c.fail("index " + std::to_string(i) + " out of range for a dim of " + std::to_string(dim));
  return i < 0 ? i + dim : i;
}

enum class Reduce { none, add, mul, max, min };

Reduce reduction_of(const OpCall& c) {
  const std::string r = c.s("reduction", "none");
  if (r == "none") return Reduce::none;
  if (r == "add") return Reduce::add;
  if (r == "mul") return Reduce::mul;
  if (r == "max") return Reduce::max;
  if (r == "min") return Reduce::min;
  c.fail("unknown reduction '" + r + "'");
}

template <class T>
void apply(T& dst, T v, Reduce r) {
  switch (r) {
    case Reduce::none: dst = v; break;
    case Reduce::add: dst = static_cast<T>(dst + v); break;
    case Reduce::mul: dst = static_cast<T>(dst * v); break;
    case Reduce::max: dst = std::max(dst, v); break;
    case Reduce::min: dst = std::min(dst, v); break;
  }
}

void copy_all(const View& x, View& y) {
  if (x.numel() > 0)
    std::memcpy(y.data, x.data, static_cast<size_t>(x.numel() * dtype_size(x.dtype)));
}

void scatter_nd(OpCall& c) {
  const View &x = c.need(0), &ix = c.need(1), &up = c.need(2);
  if (up.dtype != x.dtype) c.fail("updates and data dtypes differ");
  if (ix.dims.empty()) c.fail("indices must have rank >= 1");
  const size_t k = static_cast<size_t>(ix.dims.back());
  if (k > x.dims.size()) c.fail("index tuples are longer than the data's rank");
  const Reduce red = reduction_of(c);
  View y = c.out(0, x.dtype, x.dims);
  copy_all(x, y);
  const std::vector<int64_t> idx = ix.ints();
  const int64_t tuples =
      k ? static_cast<int64_t>(idx.size() / k) : numel(Dims(ix.dims.begin(), ix.dims.end() - 1));
  const Dims xs = strides_of(x.dims);
  const int64_t slice = numel(Dims(x.dims.begin() + static_cast<std::ptrdiff_t>(k), x.dims.end()));
  if (up.numel() != tuples * slice)
    c.fail("updates have " + std::to_string(up.numel()) + " elements, want " +
           std::to_string(tuples * slice));
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* py = y.as<T>();
    const T* pu = up.as<T>();
    for (int64_t t = 0; t < tuples; ++t) {
      int64_t off = 0;
      for (size_t d = 0; d < k; ++d)
        off += checked_index(idx[static_cast<size_t>(t) * k + d], x.dims[d], c) * xs[d];
      for (int64_t i = 0; i < slice; ++i) apply(py[off + i], pu[t * slice + i], red);
    }
  });
}

void scatter_elements(OpCall& c) {
  const View &x = c.need(0), &ix = c.need(1), &up = c.need(2);
  if (up.dtype != x.dtype) c.fail("updates and data dtypes differ");
  if (ix.dims != up.dims || ix.dims.size() != x.dims.size())
    c.fail("indices and updates must have one shape, of the data's rank");
  const size_t a = static_cast<size_t>(c.axis(c.i("axis", 0), static_cast<int64_t>(x.dims.size())));
  const Reduce red = reduction_of(c);
  View y = c.out(0, x.dtype, x.dims);
  copy_all(x, y);
  const std::vector<int64_t> idx = ix.ints();
  const Dims xs = strides_of(x.dims);
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* py = y.as<T>();
    const T* pu = up.as<T>();
    Dims pos(ix.dims.size(), 0);
    for (size_t i = 0; i < idx.size(); ++i) {
      int64_t off = 0;
      for (size_t d = 0; d < pos.size(); ++d)
        off += (d == a ? checked_index(idx[i], x.dims[d], c) : pos[d]) * xs[d];
      apply(py[off], pu[i], red);
      for (size_t d = pos.size(); d-- > 0;) {
        if (++pos[d] < ix.dims[d]) break;
        pos[d] = 0;
      }
    }
  });
}

void gather_nd(OpCall& c) {
  const View &x = c.need(0), &ix = c.need(1);
  const size_t b = static_cast<size_t>(c.i("batch_dims", 0));
  if (ix.dims.empty() || b >= ix.dims.size() || b > x.dims.size())
    c.fail("batch_dims too large for the inputs");
  for (size_t d = 0; d < b; ++d)
    if (x.dims[d] != ix.dims[d]) c.fail("data and indices differ in a batch dim");
  const size_t k = static_cast<size_t>(ix.dims.back());
  if (b + k > x.dims.size())
    c.fail("index tuples are longer than the data's rank after the batch dims");
  Dims out(ix.dims.begin(), ix.dims.end() - 1);
  out.insert(out.end(), x.dims.begin() + static_cast<std::ptrdiff_t>(b + k), x.dims.end());
  View y = c.out(0, x.dtype, out);
  const std::vector<int64_t> idx = ix.ints();
  const int64_t batches =
      numel(Dims(x.dims.begin(), x.dims.begin() + static_cast<std::ptrdiff_t>(b)));
  const int64_t per_batch =
      numel(Dims(ix.dims.begin() + static_cast<std::ptrdiff_t>(b), ix.dims.end() - 1));
  const int64_t slice =
      numel(Dims(x.dims.begin() + static_cast<std::ptrdiff_t>(b + k), x.dims.end()));
  const int64_t x_batch =
      numel(Dims(x.dims.begin() + static_cast<std::ptrdiff_t>(b), x.dims.end()));
  const Dims xs = strides_of(x.dims);
  const int64_t es = dtype_size(x.dtype);
  char* py = static_cast<char*>(y.data);
  const char* px = static_cast<const char*>(x.data);
  for (int64_t bt = 0; bt < batches; ++bt)
    for (int64_t t = 0; t < per_batch; ++t) {
      const size_t at = static_cast<size_t>((bt * per_batch + t)) * k;
      int64_t off = bt * x_batch;
      for (size_t d = 0; d < k; ++d)
        off += checked_index(idx[at + d], x.dims[b + d], c) * xs[b + d];
      std::memcpy(py + (bt * per_batch + t) * slice * es, px + off * es,
                  static_cast<size_t>(slice * es));
    }
}

void one_hot(OpCall& c) {
  const View &ix = c.need(0), &depth_v = c.need(1), &values = c.need(2);
  if (values.numel() != 2) c.fail("values must be [off_value, on_value]");
  const int64_t depth = static_cast<int64_t>(depth_v.scalar());
  if (depth < 1) c.fail("depth must be >= 1");
  const int64_t r = static_cast<int64_t>(ix.dims.size());
  const size_t a = static_cast<size_t>(c.axis(c.i("axis", -1), r + 1));
  Dims out = ix.dims;
  out.insert(out.begin() + static_cast<std::ptrdiff_t>(a), depth);
  View y = c.out(0, values.dtype, out);
  std::vector<int64_t> idx;
  if (ix.dtype == HP_F32 || ix.dtype == HP_F64) {
    for (int64_t i = 0; i < ix.numel(); ++i)
      idx.push_back(
          static_cast<int64_t>(ix.dtype == HP_F32 ? ix.as<float>()[i] : ix.as<double>()[i]));
  } else {
    idx = ix.ints();
  }
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < a; ++d) outer *= ix.dims[d];
  for (size_t d = a; d < ix.dims.size(); ++d) inner *= ix.dims[d];
  dispatch(values.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T off = values.as<T>()[0], on = values.as<T>()[1];
    T* py = y.as<T>();
    std::fill(py, py + y.numel(), off);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        int64_t v = idx[static_cast<size_t>(o * inner + in)];
        if (v < 0) v += depth;
        if (v >= 0 && v < depth) py[(o * depth + v) * inner + in] = on;  // out of range: all off
      }
  });
}

void is_inf_nan(OpCall& c, bool nan) {
  const View& x = c.need(0);
  View y = c.out(0, HP_BOOL, x.dims);
  const bool neg = c.i("detect_negative", 1) != 0, pos = c.i("detect_positive", 1) != 0;
  uint8_t* py = y.as<uint8_t>();
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      bool r = false;
      if constexpr (std::is_floating_point_v<T>) {
        r = nan ? std::isnan(px[i])
                : (std::isinf(px[i]) && ((px[i] > 0 && pos) || (px[i] < 0 && neg)));
      }
      py[i] = r ? 1 : 0;
    }
  });
}

bool data_idx_upd(const std::vector<int32_t>& d) {
  return d.size() == 3 && d[0] >= 0 && dtype_size(d[0]) > 0 && (d[1] == HP_I64 || d[1] == HP_I32) &&
         d[2] == d[0];
}

bool floats1(const std::vector<int32_t>& d) {
  return d.size() == 1 && (d[0] == HP_F32 || d[0] == HP_F64);
}

}  // namespace

void register_scatter_ops(OpTable& t) {
  t["ScatterND"] = {scatter_nd, data_idx_upd};
  t["ScatterElements"] = {scatter_elements, data_idx_upd};
  t["Scatter"] = t["ScatterElements"];  // its deprecated name (opsets 9 and 10)
  t["GatherND"] = {gather_nd, [](const std::vector<int32_t>& d) {
                     return d.size() == 2 && d[0] >= 0 && dtype_size(d[0]) > 0 && d[1] == HP_I64;
                   }};
  t["OneHot"] = {one_hot, [](const std::vector<int32_t>& d) {
                   return d.size() == 3 && is_num(d[0]) && d[2] >= 0;
                 }};
  t["IsInf"] = {[](OpCall& c) { is_inf_nan(c, false); }, floats1};
  t["IsNaN"] = {[](OpCall& c) { is_inf_nan(c, true); }, floats1};
}

}  // namespace hp_cpu
