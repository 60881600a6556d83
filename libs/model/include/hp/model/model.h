// Loading an ONNX model file. Planning needs only the graph and the initializers' dims, so weights
// in external data files are never read here: their files are only checked for existence.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/core/expected.h"

namespace onnx {
class GraphProto;
class ModelProto;
class NodeProto;
}  // namespace onnx

namespace hp::model {

/// What a load must guarantee about the weights.
enum class LoadMode {
  shapes_only,   ///< planning: external data files may be absent (they are listed, not read)
  require_data,  ///< running: every external data file must exist and be long enough
};

struct LoadOptions {
  LoadMode mode = LoadMode::shapes_only;
};

/// One external data file referenced by initializers (`location` relative to the model's dir).
struct ExternalFile {
  std::string location;        ///< as written in the model
  std::filesystem::path path;  ///< resolved against the model's directory
  bool present = false;
  std::uint64_t bytes_needed = 0;  ///< max(offset + length) over the initializers using it
  std::int64_t initializers = 0;   ///< how many initializers live in it
};

/// A parsed and validated ONNX model. The proto is shared and immutable once loaded.
struct Model {
  std::filesystem::path path;
  std::shared_ptr<const onnx::ModelProto> proto;
  std::int64_t ir_version = 0;
  std::map<std::string, std::int64_t> opsets;  ///< domain ("" = ai.onnx) -> version
  std::vector<ExternalFile> external_files;
  /// Locations of external data files that do not exist (empty unless weights are absent).
  std::vector<std::string> missing_external_data;
};

/// Reads, parses and validates `path`. Malformed files (truncated, random bytes, empty, no graph,
/// undefined tensors, inconsistent initializer sizes) give Errc::bad_input with `where` = the path.
Expected<Model> load_model(const std::filesystem::path& path, const LoadOptions& options = {});
/// The same checks on a serialized model held in memory (a partition hp shard built in
/// process); `path` names it in errors, and external data is looked up beside it.
Expected<Model> parse_model(const std::string& bytes, const std::filesystem::path& path,
                            const LoadOptions& options = {});

}  // namespace hp::model
