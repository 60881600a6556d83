// Weight slicing for partitions: each rank stores exactly slice_of() of every weight, so the
// per-rank files concatenated by their layouts give back the original bytes.
#include "partition_weights.h"

#include <fmt/core.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "hp/core/checked.h"
#include "hp/model/external_data.h"
#include "hp/model/graph.h"

namespace hp::shard::detail {
namespace {

template <class Src>
std::string pack(const Src& values, int elem) {
  std::string out(values.size() * static_cast<std::size_t>(elem), '\0');
  for (int i = 0; i < values.size(); ++i) {
    auto v = values.Get(i);
    std::memcpy(out.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(elem), &v,
                static_cast<std::size_t>(elem));  // little-endian: the low bytes of the wider field
  }
  return out;
}

}  // namespace

Expected<std::optional<std::string>> tensor_bytes(const onnx::TensorProto& t,
                                                  const std::filesystem::path& model_dir) {
  using T = onnx::TensorProto;
  int elem = model::elem_size(t.data_type());
  if (elem <= 0)
    return Error(Errc::bad_input,
                 fmt::format("initializer '{}' has an element type hp cannot slice", t.name()));
  if (t.data_location() == T::EXTERNAL) {
    HP_ASSIGN_OR_RETURN(model::ExternalData ext, model::resolve_external_data(t, model_dir));
    const std::int64_t offset = ext.offset;
    std::int64_t length = ext.length;
    if (length < 0) {
      auto n = bounded_numel(t.dims());
      if (!n) return Error(Errc::bad_input, fmt::format("initializer '{}' is too large", t.name()));
      length = *n * elem;
    }
    const auto& path = ext.path;
    std::ifstream f(path, std::ios::binary);
    if (!f) return std::optional<std::string>{};
    // Checked against the file before allocating: a length of 2^60 is an error, not bad_alloc.
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec || offset > static_cast<std::int64_t>(size) ||
        length > static_cast<std::int64_t>(size) - offset)
      return Error(Errc::bad_input,
                   fmt::format("external data of '{}' is shorter than {} bytes", t.name(), length),
                   path.string());
    std::string data(static_cast<std::size_t>(length), '\0');
    f.seekg(offset);
    f.read(data.data(), length);
    if (f.gcount() != length)
      return Error(Errc::bad_input,
                   fmt::format("external data of '{}' is shorter than {} bytes", t.name(), length),
                   path.string());
    return std::optional<std::string>(std::move(data));
  }
  if (t.has_raw_data()) return std::optional<std::string>(t.raw_data());
  switch (t.data_type()) {
    case T::FLOAT: return std::optional<std::string>(pack(t.float_data(), 4));
    case T::DOUBLE: return std::optional<std::string>(pack(t.double_data(), 8));
    case T::INT64: return std::optional<std::string>(pack(t.int64_data(), 8));
    case T::UINT64: return std::optional<std::string>(pack(t.uint64_data(), 8));
    default: return std::optional<std::string>(pack(t.int32_data(), elem));
  }
}

std::string slice_bytes(const std::string& data, const std::vector<std::int64_t>& shape,
                        const std::vector<Range>& ranges, int elem) {
  std::size_t r = shape.size();
  if (r == 0) return data;
  std::vector<std::int64_t> stride(r, elem);
  for (std::size_t d = r - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  std::int64_t inner = ranges[r - 1].size() * elem;
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < r; ++d) rows *= ranges[d].size();
  std::string out;
  out.reserve(static_cast<std::size_t>(rows * inner));
  std::vector<std::int64_t> idx(r, 0);
  for (std::int64_t row = 0; row < rows; ++row) {
    std::int64_t off = ranges[r - 1].begin * elem;
    for (std::size_t d = 0; d + 1 < r; ++d) off += (ranges[d].begin + idx[d]) * stride[d];
    out.append(data, static_cast<std::size_t>(off), static_cast<std::size_t>(inner));
    for (std::size_t d = r - 1; d-- > 0;) {  // odometer over the outer dims
      if (++idx[d] < ranges[d].size()) break;
      idx[d] = 0;
    }
  }
  return out;
}

Status divide_elements(std::string& data, std::int32_t elem_type, std::int64_t n,
                       const std::string& name) {
  if (elem_type == onnx::TensorProto::FLOAT) {
    for (std::size_t i = 0; i + 4 <= data.size(); i += 4) {
      float v;
      std::memcpy(&v, data.data() + i, 4);
      v /= static_cast<float>(n);
      std::memcpy(data.data() + i, &v, 4);
    }
    return {};
  }
  if (elem_type == onnx::TensorProto::DOUBLE) {
    for (std::size_t i = 0; i + 8 <= data.size(); i += 8) {
      double v;
      std::memcpy(&v, data.data() + i, 8);
      v /= static_cast<double>(n);
      std::memcpy(data.data() + i, &v, 8);
    }
    return {};
  }
  return Error(Errc::bad_input,
               fmt::format("'{}' would be a partial sum but is not float or double", name), name);
}

}  // namespace hp::shard::detail
