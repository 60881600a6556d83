// The operators hp's executor runs (the table is in src/ops.cpp). Planning accepts any op; the
// summary lists those outside this table so a user learns early that a model cannot run yet.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace hp::model {

/// True when the executor supports `op_type` of `domain` ("" or "ai.onnx" = the standard domain).
bool is_supported_op(std::string_view domain, std::string_view op_type);

/// The supported ai.onnx op types, sorted.
std::vector<std::string> supported_ops();

}  // namespace hp::model
