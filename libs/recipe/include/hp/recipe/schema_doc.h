// The documented keys of the recipe and cluster formats, as data: the source of hp-recipe(5) and of
// the header comments in recipes/*.toml. A unit test checks that every key the parsers accept is
// listed here, so the documentation cannot fall behind the code.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace hp::recipe {

struct KeyDoc {
  std::string_view section;  ///< "[recipe]", "[[stages]]", "[layouts.<tensor>]", ...
  std::string_view key;
  std::string_view type;      ///< "integer", "string", "range", "bytes", "bandwidth", ...
  std::string_view required;  ///< "yes", "no (default ...)"
  std::string_view meaning;
};

/// Every key of a recipe file, in the order format_recipe() writes them.
std::span<const KeyDoc> recipe_keys();
/// Every key of a cluster file.
std::span<const KeyDoc> cluster_keys();

/// A Markdown table of `keys` (section, key, type, required, meaning), for hp-recipe(5).
std::string format_key_table(std::span<const KeyDoc> keys);

}  // namespace hp::recipe
