// The range notation ("0-3,8") used for layers and ranks in recipes (hp/recipe/recipe.h).
#include <charconv>
#include <optional>

#include <fmt/core.h>

#include "hp/recipe/recipe.h"

namespace hp::recipe {

std::string format_ranges(const std::vector<std::int64_t>& v) {
  std::string out;
  std::size_t i = 0;
  while (i < v.size()) {
    std::size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j > i ? fmt::format("{}-{}", v[i], v[j]) : std::to_string(v[i]);
    i = j + 1;
  }
  return out;
}

std::optional<std::vector<std::int64_t>> parse_ranges(std::string_view text) {
  std::vector<std::int64_t> out;
  auto read_int = [](std::string_view s, std::int64_t& v) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc() && p == s.data() + s.size() && v >= 0;
  };
  if (text.find_first_not_of(' ') == std::string_view::npos) return out;  // "" = empty list
  while (true) {
    std::size_t comma = text.find(',');
    std::string_view part = text.substr(0, comma);
    std::size_t dash = part.find('-');
    std::int64_t a = 0, b = 0;
    if (dash == std::string_view::npos) {
      if (!read_int(part, a)) return std::nullopt;
      b = a;
    } else if (!read_int(part.substr(0, dash), a) || !read_int(part.substr(dash + 1), b) || b < a) {
      return std::nullopt;
    }
    if (b - a > (1 << 20) || out.size() > (1u << 22))
      return std::nullopt;  // a typo, not a real rank count
    // Stops at b itself: "x <= b" never fails for b = INT64_MAX, and ++x would overflow (found by
    // tests/unit/recipe/fuzz_recipe.cpp: ranks = "9223372036854775807" grew until bad_alloc).
    for (std::int64_t x = a;; ++x) {
      out.push_back(x);
      if (x == b) break;
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace hp::recipe
