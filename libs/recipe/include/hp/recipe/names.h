// What a recipe may call things and what it may put in a rank's environment. Recipe and group names
// become paths (runs/<name>/...) and words of launcher files, so they are identifiers; a group's
// env may not choose the code a rank loads (the dynamic loader's variables, hp's plugin and library
// paths, PATH) unless the user allows that variable on the command line (`--allow-recipe-env
// NAME`). docs/hardening.md, "Recipes, manifests and launchers".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hp::recipe {

inline constexpr std::size_t kMaxNameLength = 128;

/// Why `name` is not an identifier (letters, digits, '-', '_', '.'; not starting with '.'; at most
/// kMaxNameLength bytes), or nullopt when it is one.
std::optional<std::string> identifier_problem(std::string_view name);

/// A POSIX environment variable name: [A-Za-z_][A-Za-z0-9_]*.
bool is_env_name(std::string_view name);

/// True for variables that pick code to load: LD_*, DYLD_*, hp's HP_*_LIB / HP_*_PATH
/// (HP_PLUGIN_PATH, HP_CUDA_DRIVER_LIB, ...), PATH, PYTHONPATH, PYTHONHOME, ASCEND_TOOLKIT_HOME and
/// Open MPI's component path (OMPI_MCA_mca_base_*).
bool is_loader_env(std::string_view name);

/// The variables the user allowed recipes to set (the command line's --allow-recipe-env), for the
/// whole process; "*" allows every variable. Workers get the same list on their command line.
void set_allowed_recipe_env(std::vector<std::string> names);
const std::vector<std::string>& allowed_recipe_env();
bool recipe_env_allowed(std::string_view name);

}  // namespace hp::recipe
