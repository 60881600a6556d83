// Finding cluster presets: `--cluster dgx-h100` or `cluster = "dgx-h100"` in a recipe names a file
// <dir>/dgx-h100.toml in one of the preset directories; anything that looks like a path is a path.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "hp/core/expected.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/recipe.h"

namespace hp::recipe {

/// The preset directories in search order: the install's <exe_dir>/../share/hp/recipes/clusters
/// (when it exists), then <source_dir>/recipes/clusters (when source_dir is non-empty and exists).
std::vector<std::filesystem::path> preset_dirs(const std::filesystem::path& exe_dir,
                                               const std::filesystem::path& source_dir);

/// Preset names (file stems) found in `dirs`, sorted and without duplicates.
std::vector<std::string> list_presets(const std::vector<std::filesystem::path>& dirs);

/// One preset as `hp plan --list-clusters` shows it: read from its file, so the list never drifts
/// from what --cluster NAME loads.
struct PresetInfo {
  std::string name;  ///< the file stem (what --cluster takes)
  std::filesystem::path path;
  std::string description;
  std::int64_t nodes = 0, ranks_per_node = 0;
  std::string device;   ///< the rank device type's name
  std::string problem;  ///< non-empty when the file does not load (its first error)
};
/// Every preset of `dirs` (a name found in two directories: the first one's), sorted by name.
std::vector<PresetInfo> describe_presets(const std::vector<std::filesystem::path>& dirs);
/// An aligned table (name, nodes, devices per node, device, description), or with `json` one JSON
/// array of objects with those fields.
std::string format_presets(const std::vector<PresetInfo>& presets, bool json);

/// True when `ref` names a file ("a/b.toml", "./x", "x.toml") rather than a preset.
bool looks_like_path(std::string_view ref);

/// Resolves a cluster reference: a path (relative to `base_dir`) or a preset name looked up in
/// `dirs`. An unknown preset fails with the list of presets and a did-you-mean hint.
Expected<std::filesystem::path> find_cluster(std::string_view ref,
                                             const std::filesystem::path& base_dir,
                                             const std::vector<std::filesystem::path>& dirs);

/// find_cluster + load_cluster.
Expected<Cluster> load_cluster_ref(std::string_view ref, const std::filesystem::path& base_dir,
                                   const std::vector<std::filesystem::path>& dirs);

/// The cluster recipe `r` runs on: its `cluster` reference resolved (a path relative to `base_dir`,
/// the recipe's directory, or a preset in `dirs`) and scaled to the recipe's `nodes` when that
/// differs from the cluster file's node count. Every command that prices or runs a recipe uses
/// this.
Expected<Cluster> cluster_for(const Recipe& r, const std::filesystem::path& base_dir,
                              const std::vector<std::filesystem::path>& dirs);

}  // namespace hp::recipe
