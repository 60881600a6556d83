// The single place that turns hp::Error values into text for users (docs/style.md, "Messages").
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/core.h>

#include "commands.h"

namespace hp::cli {
namespace {

bool stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

void print_line(const char* label, const char* colour, const Diagnostic& d) {
  bool tty = stderr_is_tty();
  std::string prefix =
      tty ? fmt::format("hp: \033[{}m{}:\033[0m ", colour, label) : fmt::format("hp: {}: ", label);
  if (d.where.empty())
    fmt::print(stderr, "{}{}\n", prefix, d.message);
  else
    fmt::print(stderr, "{}{}: {}\n", prefix, d.where, d.message);
  if (!d.hint.empty()) fmt::print(stderr, "  hint: {}\n", d.hint);
}

}  // namespace

int report_error(const Error& e) {
  auto diags = e.all();
  for (const auto& d : diags) print_line("error", "1;31", d);
  if (diags.size() > 1) fmt::print(stderr, "hp: {} errors\n", diags.size());
  return static_cast<int>(exit_code_for(e.code));
}

void report_warning(const std::string& where, const std::string& message) {
  print_line("warning", "1;35", Diagnostic{where, message, ""});
}

CLI::Validator timeout_seconds() {
  constexpr double kMaxTimeout = 365.0 * 24 * 3600;
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const char* begin = text.c_str();
        char* end = nullptr;
        double v = std::strtod(begin, &end);
        if (text.empty() || end != begin + text.size() || !std::isfinite(v) || v < 0 ||
            v > kMaxTimeout)
          return fmt::format("'{}' is not a number of seconds in [0, {}] (0: no limit)", text,
                             static_cast<long>(kMaxTimeout));
        return {};
      },
      "SECONDS");
}

}  // namespace hp::cli
