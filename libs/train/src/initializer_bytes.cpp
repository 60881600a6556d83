#include "initializer_bytes.h"

#include <fmt/core.h>

#include <fstream>

#include "hp/model/external_data.h"

namespace hp::train {

namespace {

Expected<std::int64_t> expected_bytes(const onnx::TensorProto& t, const std::string& where) {
  const int dtype = exec::dtype_from_onnx(t.data_type());
  if (dtype < 0 || exec::dtype_size(dtype) == 0)
    return Error(Errc::bad_input,
                 fmt::format("initializer '{}' has onnx element type {}, which hp cannot hold",
                             t.name(), t.data_type()),
                 where);
  std::int64_t n = 1;
  for (std::int64_t d : t.dims()) {
    if (d < 0 || d > (std::int64_t{1} << 40))
      return Error(Errc::bad_input, fmt::format("initializer '{}' has a bad dim {}", t.name(), d),
                   where);
    n *= d;
    if (n > (std::int64_t{1} << 40))
      return Error(Errc::bad_input, fmt::format("initializer '{}' is too large", t.name()), where);
  }
  return n * exec::dtype_size(dtype);
}

Expected<std::string> read_external(const onnx::TensorProto& t, const std::filesystem::path& base,
                                    std::int64_t want, const std::string& where) {
  auto ext = model::resolve_external_data(t, base);
  if (!ext) return Error(Errc::bad_input, ext.error().message(), where, ext.error().what.hint);
  const std::string& location = ext->location;
  const std::int64_t offset = ext->offset, length = ext->length;
  if (length >= 0 && length != want)
    return Error(
        Errc::bad_input,
        fmt::format("initializer '{}': external offset {} length {}, its dims need {} bytes",
                    t.name(), offset, length, want),
        where);
  const std::filesystem::path& file = ext->path;
  std::ifstream in(file, std::ios::binary);
  if (!in)
    return Error(
        Errc::bad_input,
        fmt::format("external data file '{}' of initializer '{}' is missing", location, t.name()),
        where);
  std::string bytes(static_cast<std::size_t>(want), '\0');
  in.seekg(offset);
  in.read(bytes.data(), want);
  if (!in || in.gcount() != want)
    return Error(Errc::bad_input,
                 fmt::format("external data file '{}' is too short for initializer '{}'", location,
                             t.name()),
                 where);
  return bytes;
}

}  // namespace

Expected<std::string> initializer_bytes(const onnx::TensorProto& t,
                                        const std::filesystem::path& base_dir,
                                        const std::string& where) {
  HP_ASSIGN_OR_RETURN(const std::int64_t want, expected_bytes(t, where));
  if (is_external(t)) return read_external(t, base_dir, want, where);
  if (!t.has_raw_data() && want > 0)
    return Error(
        Errc::bad_input,
        fmt::format("initializer '{}' holds its values in typed fields, not raw_data", t.name()),
        where);
  if (static_cast<std::int64_t>(t.raw_data().size()) != want)
    return Error(Errc::bad_input,
                 fmt::format("initializer '{}' has {} data bytes, its dims need {}", t.name(),
                             t.raw_data().size(), want),
                 where);
  return t.raw_data();
}

Expected<exec::HostTensor> initializer_tensor(const onnx::TensorProto& t,
                                              const std::filesystem::path& base_dir,
                                              const std::string& where) {
  HP_ASSIGN_OR_RETURN(std::string bytes, initializer_bytes(t, base_dir, where));
  exec::HostTensor h;
  h.name = t.name();
  h.dtype = exec::dtype_from_onnx(t.data_type());
  h.dims.assign(t.dims().begin(), t.dims().end());
  h.data.assign(bytes.begin(), bytes.end());
  return h;
}

}  // namespace hp::train
