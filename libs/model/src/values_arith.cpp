// The arithmetic under the shape-value interpreter (values_arith.h).
#include "values_arith.h"

#include <algorithm>
#include <cmath>

namespace hp::model::shape_values {

using T = onnx::TensorProto;

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// Every dim in [0, kMaxElems] and the product too (so numel_of cannot overflow).
bool small_shape(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d < 0 || d > kMaxElems) return false;
    n *= d;
    if (n > kMaxElems) return false;
  }
  return true;
}

bool is_int_type(std::int32_t t) { return !is_float_type(t); }

double cast_to(double v, std::int32_t to) {
  if (to == T::BOOL) return v != 0 ? 1 : 0;
  if (is_int_type(to)) return std::trunc(v);
  if (to == T::FLOAT || to == T::FLOAT16 || to == T::BFLOAT16) return static_cast<float>(v);
  return v;
}

// Numpy broadcasting of two values (result shape), or false when incompatible.
bool broadcast_shape(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b,
                     std::vector<std::int64_t>& out) {
  std::size_t r = std::max(a.size(), b.size());
  out.assign(r, 1);
  for (std::size_t i = 0; i < r; ++i) {
    std::int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    std::int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    out[i] = da == 1 ? db : da;  // not max: 0 broadcast with 1 is 0 (an empty tensor stays empty)
  }
  return true;
}

// Index into a broadcast operand for flat output index `i`.
std::size_t bcast_index(const std::vector<std::int64_t>& shape,
                        const std::vector<std::int64_t>& out, std::int64_t i) {
  std::size_t idx = 0, stride = 1;
  std::size_t off = out.size() - shape.size();
  for (std::size_t k = out.size(); k-- > 0;) {
    std::int64_t coord = i % out[k];
    i /= out[k];
    if (k >= off) {
      std::int64_t d = shape[k - off];
      idx += static_cast<std::size_t>(d == 1 ? 0 : coord) * stride;
      stride *= static_cast<std::size_t>(d);
    }
  }
  return idx;
}

std::optional<Value> binary(const Value& a, const Value& b, std::int32_t out_type,
                            const std::function<double(double, double)>& f) {
  Value r;
  // Operands are indexed by their shapes: they must be small and hold exactly that many values.
  for (const Value* v : {&a, &b})
    if (!small_shape(v->shape) || numel_of(v->shape) != static_cast<std::int64_t>(v->data.size()))
      return std::nullopt;
  if (!broadcast_shape(a.shape, b.shape, r.shape) || !small_shape(r.shape)) return std::nullopt;
  r.elem_type = out_type;
  std::int64_t n = numel_of(r.shape);
  r.data.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    r.data[static_cast<std::size_t>(i)] = cast_to(
        f(a.data[bcast_index(a.shape, r.shape, i)], b.data[bcast_index(b.shape, r.shape, i)]),
        out_type);
  return r;
}

std::int64_t wrap(std::int64_t i, std::int64_t n) { return i < 0 ? i + n : i; }

// 1-D Slice (the only kind shape arithmetic uses).
std::optional<Value> slice_1d(const Value& x, std::int64_t start, std::int64_t end,
                              std::int64_t step) {
  if (x.shape.size() != 1 || step == 0 || step > kMaxElems || step < -kMaxElems)
    return std::nullopt;
  std::int64_t n = x.shape[0];
  auto clamp = [&](std::int64_t v, bool is_end) {
    v = v < 0 ? v + n : v;
    if (step > 0) return std::clamp<std::int64_t>(v, 0, n);
    return std::clamp<std::int64_t>(v, -1, n - 1) + (is_end ? 0 : 0);
  };
  std::int64_t s = clamp(start, false), e = clamp(end, true);
  Value r;
  r.elem_type = x.elem_type;
  for (std::int64_t i = s; step > 0 ? i < e : i > e; i += step)
    r.data.push_back(x.data[static_cast<std::size_t>(i)]);
  r.shape = {static_cast<std::int64_t>(r.data.size())};
  return r;
}

}  // namespace hp::model::shape_values
