// Private helpers over the ONNX protobuf types, shared by the model library's sources.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/graph.h"

namespace hp::model {

/// Product of an initializer's dims; nullopt when a dim is negative or the product overflows.
std::optional<std::int64_t> checked_numel(const onnx::TensorProto& t);

bool is_float_type(std::int32_t elem_type);

/// double -> int64, saturating (INT64_MAX, a common "to the end" Slice bound, is not exact in a
/// double).
std::int64_t saturate_i64(double v);

/// Attribute lookups with defaults.
std::int64_t attr_int(const onnx::NodeProto& n, const std::string& name, std::int64_t dflt);
std::string attr_string(const onnx::NodeProto& n, const std::string& name, const std::string& dflt);
std::vector<std::int64_t> attr_ints(const onnx::NodeProto& n, const std::string& name);
const onnx::TensorProto* attr_tensor(const onnx::NodeProto& n, const std::string& name);

/// Values of a small integer or float tensor stored inline (not external), as doubles; nullopt when
/// the tensor is external, too large (> max_elems) or of an unsupported type.
std::optional<std::vector<double>> read_small_tensor(const onnx::TensorProto& t,
                                                     std::int64_t max_elems);

}  // namespace hp::model
