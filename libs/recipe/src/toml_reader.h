// Private: a diagnostic-collecting reader over a TOML++ table. Every accessor records the key's
// location in the SourceMap and, instead of failing, appends a Diagnostic and returns nullopt, so
// one pass over a file reports every wrong type, unknown key and missing key.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include "hp/core/error.h"
#include "hp/recipe/source_map.h"

namespace hp::recipe::detail {

std::size_t edit_distance(std::string_view a, std::string_view b);
/// "did you mean 'x'?" for the closest candidate within a small edit distance, else "".
std::string did_you_mean(std::string_view word, const std::vector<std::string_view>& candidates);
/// "a string", "an integer", ... for messages such as "must be an integer, got a string".
std::string type_phrase(toml::node_type t);

class TomlReader {
 public:
  TomlReader(SourceMap& where, std::vector<Diagnostic>& problems)
      : where_(where), problems_(problems) {}

  std::string loc(const toml::source_region& r) const;
  void error(std::string where, std::string message, std::string hint = {});

  /// Reports every key of `t` not in `allowed` (did-you-mean hint for near misses).
  void check_keys(const toml::table& t, const std::string& path,
                  std::initializer_list<std::string_view> allowed);

  /// Typed accessors for t[key]; `path` is the table's dotted path ("" for the root).
  /// Absent + required: "missing required key"; wrong type: "must be ..., got ...".
  std::optional<std::int64_t> get_int(const toml::table& t, std::string_view key,
                                      const std::string& path, bool required);
  std::optional<double> get_number(const toml::table& t, std::string_view key,
                                   const std::string& path, bool required);
  std::optional<std::string> get_string(const toml::table& t, std::string_view key,
                                        const std::string& path, bool required);
  std::optional<bool> get_bool(const toml::table& t, std::string_view key, const std::string& path,
                               bool required);
  const toml::table* get_table(const toml::table& t, std::string_view key, const std::string& path,
                               bool required);
  const toml::array* get_array(const toml::table& t, std::string_view key, const std::string& path,
                               bool required);
  /// A number of bytes: an integer, a float, or a string such as "80 GiB".
  std::optional<double> get_bytes(const toml::table& t, std::string_view key,
                                  const std::string& path, bool required);
  /// Bytes per second: a number, or a string such as "450 GB/s".
  std::optional<double> get_rate(const toml::table& t, std::string_view key,
                                 const std::string& path, bool required);
  /// Seconds: a number, or a string such as "2us", "1.5 ms".
  std::optional<double> get_seconds(const toml::table& t, std::string_view key,
                                    const std::string& path, bool required);
  /// Integers: an array of integers or a range string "0-3,8".
  std::optional<std::vector<std::int64_t>> get_int_list(const toml::table& t, std::string_view key,
                                                        const std::string& path, bool required);
  std::optional<std::vector<std::string>> get_string_list(const toml::table& t,
                                                          std::string_view key,
                                                          const std::string& path, bool required);

  /// The dotted path of `key` inside `path`.
  static std::string join(const std::string& path, std::string_view key);

 private:
  const toml::node* lookup(const toml::table& t, std::string_view key, const std::string& path,
                           bool required);
  void wrong_type(const toml::node& n, const std::string& full, std::string_view expected);

  SourceMap& where_;
  std::vector<Diagnostic>& problems_;
};

}  // namespace hp::recipe::detail

namespace hp::recipe::detail {

/// Parses TOML text; a syntax error becomes a located Diagnostic in `problems` (TOML++ throws
/// toml::parse_error in Debian's build, which is caught here, at the library edge).
std::optional<toml::table> parse_toml(std::string_view text, const std::string& display_path,
                                      std::vector<Diagnostic>& problems);

}  // namespace hp::recipe::detail

namespace hp::recipe::detail {

/// Appends the semantic-check diagnostics in `more` to `problems`, except those at a location that
/// already has a problem: a key with a wrong type keeps its default value, and the range check on
/// that default would only repeat the same mistake in other words.
void append_new(std::vector<Diagnostic>& problems, std::vector<Diagnostic> more);

/// Orders diagnostics of one file by line and column (reading order), keeping ties stable.
void sort_by_location(std::vector<Diagnostic>& problems);

}  // namespace hp::recipe::detail
