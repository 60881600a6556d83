// Where diagnostics come from and in what order they are shown: the TOML parse itself (TOML++'s
// parse_error, caught here so no exception leaves the library), the SourceMap that remembers where
// each key was, and the ordering/de-duplication of the collected problems. Users read the problems
// top to bottom next to their file, so they are sorted by line and column; a semantic complaint at
// a location that already has a parse problem is dropped as a restatement of it.
#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/core.h>

#include "hp/recipe/source_map.h"
#include "toml_reader.h"

namespace hp::recipe {

void SourceMap::set(std::string key_path, int line, int column) {
  where_[std::move(key_path)] = fmt::format("{}:{}:{}", file_, line, column);
}

std::string SourceMap::at(std::string_view key_path) const {
  std::string key(key_path);
  while (!key.empty()) {
    if (auto it = where_.find(key); it != where_.end()) return it->second;
    // Walk up: "stages[1].ranks" -> "stages[1]" -> "stages"; "a.b" -> "a".
    std::size_t cut = key.find_last_of(".[");
    if (cut == std::string::npos) break;
    key.resize(cut);
  }
  return file_;
}

}  // namespace hp::recipe

namespace hp::recipe::detail {

std::optional<toml::table> parse_toml(std::string_view text, const std::string& display_path,
                                      std::vector<Diagnostic>& problems) {
  try {
    return toml::parse(text, display_path);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    std::string where =
        b.line ? fmt::format("{}:{}:{}", display_path, b.line, b.column) : display_path;
    std::string message(e.description());
    if (!message.empty())
      message[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(message[0])));
    while (!message.empty() && message.back() == '.') message.pop_back();
    problems.push_back(
        Diagnostic{where, "TOML syntax error: " + message, "fix the TOML syntax at this position"});
    return std::nullopt;
  }
}

}  // namespace hp::recipe::detail

namespace hp::recipe::detail {

namespace {

// "file:12:7" -> (12, 7); locations without numbers sort first.
std::pair<long, long> line_col(const std::string& where) {
  std::size_t c2 = where.rfind(':');
  if (c2 == std::string::npos) return {0, 0};
  std::size_t c1 = where.rfind(':', c2 - 1);
  if (c1 == std::string::npos || c2 == 0) return {0, 0};
  char* end = nullptr;
  long line = std::strtol(where.c_str() + c1 + 1, &end, 10);
  if (end != where.c_str() + c2) return {0, 0};
  long col = std::strtol(where.c_str() + c2 + 1, &end, 10);
  if (*end != '\0') return {0, 0};
  return {line, col};
}

}  // namespace

void sort_by_location(std::vector<Diagnostic>& problems) {
  std::stable_sort(problems.begin(), problems.end(), [](const Diagnostic& a, const Diagnostic& b) {
    return line_col(a.where) < line_col(b.where);
  });
}

void append_new(std::vector<Diagnostic>& problems, std::vector<Diagnostic> more) {
  std::size_t original = problems.size();
  for (auto& d : more) {
    bool seen =
        std::any_of(problems.begin(), problems.begin() + static_cast<std::ptrdiff_t>(original),
                    [&](const Diagnostic& p) { return p.where == d.where; });
    if (!seen) problems.push_back(std::move(d));
  }
}

}  // namespace hp::recipe::detail
