// Small helpers over ONNX protobuf messages: element sizes, dims, attributes, inline tensor data.
#include "onnx_util.h"

#include <fmt/core.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "hp/core/dtype.h"

namespace hp::model {

int elem_size(std::int32_t t) {
  const auto d = dtype_from_onnx(t);
  return d ? dtype_size(*d) : 0;
}

bool is_float_type(std::int32_t t) {
  const auto d = dtype_from_onnx(t);
  return d && dtype_is_float(*d);
}

std::int64_t saturate_i64(double v) {
  if (std::isnan(v)) return 0;
  if (v >= 9.2e18) return std::numeric_limits<std::int64_t>::max();
  if (v <= -9.2e18) return std::numeric_limits<std::int64_t>::min();
  return static_cast<std::int64_t>(v);
}

std::optional<std::int64_t> checked_numel(const onnx::TensorProto& t) {
  std::int64_t n = 1;
  for (auto d : t.dims()) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / 16 / d) return std::nullopt;
    n *= d;
  }
  return n;
}

std::int64_t attr_int(const onnx::NodeProto& n, const std::string& name, std::int64_t dflt) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return dflt;
}

std::string attr_string(const onnx::NodeProto& n, const std::string& name,
                        const std::string& dflt) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.s();
  return dflt;
}

std::vector<std::int64_t> attr_ints(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return {a.ints().begin(), a.ints().end()};
  return {};
}

const onnx::TensorProto* attr_tensor(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name && a.has_t()) return &a.t();
  return nullptr;
}

namespace {

template <class T>
void append_raw(const std::string& raw, std::vector<double>& out) {
  std::size_t n = raw.size() / sizeof(T);
  for (std::size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
    out.push_back(static_cast<double>(v));
  }
}

}  // namespace

std::optional<std::vector<double>> read_small_tensor(const onnx::TensorProto& t,
                                                     std::int64_t max_elems) {
  using T = onnx::TensorProto;
  if (t.data_location() == T::EXTERNAL) return std::nullopt;
  auto numel = checked_numel(t);
  if (!numel || *numel > max_elems) return std::nullopt;
  std::vector<double> out;
  const std::string& raw = t.raw_data();
  switch (t.data_type()) {
    case T::INT64:
      if (!raw.empty())
        append_raw<std::int64_t>(raw, out);
      else
        for (auto v : t.int64_data()) out.push_back(static_cast<double>(v));
      break;
    case T::INT32:
      if (!raw.empty())
        append_raw<std::int32_t>(raw, out);
      else
        for (auto v : t.int32_data()) out.push_back(v);
      break;
    case T::BOOL:
    case T::UINT8:
      if (!raw.empty())
        append_raw<std::uint8_t>(raw, out);
      else
        for (auto v : t.int32_data()) out.push_back(v);
      break;
    case T::INT8:
      if (!raw.empty())
        append_raw<std::int8_t>(raw, out);
      else
        for (auto v : t.int32_data()) out.push_back(v);
      break;
    case T::FLOAT:
      if (!raw.empty())
        append_raw<float>(raw, out);
      else
        for (auto v : t.float_data()) out.push_back(v);
      break;
    case T::DOUBLE:
      if (!raw.empty())
        append_raw<double>(raw, out);
      else
        for (auto v : t.double_data()) out.push_back(v);
      break;
    default: return std::nullopt;
  }
  if (static_cast<std::int64_t>(out.size()) != *numel) return std::nullopt;
  return out;
}

}  // namespace hp::model
