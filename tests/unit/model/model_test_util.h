// Helpers shared by the model unit tests: test-model paths and their expected-value sidecars.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "hp/model/graph.h"

namespace hp::model::test {

inline std::filesystem::path models_dir() {
  return std::filesystem::path(HP_SOURCE_DIR) / "tests/data/models";
}
inline std::filesystem::path model_path(const std::string& name) {
  return models_dir() / (name + ".onnx");
}

/// The sidecar <name>.json written by gen_models.py.
inline nlohmann::json sidecar(const std::string& name) {
  std::ifstream in(models_dir() / (name + ".json"));
  return nlohmann::json::parse(in);
}

inline DimBindings sidecar_dims(const nlohmann::json& j) {
  DimBindings d;
  for (const auto& [k, v] : j["dims"].items()) d[k] = v.get<std::int64_t>();
  return d;
}

/// A fresh empty directory under the build tree for files a test writes.
inline std::filesystem::path scratch_dir(const std::string& name) {
  auto dir = std::filesystem::path(HP_BINARY_DIR) / "test-scratch" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

}  // namespace hp::model::test
