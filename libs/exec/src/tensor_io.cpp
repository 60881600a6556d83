// TensorProto decoding and encoding, and the input_K.pb / output_K.pb directory layout.
//
// Decoding accepts every way ONNX stores tensor data: raw_data (little-endian bytes), the typed
// repeated fields (float_data, double_data, int64_data, uint64_data for uint32/uint64, and
// int32_data which also carries bool, int8, uint8, int16, uint16 values and the bits of
// float16/bfloat16), and external data (a file next to the model, with offset and length). Each
// path checks that the byte count matches the dims, so a truncated or inconsistent file is a
// bad_input error that names it, never a read past the end. Encoding always writes raw_data.
#include <onnx/onnx-data_pb.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include <fmt/core.h>

#include "hp/core/dtype.h"
#include "hp/core/fs.h"
#include "hp/model/external_data.h"
#include "hp/model/model.h"
#include "hp/plugin/backend.h"
#include "proto_tensor.h"

namespace hp::exec {

std::int64_t HostTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= d;
  return n;
}

// The executor holds every type of the plugin ABI but f8 (which ONNX splits into four formats):
// f32, f16, bf16, f64, the signed and unsigned integers and bool; names, sizes and ONNX codes come
// from the one dtype table (hp/core/dtype.h), this file only decides which of its types the
// executor runs.
namespace {
using hp::DType;
bool runnable(DType t) {
  switch (t) {
    case DType::f32:
    case DType::f16:
    case DType::bf16:
    case DType::f64:
    case DType::i8:
    case DType::i16:
    case DType::i32:
    case DType::i64:
    case DType::boolean:
    case DType::u8:
    case DType::u16:
    case DType::u32:
    case DType::u64: return true;
    default: return false;
  }
}
}  // namespace

int dtype_size(int dtype) {
  const auto t = plugin::to_dtype(dtype);
  return t && runnable(*t) ? hp::dtype_size(*t) : 0;
}

int dtype_from_onnx(std::int32_t onnx_type) {
  const auto t = hp::dtype_from_onnx(onnx_type);
  return t && runnable(*t) ? plugin::to_hp_dtype(*t) : -1;
}

std::int32_t dtype_to_onnx(int dtype) {
  const auto t = plugin::to_dtype(dtype);
  return t && runnable(*t) ? hp::dtype_to_onnx(*t) : onnx::TensorProto::UNDEFINED;
}

std::string dtype_label(int dtype) { return plugin::dtype_name(dtype); }

std::string dims_label(const std::vector<std::int64_t>& dims) {
  std::string r = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) r += (i ? "," : "") + std::to_string(dims[i]);
  return r + "]";
}

namespace {

template <class Src, class Dst>
void copy_field(const Src& field, HostTensor& t) {
  Dst* out = t.as<Dst>();
  for (int i = 0; i < field.size(); ++i) out[i] = static_cast<Dst>(field.Get(i));
}

Status read_external(const onnx::TensorProto& p, const std::filesystem::path& base,
                     const std::string& where, HostTensor& t) {
  // Parsed strictly and confined to `base` (hp/model/external_data.h).
  auto ext = model::resolve_external_data(p, base);
  if (!ext) return Error(Errc::bad_input, ext.error().message(), where, ext.error().what.hint);
  const std::string& location = ext->location;
  const std::int64_t offset = ext->offset, length = ext->length;
  const std::filesystem::path& file = ext->path;
  std::ifstream in(file, std::ios::binary);
  if (!in)
    return Error(
        Errc::bad_input,
        fmt::format("external data file '{}' of tensor '{}' is missing", location, p.name()), where,
        "keep the weights file next to the model");
  const auto want = static_cast<std::int64_t>(t.data.size());
  if (length >= 0 && length != want)
    return Error(Errc::bad_input,
                 fmt::format("tensor '{}': external length {} does not match its {} bytes",
                             p.name(), length, want),
                 where);
  in.seekg(offset);
  in.read(reinterpret_cast<char*>(t.data.data()), want);
  if (in.gcount() != want)
    return Error(
        Errc::bad_input,
        fmt::format("external data file '{}' is too short for tensor '{}'", location, p.name()),
        where);
  return {};
}

}  // namespace

Expected<HostTensor> tensor_from_proto(const onnx::TensorProto& p,
                                       const std::filesystem::path& base_dir,
                                       const std::string& where) {
  HostTensor t;
  t.name = p.name();
  t.dtype = dtype_from_onnx(p.data_type());
  if (t.dtype < 0)
    return Error(Errc::bad_input,
                 fmt::format("tensor '{}' has onnx element type {}, which hp cannot run", p.name(),
                             p.data_type()),
                 where);
  for (std::int64_t d : p.dims()) {
    if (d < 0 || d > (std::int64_t{1} << 40))
      return Error(Errc::bad_input, fmt::format("tensor '{}' has a bad dim {}", p.name(), d),
                   where);
    t.dims.push_back(d);
  }
  const std::int64_t n = t.numel();
  const std::int64_t bytes = n * dtype_size(t.dtype);
  if (bytes > (std::int64_t{1} << 40))
    return Error(Errc::bad_input, fmt::format("tensor '{}' is too large", p.name()), where);
  t.data.assign(static_cast<std::size_t>(bytes), 0);
  if (p.data_location() == onnx::TensorProto::EXTERNAL) {
    HP_TRY(read_external(p, base_dir, where, t));
    return t;
  }
  auto mismatch = [&](std::int64_t got) {
    return Error(Errc::bad_input,
                 fmt::format("tensor '{}' holds {} values, its dims {} need {}", p.name(), got,
                             dims_label(t.dims), n),
                 where);
  };
  if (p.has_raw_data()) {
    if (static_cast<std::int64_t>(p.raw_data().size()) != bytes)
      return Error(Errc::bad_input,
                   fmt::format("tensor '{}' has {} data bytes, its dims {} need {}", p.name(),
                               p.raw_data().size(), dims_label(t.dims), bytes),
                   where);
    if (bytes) std::memcpy(t.data.data(), p.raw_data().data(), static_cast<std::size_t>(bytes));
    return t;
  }
  switch (t.dtype) {
    case HP_F32:
      if (p.float_data_size() != n) return mismatch(p.float_data_size());
      copy_field<decltype(p.float_data()), float>(p.float_data(), t);
      break;
    case HP_F64:
      if (p.double_data_size() != n) return mismatch(p.double_data_size());
      copy_field<decltype(p.double_data()), double>(p.double_data(), t);
      break;
    case HP_I64:
      if (p.int64_data_size() != n) return mismatch(p.int64_data_size());
      copy_field<decltype(p.int64_data()), std::int64_t>(p.int64_data(), t);
      break;
    case HP_I32:
      if (p.int32_data_size() != n) return mismatch(p.int32_data_size());
      copy_field<decltype(p.int32_data()), std::int32_t>(p.int32_data(), t);
      break;
    case HP_U32:
      if (p.uint64_data_size() != n) return mismatch(p.uint64_data_size());
      copy_field<decltype(p.uint64_data()), std::uint32_t>(p.uint64_data(), t);
      break;
    case HP_U64:
      if (p.uint64_data_size() != n) return mismatch(p.uint64_data_size());
      copy_field<decltype(p.uint64_data()), std::uint64_t>(p.uint64_data(), t);
      break;
    case HP_I16:
      if (p.int32_data_size() != n) return mismatch(p.int32_data_size());
      copy_field<decltype(p.int32_data()), std::int16_t>(p.int32_data(), t);
      break;
    case HP_F16:  // int32_data holds the 16-bit patterns
    case HP_BF16:
    case HP_U16:
      if (p.int32_data_size() != n) return mismatch(p.int32_data_size());
      copy_field<decltype(p.int32_data()), std::uint16_t>(p.int32_data(), t);
      break;
    case HP_I8:
      if (p.int32_data_size() != n) return mismatch(p.int32_data_size());
      copy_field<decltype(p.int32_data()), std::int8_t>(p.int32_data(), t);
      break;
    default:  // bool, u8
      if (p.int32_data_size() != n) return mismatch(p.int32_data_size());
      copy_field<decltype(p.int32_data()), std::uint8_t>(p.int32_data(), t);
  }
  return t;
}

void tensor_to_proto(const HostTensor& t, onnx::TensorProto& p) {
  p.set_name(t.name);
  p.set_data_type(dtype_to_onnx(t.dtype));
  for (std::int64_t d : t.dims) p.add_dims(d);
  p.set_raw_data(std::string(reinterpret_cast<const char*>(t.data.data()), t.data.size()));
}

Expected<HostTensor> read_tensor_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return Error(Errc::bad_input, "input file is missing", path.string(),
                 "each graph input needs an input_K.pb file, K in graph input order");
  HP_ASSIGN_OR_RETURN(auto bytes, read_file(path));
  onnx::TensorProto p;
  if (!p.ParseFromString(bytes))
    return Error(Errc::bad_input, "not a serialized onnx TensorProto (truncated or corrupt)",
                 path.string());
  return tensor_from_proto(p, path.parent_path(), path.string());
}

Expected<HostValue> read_value_file(const std::filesystem::path& path, bool sequence) {
  HostValue v;
  if (!sequence) {
    HP_ASSIGN_OR_RETURN(v.tensor, read_tensor_file(path));
    return v;
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return Error(Errc::bad_input, "input file is missing", path.string(),
                 "each graph input needs an input_K.pb file, K in graph input order");
  HP_ASSIGN_OR_RETURN(auto bytes, read_file(path));
  onnx::SequenceProto p;
  if (!p.ParseFromString(bytes))
    return Error(Errc::bad_input, "not a serialized onnx SequenceProto (truncated or corrupt)",
                 path.string());
  if (p.elem_type() != onnx::SequenceProto::TENSOR && p.tensor_values_size() == 0 &&
      (p.sequence_values_size() || p.map_values_size() || p.optional_values_size()))
    return Error(Errc::bad_input, "a sequence of non-tensors (hp holds sequences of tensors only)",
                 path.string());
  v.is_sequence = true;
  for (const auto& t : p.tensor_values()) {
    HP_ASSIGN_OR_RETURN(auto h, tensor_from_proto(t, path.parent_path(), path.string()));
    v.elem_dtype = h.dtype;
    v.items.push_back(std::move(h));
  }
  return v;
}

Status write_tensor_file(const std::filesystem::path& path, const HostTensor& t) {
  onnx::TensorProto p;
  tensor_to_proto(t, p);
  std::string bytes;
  if (!p.SerializeToString(&bytes))
    return Error(Errc::runtime, "cannot serialize tensor", path.string());
  return write_file_atomic(path, bytes);
}

Expected<std::vector<HostTensor>> read_tensor_dir(const std::filesystem::path& dir,
                                                  const std::string& prefix) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return Error(Errc::bad_input, "not a directory", dir.string(),
                 fmt::format("give a folder of {}_K.pb files", prefix));
  std::vector<HostTensor> out;
  for (int k = 0;; ++k) {
    const auto file = dir / fmt::format("{}_{}.pb", prefix, k);
    if (!std::filesystem::exists(file, ec)) break;
    HP_ASSIGN_OR_RETURN(auto t, read_tensor_file(file));
    out.push_back(std::move(t));
  }
  return out;
}

Status write_tensor_dir(const std::filesystem::path& dir, const std::vector<HostTensor>& tensors,
                        const std::string& prefix, const OutputDirOptions& o) {
  OutputDirOptions opts = o;
  if (opts.writer.empty()) opts.writer = "hp";
  // Tensor folders written before the marker existed hold only <prefix>_K.pb files.
  opts.legacy.push_back(prefix + "_*.pb");
  return replace_output_dir(
      dir,
      [&](const std::filesystem::path& tmp) -> Status {
        for (std::size_t k = 0; k < tensors.size(); ++k)
          HP_TRY(write_tensor_file(tmp / fmt::format("{}_{}.pb", prefix, k), tensors[k]));
        return {};
      },
      opts);
}

Expected<std::vector<HostTensor>> read_initializers(const std::filesystem::path& model) {
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  HP_ASSIGN_OR_RETURN(auto m, model::load_model(model, lo));
  std::vector<HostTensor> out;
  for (const auto& init : m.proto->graph().initializer()) {
    HP_ASSIGN_OR_RETURN(auto t, tensor_from_proto(init, model.parent_path(), model.string()));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace hp::exec
