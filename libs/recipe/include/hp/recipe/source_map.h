// Where each key of a parsed TOML file came from, so checks that run after parsing (ranges,
// cross-key consistency, the recipe against its cluster) can still point at "file:line:col".
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace hp::recipe {

class SourceMap {
 public:
  SourceMap() = default;
  explicit SourceMap(std::string file) : file_(std::move(file)) {}

  /// The file name as the user gave it (used when no finer location is known).
  const std::string& file() const { return file_; }

  /// Records "file:line:col" for a dotted key path such as "parallel.tp" or "stages[1].ranks".
  void set(std::string key_path, int line, int column);

  /// "file:line:col" of `key_path`; falls back to its closest recorded parent, then to the file.
  std::string at(std::string_view key_path) const;

  bool contains(std::string_view key_path) const { return where_.count(std::string(key_path)) > 0; }

 private:
  std::string file_;
  std::map<std::string, std::string, std::less<>> where_;
};

}  // namespace hp::recipe
