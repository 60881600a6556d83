// The arithmetic under the shape-value interpreter (values.cpp): small tensors' sizes, numpy
// broadcasting of two values, casts, and 1-D slices. Only values of at most kMaxElems elements are
// computed (anything larger has no value, which is always safe).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "shape_infer.h"

namespace hp::model::shape_values {

constexpr std::int64_t kMaxElems = 4096;

std::int64_t numel_of(const std::vector<std::int64_t>& shape);
/// Every dim in [0, kMaxElems] and the product too (so numel_of cannot overflow).
bool small_shape(const std::vector<std::int64_t>& shape);
bool is_int_type(std::int32_t t);
/// `v` as an element of ONNX type `to` holds it (truncated for integers, rounded to float).
double cast_to(double v, std::int32_t to);
/// Numpy broadcasting of two shapes (the result's), or false when incompatible.
bool broadcast_shape(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b,
                     std::vector<std::int64_t>& out);
/// The flat index into an operand of `shape` broadcast to `out` for the output's flat index `i`.
std::size_t bcast_index(const std::vector<std::int64_t>& shape,
                        const std::vector<std::int64_t>& out, std::int64_t i);
/// f applied elementwise to broadcast `a` and `b`, cast to `out_type`; nullopt when either is not
/// small or does not hold as many values as its shape says.
std::optional<Value> binary(const Value& a, const Value& b, std::int32_t out_type,
                            const std::function<double(double, double)>& f);
/// A negative index counted from the end of `n`.
std::int64_t wrap(std::int64_t i, std::int64_t n);
/// 1-D Slice (the only kind shape arithmetic uses).
std::optional<Value> slice_1d(const Value& x, std::int64_t start, std::int64_t end,
                              std::int64_t step);

}  // namespace hp::model::shape_values
