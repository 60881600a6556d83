// The reading half of the recipe and cluster formats is mostly bookkeeping: look a key up, check
// its TOML type, remember where it was, and when anything is off write a located diagnostic and
// carry on. Doing that in one place keeps the schema code (cluster_parse.cpp, recipe_parse.cpp) a
// readable list of keys, and makes every message use the same words: "'parallel.tp' must be an
// integer, got a string", "unknown key 'tpp' in [parallel]", "missing required key 'recipe.model'".
//
// Locations come from TOML++'s source regions (1-based line and column of the value, or of the key
// for unknown keys). The SourceMap keeps them for checks that run later on the plain structs.
#include "toml_reader.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/core.h>

#include "hp/core/units.h"
#include "hp/recipe/recipe.h"
#include "hp/recipe/toml_writer.h"

namespace hp::recipe::detail {

// Optimal-string-alignment distance: insertions, deletions, substitutions and adjacent
// transpositions each cost 1, so "modle" is one edit from "model".
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string did_you_mean(std::string_view word, const std::vector<std::string_view>& candidates) {
  // Allow about one typo per three characters, at least one, at most three.
  std::size_t limit = std::clamp<std::size_t>(word.size() / 3, 1, 3);
  std::string_view best;
  std::size_t best_d = limit + 1;
  auto lower = [](std::string_view s) {
    std::string out(s);
    for (auto& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return out;
  };
  std::string w = lower(word);
  for (auto c : candidates) {
    std::size_t d = edit_distance(w, lower(c));
    if (d < best_d) best_d = d, best = c;
  }
  return best.empty() ? std::string() : fmt::format("did you mean '{}'?", best);
}

std::string type_phrase(toml::node_type t) {
  switch (t) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

std::string TomlReader::join(const std::string& path, std::string_view key) {
  return path.empty() ? toml_key(key)
                      : path + "." + toml_key(key);  // a key as written in a dotted path
}

std::string TomlReader::loc(const toml::source_region& r) const {
  if (r.begin.line == 0) return where_.file();
  return fmt::format("{}:{}:{}", where_.file(), r.begin.line, r.begin.column);
}

void TomlReader::error(std::string where, std::string message, std::string hint) {
  problems_.push_back(Diagnostic{std::move(where), std::move(message), std::move(hint)});
}

void TomlReader::check_keys(const toml::table& t, const std::string& path,
                            std::initializer_list<std::string_view> allowed) {
  std::vector<std::string_view> names(allowed);
  for (auto&& [k, v] : t) {
    if (std::find(names.begin(), names.end(), k.str()) != names.end()) continue;
    std::string section = path.empty() ? "at the top level" : fmt::format("in [{}]", path);
    std::string hint = did_you_mean(k.str(), names);
    if (hint.empty()) {
      std::string list;
      for (auto n : names) list += (list.empty() ? "" : ", ") + std::string(n);
      hint = "known keys: " + list;
    }
    error(loc(k.source()), fmt::format("unknown key '{}' {}", k.str(), section), hint);
  }
}

const toml::node* TomlReader::lookup(const toml::table& t, std::string_view key,
                                     const std::string& path, bool required) {
  const toml::node* n = t.get(key);
  std::string full = join(path, key);
  if (!n) {
    if (required)
      error(path.empty() ? where_.file() : where_.at(path),
            fmt::format("missing required key '{}'", full),
            fmt::format("add '{} = ...'{}", key,
                        path.empty() ? "" : fmt::format(" under [{}]", path)));
    return nullptr;
  }
  where_.set(full, static_cast<int>(n->source().begin.line),
             static_cast<int>(n->source().begin.column));
  return n;
}

void TomlReader::wrong_type(const toml::node& n, const std::string& full,
                            std::string_view expected) {
  std::string hint;
  if (expected == "an integer")
    hint = "write a whole number without quotes, e.g. 4";
  else if (expected == "a string")
    hint = "put the value in double quotes";
  else if (expected.rfind("a boolean", 0) == 0)
    hint = "write true or false, without quotes";
  else if (expected == "a number")
    hint = "write a number without quotes, e.g. 0.1";
  else if (expected == "a table")
    hint = fmt::format("write it as a [{}] section or an inline table {{ ... }}", full);
  else if (expected == "an array")
    hint = "write it as [ ... ]";
  error(loc(n.source()),
        fmt::format("'{}' must be {}, got {}", full, expected, type_phrase(n.type())), hint);
}

std::optional<std::int64_t> TomlReader::get_int(const toml::table& t, std::string_view key,
                                                const std::string& path, bool required) {
  const toml::node* n = lookup(t, key, path, required);
  if (!n) return std::nullopt;
  if (auto v = n->as_integer()) return v->get();
  wrong_type(*n, join(path, key), "an integer");
  return std::nullopt;
}

std::optional<double> TomlReader::get_number(const toml::table& t, std::string_view key,
                                             const std::string& path, bool required) {
  const toml::node* n = lookup(t, key, path, required);
  if (!n) return std::nullopt;
  if (auto v = n->as_integer()) return static_cast<double>(v->get());
  if (auto v = n->as_floating_point()) return v->get();
  wrong_type(*n, join(path, key), "a number");
  return std::nullopt;
}

std::optional<std::string> TomlReader::get_string(const toml::table& t, std::string_view key,
                                                  const std::string& path, bool required) {
  const toml::node* n = lookup(t, key, path, required);
  if (!n) return std::nullopt;
  if (auto v = n->as_string()) return v->get();
  wrong_type(*n, join(path, key), "a string");
  return std::nullopt;
}

std::optional<bool> TomlReader::get_bool(const toml::table& t, std::string_view key,
                                         const std::string& path, bool required) {
  const toml::node* n = lookup(t, key, path, required);
  if (!n) return std::nullopt;
  if (auto v = n->as_boolean()) return v->get();
  wrong_type(*n, join(path, key), "a boolean (true or false)");
  return std::nullopt;
}

const toml::table* TomlReader::get_table(const toml::table& t, std::string_view key,
                                         const std::string& path, bool required) {
  const toml::node* n = lookup(t, key, path, required);
  if (!n) return nullptr;
  if (auto v = n->as_table()) return v;
  wrong_type(*n, join(path, key), "a table");
  return nullptr;
}

const toml::array* TomlReader::get_array(const toml::table& t, std::string_view key,
                                         const std::string& path, bool required) {
  const toml::node* n = lookup(t, key, path, required);
  if (!n) return nullptr;
  if (auto v = n->as_array()) return v;
  wrong_type(*n, join(path, key), "an array");
  return nullptr;
}

namespace {

std::optional<double> parse_rate(std::string_view text) {
  std::string s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  if (s.size() < 2 || s.compare(s.size() - 2, 2, "/s") != 0) return std::nullopt;
  return parse_bytes(std::string_view(s).substr(0, s.size() - 2));
}

}  // namespace

// Numbers-or-unit-strings share one shape: a number is taken as is, a string goes through `parse`.
#define HP_UNIT_GETTER(fn, parse, what, example)                                   \
  std::optional<double> TomlReader::fn(const toml::table& t, std::string_view key, \
                                       const std::string& path, bool required) {   \
    const toml::node* n = lookup(t, key, path, required);                          \
    if (!n) return std::nullopt;                                                   \
    if (auto v = n->as_integer()) return static_cast<double>(v->get());            \
    if (auto v = n->as_floating_point()) return v->get();                          \
    if (auto v = n->as_string()) {                                                 \
      if (auto parsed = parse(v->get())) return parsed;                            \
      error(loc(n->source()),                                                      \
            fmt::format("'{}' is not " what ": '{}'", join(path, key), v->get()),  \
            "write a number or a string such as " example);                        \
      return std::nullopt;                                                         \
    }                                                                              \
    wrong_type(*n, join(path, key), "a number or a string such as " example);      \
    return std::nullopt;                                                           \
  }

HP_UNIT_GETTER(get_bytes, parse_bytes, "a size in bytes", "\"80 GiB\"")
HP_UNIT_GETTER(get_rate, parse_rate, "a bandwidth", "\"450 GB/s\"")
HP_UNIT_GETTER(get_seconds, parse_seconds, "a duration", "\"2us\"")
#undef HP_UNIT_GETTER

std::optional<std::vector<std::int64_t>> TomlReader::get_int_list(const toml::table& t,
                                                                  std::string_view key,
                                                                  const std::string& path,
                                                                  bool required) {
  const toml::node* n = lookup(t, key, path, required);
  if (!n) return std::nullopt;
  std::string full = join(path, key);
  if (auto s = n->as_string()) {
    if (auto v = parse_ranges(s->get())) return v;
    error(loc(n->source()), fmt::format("'{}' is not a list of ranges: '{}'", full, s->get()),
          "write ranges such as \"0-3,8\" or an array of integers");
    return std::nullopt;
  }
  const toml::array* a = n->as_array();
  if (!a) {
    wrong_type(*n, full, "an array of integers or a range string such as \"0-3\"");
    return std::nullopt;
  }
  std::vector<std::int64_t> out;
  bool ok = true;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const toml::node& e = *a->get(i);
    if (auto v = e.as_integer()) {
      out.push_back(v->get());
    } else {
      wrong_type(e, fmt::format("{}[{}]", full, i), "an integer");
      ok = false;
    }
  }
  if (!ok) return std::nullopt;
  return out;
}

std::optional<std::vector<std::string>> TomlReader::get_string_list(const toml::table& t,
                                                                    std::string_view key,
                                                                    const std::string& path,
                                                                    bool required) {
  const toml::array* a = get_array(t, key, path, required);
  if (!a) return std::nullopt;
  std::vector<std::string> out;
  bool ok = true;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const toml::node& e = *a->get(i);
    if (auto v = e.as_string()) {
      out.push_back(v->get());
    } else {
      wrong_type(e, fmt::format("{}[{}]", join(path, key), i), "a string");
      ok = false;
    }
  }
  if (!ok) return std::nullopt;
  return out;
}

}  // namespace hp::recipe::detail
