// Private: reading an initializer's bytes (inline or external data) and cutting a rank's slice of
// it.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/shard/layout.h"

namespace hp::shard::detail {

/// Little-endian element bytes of `t`; nullopt when its external data file is absent (shapes only).
/// Errors (bad_input) for a short or unreadable file.
Expected<std::optional<std::string>> tensor_bytes(const onnx::TensorProto& t,
                                                  const std::filesystem::path& model_dir);

/// The sub-block `ranges` of a row-major tensor of `shape` with `elem`-byte elements.
std::string slice_bytes(const std::string& data, const std::vector<std::int64_t>& shape,
                        const std::vector<Range>& ranges, int elem);

/// Divides every element by `n` (float and double; the local addend of a Partial(sum) weight).
Status divide_elements(std::string& data, std::int32_t elem_type, std::int64_t n,
                       const std::string& name);

}  // namespace hp::shard::detail
