// Where an initializer's external data lives, resolved once for every reader.
//
// ONNX stores large weights outside the model file: a tensor's external_data entries name a
// `location` (relative to the model's directory), an `offset` and a `length`. A model is untrusted
// input, so a location is data, not a path to follow: an absolute location or one that climbs out
// of the model's directory (`../../etc/passwd`, or a symlink whose target lies outside) would make
// `hp launch` copy that file into its outputs and `hp shard` into its partitions. As ONNX Runtime
// does, hp confines external data to the model's directory and refuses anything else with the path.
// Numbers must parse completely: "12abc" is an error naming the key, never 12.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "hp/core/expected.h"

namespace onnx {
class TensorProto;
}

namespace hp::model {

/// One tensor's external data, checked: `path` lies inside the model's directory.
struct ExternalData {
  std::string location;        ///< as written in the model
  std::filesystem::path path;  ///< model_dir / location, confined to model_dir
  std::int64_t offset = 0;
  std::int64_t length = -1;  ///< -1 when not given (then: the whole tensor)
};

/// Parses `t.external_data()` and resolves its location against `model_dir`. Errc::bad_input
/// naming the tensor and the key for a missing location, an offset or length that is not a whole
/// non-negative decimal number, or a location that is absolute or resolves (through `..` or
/// symlinks) outside `model_dir`.
Expected<ExternalData> resolve_external_data(const onnx::TensorProto& t,
                                             const std::filesystem::path& model_dir);

/// Just the confinement rule: `model_dir / location` when it stays inside `model_dir`.
Expected<std::filesystem::path> confine_external_path(const std::filesystem::path& model_dir,
                                                      const std::string& location);

}  // namespace hp::model
