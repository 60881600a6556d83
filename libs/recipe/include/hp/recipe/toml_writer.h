// Writing TOML text: the one writer behind recipes, clusters (libs/recipe) and shard manifests
// (libs/shard). hp writes its files itself rather than through TOML++'s formatter because TOML++
// tables are sorted maps (a written recipe would list [layouts] before [recipe]); this writer keeps
// the caller's section and key order, so written files follow the documented layout and diff well.
//
// Value helpers return TOML text (strings quoted and escaped, floats in shortest round-trip form);
// TomlWriter lays out comments, [tables], [[arrays of tables]] and `key = value` lines:
//
//   TomlWriter w;
//   w.comment("hp recipe");                           // # hp recipe
//   w.table("recipe").integer("version", 1);          // [recipe]        version = 1
//   w.table("layouts", "h.*.weight");                 // (blank line) [layouts."h.*.weight"]
//   w.array_table("stages").string("layers", "0-3");  // (blank line) [[stages]]  layers = "0-3"
//   w.value("dims", toml_inline_table({{"batch", toml_int(8)}}));   // dims = { batch = 8 }
//   std::string text = std::move(w).str();
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hp::recipe {

/// A TOML basic string: quoted, with ", \ and control characters escaped (\n \t \r by name, the
/// rest and DEL as \uXXXX). Other bytes, UTF-8 included, are written as they are.
std::string toml_string(std::string_view s);
/// A key: bare when it is non-empty and only A-Z a-z 0-9 _ -, else quoted as toml_string.
std::string toml_key(std::string_view key);
/// A float that reads back to the same double: shortest round-trip form, always with a '.', 'e' or
/// one of inf / -inf / nan.
std::string toml_float(double v);
std::string toml_int(std::int64_t v);
std::string toml_bool(bool b);
/// [1, 2, 3]
std::string toml_int_array(const std::vector<std::int64_t>& v);
/// ["a", "b"]
std::string toml_string_array(const std::vector<std::string>& v);
/// [v1, v2] from values that are already TOML text (nested arrays, mixed types).
std::string toml_array(const std::vector<std::string>& values);

/// How toml_inline_table writes its keys.
enum class TomlKeys {
  bare_when_possible,  ///< toml_key
  quoted,              ///< always toml_string (shard manifests' dims)
};
/// { k1 = v1, k2 = v2 } from keys (raw, escaped here) and values that are already TOML text; "{}"
/// when empty.
std::string toml_inline_table(const std::vector<std::pair<std::string, std::string>>& entries,
                              TomlKeys keys = TomlKeys::bare_when_possible);

/// Lays out a TOML document line by line, in the order of the calls.
class TomlWriter {
 public:
  /// "# text" on its own line.
  TomlWriter& comment(std::string_view text);
  /// [a.b.c] from the path's keys (each escaped with toml_key). A blank line precedes every header
  /// except one that only comments precede.
  template <class... Keys>
  TomlWriter& table(const Keys&... path) {
    return header(false, {std::string_view(path)...});
  }
  /// [[a.b]], the same way.
  template <class... Keys>
  TomlWriter& array_table(const Keys&... path) {
    return header(true, {std::string_view(path)...});
  }
  /// key = value, where `toml_value` is TOML text (from the helpers above).
  TomlWriter& value(std::string_view key, std::string_view toml_value);
  TomlWriter& string(std::string_view key, std::string_view s) {
    return value(key, toml_string(s));
  }
  TomlWriter& integer(std::string_view key, std::int64_t v) { return value(key, toml_int(v)); }
  TomlWriter& number(std::string_view key, double v) { return value(key, toml_float(v)); }
  TomlWriter& boolean(std::string_view key, bool b) { return value(key, toml_bool(b)); }

  const std::string& str() const& { return text_; }
  std::string str() && { return std::move(text_); }

 private:
  TomlWriter& header(bool array, std::initializer_list<std::string_view> path);
  std::string text_;
  bool content_ = false;  ///< something other than comments was written
};

}  // namespace hp::recipe
