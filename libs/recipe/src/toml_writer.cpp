// The TOML writer (hp/recipe/toml_writer.h). Floats are written in fmt's shortest round-trip
// form so that read(write(x)) == x bit for bit: the round-trip tests compare structs with ==.
#include "hp/recipe/toml_writer.h"

#include <cmath>

#include <fmt/core.h>

namespace hp::recipe {
namespace {

bool bare_key(std::string_view key) {
  if (key.empty()) return false;
  for (char c : key)
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-'))
      return false;
  return true;
}

template <class T, class F>
std::string join_array(const std::vector<T>& v, F text) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    out += text(v[i]);
  }
  return out + "]";
}

}  // namespace

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04X}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        else
          out += c;
    }
  }
  return out + "\"";
}

std::string toml_key(std::string_view key) {
  return bare_key(key) ? std::string(key) : toml_string(key);
}

std::string toml_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string toml_int(std::int64_t v) { return std::to_string(v); }

std::string toml_bool(bool b) { return b ? "true" : "false"; }

std::string toml_int_array(const std::vector<std::int64_t>& v) { return join_array(v, toml_int); }

std::string toml_string_array(const std::vector<std::string>& v) {
  return join_array(v, [](const std::string& s) { return toml_string(s); });
}

std::string toml_array(const std::vector<std::string>& values) {
  return join_array(values, [](const std::string& s) { return s; });
}

std::string toml_inline_table(const std::vector<std::pair<std::string, std::string>>& entries,
                              TomlKeys keys) {
  if (entries.empty()) return "{}";
  std::string out = "{ ";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (i) out += ", ";
    out += keys == TomlKeys::quoted ? toml_string(entries[i].first) : toml_key(entries[i].first);
    out += " = " + entries[i].second;
  }
  return out + " }";
}

TomlWriter& TomlWriter::comment(std::string_view text) {
  while (true) {
    const std::size_t nl = text.find('\n');
    text_ += "# ";
    text_ += text.substr(0, nl);
    text_ += '\n';
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return *this;
}

TomlWriter& TomlWriter::header(bool array, std::initializer_list<std::string_view> path) {
  if (content_) text_ += '\n';
  text_ += array ? "[[" : "[";
  bool first = true;
  for (std::string_view key : path) {
    if (!first) text_ += '.';
    text_ += toml_key(key);
    first = false;
  }
  text_ += array ? "]]\n" : "]\n";
  content_ = true;
  return *this;
}

TomlWriter& TomlWriter::value(std::string_view key, std::string_view toml_value) {
  text_ += toml_key(key);
  text_ += " = ";
  text_ += toml_value;
  text_ += '\n';
  content_ = true;
  return *this;
}

}  // namespace hp::recipe
