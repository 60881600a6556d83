// Private: the bytes of an initializer as the model files save_model writes hold them (raw_data or
// ONNX external data), shared by save_model (copying weights it does not replace) and
// load_checkpoint (reading the weights back).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "hp/core/expected.h"
#include "hp/exec/tensor.h"

namespace hp::train {

/// True when the initializer's data lives in an external file.
inline bool is_external(const onnx::TensorProto& t) {
  return t.data_location() == onnx::TensorProto::EXTERNAL;
}

/// The little-endian data bytes of `t`: raw_data, or the external data (`location` resolved
/// against `base_dir`). Errc::bad_input naming `where` when the data is held in typed fields
/// (float_data, ...), the external file is missing or short, or the size does not match the dims.
Expected<std::string> initializer_bytes(const onnx::TensorProto& t,
                                        const std::filesystem::path& base_dir,
                                        const std::string& where);

/// The HostTensor of `t` (dtype, dims and bytes as initializer_bytes reads them).
Expected<exec::HostTensor> initializer_tensor(const onnx::TensorProto& t,
                                              const std::filesystem::path& base_dir,
                                              const std::string& where);

}  // namespace hp::train
