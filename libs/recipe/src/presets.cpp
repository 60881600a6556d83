// Preset lookup. A cluster reference is either a path or a preset name; the rule is purely textual
// (a '/' or a ".toml" suffix makes it a path) so that the same recipe means the same thing on every
// machine. Preset directories come from the caller: the library does not know where hp is
// installed, apps/hp passes <exe_dir>/../share/hp/recipes/clusters and the source tree.
#include "hp/recipe/presets.h"

#include <algorithm>
#include <system_error>

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "toml_reader.h"

namespace hp::recipe {

namespace fs = std::filesystem;

std::vector<fs::path> preset_dirs(const fs::path& exe_dir, const fs::path& source_dir) {
  std::vector<fs::path> dirs;
  std::error_code ec;
  if (!exe_dir.empty()) {
    fs::path installed = exe_dir / ".." / "share" / "hp" / "recipes" / "clusters";
    // An installed hp uses only its own presets: the source tree it was built from may since hold
    // another version's presets, or belong to someone else on this machine.
    if (fs::is_directory(installed, ec)) return {installed.lexically_normal()};
  }
  if (!source_dir.empty()) {
    fs::path tree = source_dir / "recipes" / "clusters";
    if (fs::is_directory(tree, ec)) dirs.push_back(tree.lexically_normal());
  }
  return dirs;
}

std::vector<std::string> list_presets(const std::vector<fs::path>& dirs) {
  std::vector<std::string> names;
  for (const auto& dir : dirs) {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".toml" && it->is_regular_file(ec))
        names.push_back(it->path().stem().string());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::vector<PresetInfo> describe_presets(const std::vector<fs::path>& dirs) {
  std::vector<PresetInfo> out;
  for (const auto& name : list_presets(dirs)) {
    PresetInfo p;
    p.name = name;
    auto path = find_cluster(name, {}, dirs);
    if (!path) continue;  // listed a moment ago; gone since
    p.path = *path;
    auto c = load_cluster(*path);
    if (!c) {
      p.problem = c.error().what.message;
    } else {
      p.description = c->description;
      p.nodes = c->nodes;
      p.ranks_per_node = c->ranks_per_node();
      if (const DeviceType* d = c->rank_device_type()) p.device = d->name;
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::string format_presets(const std::vector<PresetInfo>& presets, bool json) {
  if (json) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const auto& p : presets) {
      nlohmann::ordered_json o{{"name", p.name},
                               {"nodes", p.nodes},
                               {"devices_per_node", p.ranks_per_node},
                               {"device", p.device},
                               {"description", p.description},
                               {"path", p.path.string()}};
      if (!p.problem.empty()) o["problem"] = p.problem;
      a.push_back(std::move(o));
    }
    return a.dump() + "\n";
  }
  std::size_t wn = 4, wd = 6;
  for (const auto& p : presets) {
    wn = std::max(wn, p.name.size());
    wd = std::max(wd, p.device.size());
  }
  std::string s = fmt::format("{:<{}}  {:>5}  {:>7}  {:<{}}  {}\n", "NAME", wn, "NODES", "DEVICES",
                              "DEVICE", wd, "DESCRIPTION");
  for (const auto& p : presets)
    s += p.problem.empty() ? fmt::format("{:<{}}  {:>5}  {:>7}  {:<{}}  {}\n", p.name, wn, p.nodes,
                                         p.ranks_per_node, p.device, wd, p.description)
                           : fmt::format("{:<{}}  (does not load: {})\n", p.name, wn, p.problem);
  if (presets.empty()) s += "(no preset directory found)\n";
  return s;
}

bool looks_like_path(std::string_view ref) {
  return ref.find('/') != std::string_view::npos ||
         (ref.size() > 5 && ref.substr(ref.size() - 5) == ".toml");
}

Expected<fs::path> find_cluster(std::string_view ref, const fs::path& base_dir,
                                const std::vector<fs::path>& dirs) {
  std::error_code ec;
  if (ref.empty())
    return Error(Errc::bad_input, "empty cluster reference", "", "name a preset or a cluster file");
  if (looks_like_path(ref)) {
    fs::path p(ref);
    if (p.is_relative() && !base_dir.empty()) p = base_dir / p;
    if (!fs::is_regular_file(p, ec))
      return Error(Errc::bad_input, fmt::format("cluster file '{}' not found", p.string()), "",
                   "cluster paths are relative to the recipe file");
    return p;
  }
  for (const auto& dir : dirs) {
    fs::path p = dir / (std::string(ref) + ".toml");
    if (fs::is_regular_file(p, ec)) return p;
  }
  std::vector<std::string> names = list_presets(dirs);
  std::vector<std::string_view> views(names.begin(), names.end());
  std::string hint = detail::did_you_mean(ref, views);
  if (hint.empty()) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    hint = names.empty() ? "no preset directory found; give a path to a cluster file"
                         : "presets: " + list + " (or give a path to a cluster file)";
  }
  return Error(Errc::bad_input, fmt::format("unknown cluster preset '{}'", ref), "", hint);
}

Expected<Cluster> load_cluster_ref(std::string_view ref, const fs::path& base_dir,
                                   const std::vector<fs::path>& dirs) {
  HP_ASSIGN_OR_RETURN(auto path, find_cluster(ref, base_dir, dirs));
  return load_cluster(path);
}

Expected<Cluster> cluster_for(const Recipe& r, const fs::path& base_dir,
                              const std::vector<fs::path>& dirs) {
  HP_ASSIGN_OR_RETURN(Cluster c, load_cluster_ref(r.cluster, base_dir, dirs));
  if (r.nodes > 0 && r.nodes != c.nodes) return scale_cluster(c, r.nodes);
  return c;
}

}  // namespace hp::recipe
