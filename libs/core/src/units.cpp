#include "hp/core/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

namespace hp {
namespace {

// Scales `v` by `base` until it is below one step, returning the value and the prefix index.
std::pair<double, int> scale(double v, double base, int max_index) {
  int i = 0;
  while (std::fabs(v) >= base && i < max_index) {
    v /= base;
    ++i;
  }
  return {v, i};
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string format_bytes(double bytes) {
  static constexpr std::array<const char*, 7> units{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  auto [v, i] = scale(bytes, 1024.0, 6);
  if (i == 0) return fmt::format("{:.0f} B", v);
  return fmt::format("{:.2f} {}", v, units[i]);
}

std::string format_count(double n) {
  static constexpr std::array<const char*, 7> units{"", " k", " M", " G", " T", " P", " E"};
  auto [v, i] = scale(n, 1000.0, 6);
  if (i == 0) return fmt::format("{:.0f}", v);
  return fmt::format("{:.2f}{}", v, units[i]);
}

std::string format_flops(double flops) {
  static constexpr std::array<const char*, 7> units{"", "k", "M", "G", "T", "P", "E"};
  auto [v, i] = scale(flops, 1000.0, 6);
  return fmt::format("{:.2f} {}FLOP", v, units[i]);
}

std::string format_rate(double per_second, std::string_view unit) {
  static constexpr std::array<const char*, 7> units{"", "k", "M", "G", "T", "P", "E"};
  auto [v, i] = scale(per_second, 1000.0, 6);
  return fmt::format("{:.2f} {}{}/s", v, units[i], unit);
}

std::string format_seconds(double s) {
  if (s >= 1.0 || s == 0.0) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  if (s >= 1e-6) return fmt::format("{:.2f} us", s * 1e6);
  return fmt::format("{:.0f} ns", s * 1e9);
}

std::optional<double> parse_bytes(std::string_view text) {
  text = trim(text);
  std::size_t pos = 0;
  while (pos < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.' ||
          text[pos] == 'e' || text[pos] == 'E' || text[pos] == '+' || text[pos] == '-'))
    ++pos;
  // "1e" followed by a unit letter is not an exponent: back off a dangling 'e'/'E'.
  while (pos > 0 && (text[pos - 1] == 'e' || text[pos - 1] == 'E')) --pos;
  double value = 0;
  std::string number(text.substr(0, pos));
  if (number.empty()) return std::nullopt;
  auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc() || ptr != number.data() + number.size() || value < 0) return std::nullopt;
  std::string unit(trim(text.substr(pos)));
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  struct Suffix {
    const char* name;
    double mult;
  };
  static constexpr std::array<Suffix, 13> suffixes{{{"", 1},
                                                    {"b", 1},
                                                    {"k", 1e3},
                                                    {"kb", 1e3},
                                                    {"kib", 1024.0},
                                                    {"mb", 1e6},
                                                    {"mib", 1048576.0},
                                                    {"gb", 1e9},
                                                    {"gib", 1073741824.0},
                                                    {"tb", 1e12},
                                                    {"tib", 1099511627776.0},
                                                    {"m", 1e6},
                                                    {"g", 1e9}}};
  for (const auto& s : suffixes)
    if (unit == s.name) return value * s.mult;
  return std::nullopt;
}

std::optional<double> parse_seconds(std::string_view text) {
  text = trim(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  // A digit or '.' first: from_chars alone would also take "inf", "nan" and a second sign.
  if (text.empty() ||
      !(std::isdigit(static_cast<unsigned char>(text.front())) || text.front() == '.'))
    return std::nullopt;
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || !std::isfinite(value) || value < 0) return std::nullopt;
  const std::string_view unit = trim(std::string_view(ptr, static_cast<std::size_t>(end - ptr)));
  struct Unit {
    std::string_view name;
    double mult;
  };
  static constexpr std::array<Unit, 7> units{{{"", 1.0},
                                              {"s", 1.0},
                                              {"ms", 1e-3},
                                              {"us", 1e-6},
                                              {"\xC2\xB5s", 1e-6} /* µs, micro sign */,
                                              {"\xCE\xBCs", 1e-6} /* μs, Greek mu */,
                                              {"ns", 1e-9}}};
  for (const auto& u : units)
    if (unit == u.name) return value * u.mult;
  return std::nullopt;
}

double nice_step(double raw) {
  raw = std::max(raw, 1e-300);
  const double unit = std::pow(10.0, std::floor(std::log10(raw)));
  return raw <= unit ? unit : raw <= 2 * unit ? 2 * unit : raw <= 5 * unit ? 5 * unit : 10 * unit;
}

std::string format_tick_seconds(double t, double step) {
  const char* unit = "s";
  if (step < 1e-3) {
    t *= 1e6, step *= 1e6, unit = "us";
  } else if (step < 0.1) {
    t *= 1e3, step *= 1e3, unit = "ms";
  }
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f} {}", t, decimals, unit);
}

}  // namespace hp
