// Indexing and tensor-creating ONNX ops on the cpu backend: Gather, GatherElements, TopK (index
// arithmetic over element sizes; negative indices count from the end), and Shape, Size, Constant,
// ConstantOfShape, Range, which create tensors from shapes, attributes or scalars. Shape arithmetic
// in exported graphs runs through these with int64 tensors, so they accept every integer type.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

bool idx_type(int32_t t) { return t == HP_I64 || t == HP_I32; }

int64_t fix_index(int64_t i, int64_t dim, const OpCall& c) {
  if (i < -dim || i >= dim)
    c.fail("index " + std::to_string(i) + " out of range for a dim of " + std::to_string(dim));
  return i < 0 ? i + dim : i;
}

void gather(OpCall& c) {
  const View &x = c.need(0), &ix = c.need(1);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  const size_t a = static_cast<size_t>(c.axis(c.i("axis", 0), r));
  std::vector<int64_t> idx = ix.ints();
  Dims out(x.dims.begin(), x.dims.begin() + static_cast<int64_t>(a));
  out.insert(out.end(), ix.dims.begin(), ix.dims.end());
  out.insert(out.end(), x.dims.begin() + static_cast<int64_t>(a) + 1, x.dims.end());
  View y = c.out(0, x.dtype, out);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < a; ++d) outer *= x.dims[d];
  for (size_t d = a + 1; d < x.dims.size(); ++d) inner *= x.dims[d];
  const int64_t es = dtype_size(x.dtype), chunk = inner * es, n = static_cast<int64_t>(idx.size());
  for (auto& i : idx) i = fix_index(i, x.dims[a], c);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < n; ++k)
      std::memcpy(
          static_cast<char*>(y.data) + (o * n + k) * chunk,
          static_cast<const char*>(x.data) + (o * x.dims[a] + idx[static_cast<size_t>(k)]) * chunk,
          static_cast<size_t>(chunk));
}

void gather_elements(OpCall& c) {
  const View &x = c.need(0), &ix = c.need(1);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  if (static_cast<int64_t>(ix.dims.size()) != r) c.fail("indices must have the data's rank");
  const size_t a = static_cast<size_t>(c.axis(c.i("axis", 0), r));
  std::vector<int64_t> idx = ix.ints();
  View y = c.out(0, x.dtype, ix.dims);
  const Dims xs = strides_of(x.dims);
  const int64_t es = dtype_size(x.dtype);
  Dims pos(ix.dims.size(), 0);
  for (size_t i = 0; i < idx.size(); ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < pos.size(); ++d)
      off += (d == a ? fix_index(idx[i], x.dims[d], c) : pos[d]) * xs[d];
    std::memcpy(static_cast<char*>(y.data) + static_cast<int64_t>(i) * es,
                static_cast<const char*>(x.data) + off * es, static_cast<size_t>(es));
    for (size_t d = pos.size(); d-- > 0;) {
      if (++pos[d] < ix.dims[d]) break;
      pos[d] = 0;
    }
  }
}

void topk(OpCall& c) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  const size_t a = static_cast<size_t>(c.axis(c.i("axis", -1), r));
  const int64_t k = c.opset() >= 10 ? static_cast<int64_t>(c.need(1).scalar()) : c.i("k", 1);
  const bool largest = c.i("largest", 1) != 0;
  if (k < 0 || k > x.dims[a]) c.fail("k " + std::to_string(k) + " out of range");
  Dims od = x.dims;
  od[a] = k;
  View vals = c.out(0, x.dtype, od);
  View inds = c.out(1, HP_I64, od);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < a; ++d) outer *= x.dims[d];
  for (size_t d = a + 1; d < x.dims.size(); ++d) inner *= x.dims[d];
  const int64_t n = x.dims[a];
  dispatch_num(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const T* px = x.as<T>() + o * n * inner + in;
        std::iota(order.begin(), order.end(), 0);
        // Ties keep the lower index first, as the ONNX reference does.
        std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
          return largest ? px[p * inner] > px[q * inner] : px[p * inner] < px[q * inner];
        });
        for (int64_t j = 0; j < k; ++j) {
          vals.as<T>()[(o * k + j) * inner + in] = px[order[static_cast<size_t>(j)] * inner];
          inds.as<int64_t>()[(o * k + j) * inner + in] = order[static_cast<size_t>(j)];
        }
      }
  });
}

void shape(OpCall& c) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  int64_t s = c.i("start", 0), e = c.i("end", r);
  if (s < 0) s += r;
  if (e < 0) e += r;
  s = std::clamp<int64_t>(s, 0, r);
  e = std::clamp<int64_t>(e, 0, r);
  View y = c.out(0, HP_I64, {std::max<int64_t>(e - s, 0)});
  for (int64_t k = s; k < e; ++k) y.as<int64_t>()[k - s] = x.dims[static_cast<size_t>(k)];
}

void constant(OpCall& c) {
  if (const hp_tensor_desc* t = c.tensor("value")) {
    Dims d(t->dims, t->dims + t->rank);
    View y = c.out(0, t->dtype, d);
    if (y.numel() > 0)
      std::memcpy(y.data, t->data, static_cast<size_t>(y.numel() * dtype_size(t->dtype)));
  } else if (c.has("value_float")) {
    View y = c.out(0, HP_F32, {});
    *y.as<float>() = static_cast<float>(c.f("value_float", 0));
  } else if (c.has("value_int")) {
    View y = c.out(0, HP_I64, {});
    *y.as<int64_t>() = c.i("value_int", 0);
  } else if (c.has("value_floats")) {
    std::vector<double> v = c.floats("value_floats");
    View y = c.out(0, HP_F32, {static_cast<int64_t>(v.size())});
    for (size_t k = 0; k < v.size(); ++k) y.as<float>()[k] = static_cast<float>(v[k]);
  } else if (c.has("value_ints")) {
    std::vector<int64_t> v = c.ints("value_ints");
    View y = c.out(0, HP_I64, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), y.as<int64_t>());
  } else {
    throw OpError("constant form not supported (sparse or string value)", HP_UNSUPPORTED);
  }
}

void constant_of_shape(OpCall& c) {
  std::vector<int64_t> shape = c.need(0).ints();
  const hp_tensor_desc* v = c.tensor("value");
  const int dt = v ? v->dtype : HP_F32;
  View y = c.out(0, dt, shape);
  const int es = dtype_size(dt);
  if (es == 0) throw OpError("value dtype not supported", HP_UNSUPPORTED);
  char zero[8] = {0};
  const void* src = v && v->data ? v->data : zero;
  for (int64_t i = 0, n = y.numel(); i < n; ++i)
    std::memcpy(static_cast<char*>(y.data) + i * es, src, static_cast<size_t>(es));
}

void range(OpCall& c) {
  const View& s = c.need(0);
  dispatch_num(s.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T start = static_cast<T>(s.scalar()), limit = static_cast<T>(c.need(1).scalar()),
            delta = static_cast<T>(c.need(2).scalar());
    if (delta == T(0)) c.fail("range delta is 0");
    const double count = std::ceil((static_cast<double>(limit) - static_cast<double>(start)) /
                                   static_cast<double>(delta));
    const int64_t n = std::max<int64_t>(static_cast<int64_t>(count), 0);
    View y = c.out(0, s.dtype, {n});
    for (int64_t i = 0; i < n; ++i)
      y.as<T>()[i] = static_cast<T>(start + static_cast<T>(i) * delta);
  });
}

}  // namespace

void register_index_ops(OpTable& t) {
  auto data_idx = [](const std::vector<int32_t>& d) {
    return d.size() == 2 && dtype_size(d[0]) > 0 && idx_type(d[1]);
  };
  t["Gather"] = {gather, data_idx};
  t["GatherElements"] = {gather_elements, data_idx};
  t["TopK"] = {topk, [](const std::vector<int32_t>& d) { return !d.empty() && is_num(d[0]); }};
  t["Shape"] = {shape, [](const std::vector<int32_t>& d) { return d.size() == 1 && d[0] >= 0; }};
  t["Size"] = {[](OpCall& c) {
                 View y = c.out(0, HP_I64, {});
                 *y.as<int64_t>() = c.need(0).numel();
               },
               [](const std::vector<int32_t>& d) { return d.size() == 1 && d[0] >= 0; }};
  t["Constant"] = {constant, [](const std::vector<int32_t>& d) { return d.empty(); }};
  t["ConstantOfShape"] = {constant_of_shape, [](const std::vector<int32_t>& d) {
                            return d.size() == 1 && d[0] == HP_I64;
                          }};
  t["Range"] = {range, [](const std::vector<int32_t>& d) { return d.size() == 3 && is_num(d[0]); }};
}

}  // namespace hp_cpu
