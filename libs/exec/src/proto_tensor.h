// Private: TensorProto <-> HostTensor, shared by the .pb file reader and the initializer loader.
#pragma once

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <string>

#include "hp/exec/tensor.h"

namespace hp::exec {

/// Converts a TensorProto. Data may be inline (raw_data or the typed repeated fields) or external
/// (data_location EXTERNAL, resolved against `base_dir`). `where` names the source in errors.
Expected<HostTensor> tensor_from_proto(const onnx::TensorProto& p,
                                       const std::filesystem::path& base_dir,
                                       const std::string& where);

/// Fills `p` (name, dims, data_type, raw_data) from `t`.
void tensor_to_proto(const HostTensor& t, onnx::TensorProto& p);

}  // namespace hp::exec
