// Identifier and environment-variable rules for recipes (hp/recipe/names.h).
#include "hp/recipe/names.h"

#include <algorithm>

#include <fmt/core.h>

namespace hp::recipe {
namespace {

bool alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool digit(char c) { return c >= '0' && c <= '9'; }

std::vector<std::string>& allowed() {
  static std::vector<std::string> names;
  return names;
}

}  // namespace

std::optional<std::string> identifier_problem(std::string_view name) {
  if (name.empty()) return "it is empty";
  if (name.size() > kMaxNameLength)
    return fmt::format("it is {} bytes long (at most {})", name.size(), kMaxNameLength);
  if (name.front() == '.') return "it starts with '.'";
  for (char c : name)
    if (!alpha(c) && !digit(c) && c != '-' && c != '_' && c != '.') {
      const auto u = static_cast<unsigned char>(c);
      return u >= 0x21 && u < 0x7f ? fmt::format("it contains '{}'", c)
                                   : fmt::format("it contains the byte 0x{:02x}", u);
    }
  return std::nullopt;
}

bool is_env_name(std::string_view name) {
  if (name.empty() || digit(name.front())) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return alpha(c) || digit(c) || c == '_'; });
}

bool is_loader_env(std::string_view n) {
  auto starts = [&](std::string_view p) { return n.substr(0, p.size()) == p; };
  auto ends = [&](std::string_view x) {
    return n.size() >= x.size() && n.substr(n.size() - x.size()) == x;
  };
  // hp's own: HP_PLUGIN_PATH and the vendor-library overrides HP_CUDA_DRIVER_LIB, HP_CUBLAS_LIB,
  // HP_ASCEND_LIB (and any later HP_*_LIB / HP_*_PATH). HP_TEST_FAULT and friends pick no code.
  const bool hp_loader = starts("HP_") && (ends("_LIB") || ends("_LIBS") || ends("_PATH"));
  return starts("LD_") || starts("DYLD_") || hp_loader || starts("OMPI_MCA_mca_base_") ||
         n == "PATH" || n == "PYTHONPATH" || n == "PYTHONHOME" || n == "ASCEND_TOOLKIT_HOME";
}

void set_allowed_recipe_env(std::vector<std::string> names) { allowed() = std::move(names); }

const std::vector<std::string>& allowed_recipe_env() { return allowed(); }

bool recipe_env_allowed(std::string_view name) {
  const auto& a = allowed();
  return std::any_of(a.begin(), a.end(),
                     [&](const std::string& s) { return s == "*" || s == name; });
}

}  // namespace hp::recipe
