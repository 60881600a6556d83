// manifest.toml writing (hp/recipe/toml_writer.h: fixed key order, so manifests diff well) and
// reading (TOML++).
#include "hp/shard/manifest.h"

#include <fmt/core.h>

#include <toml++/toml.h>

#include "hp/core/fs.h"
#include "hp/recipe/toml_writer.h"

namespace hp::shard {
namespace {

// Reading helpers: a missing or mistyped key is an error at the table's position.
struct Reader {
  std::string file;
  std::vector<Diagnostic> problems;

  std::string at(const toml::node& n) const {
    const auto& b = n.source().begin;
    return b.line ? fmt::format("{}:{}:{}", file, b.line, b.column) : file;
  }
  template <class T>
  T get(const toml::table& t, std::string_view key, T dflt, bool required = true) {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) problems.push_back({at(t), fmt::format("manifest: missing key '{}'", key), ""});
      return dflt;
    }
    if (auto v = n->value<T>()) return *v;
    problems.push_back({at(*n), fmt::format("manifest: key '{}' has the wrong type", key), ""});
    return dflt;
  }
  std::vector<std::int64_t> int_list(const toml::table& t, std::string_view key) {
    std::vector<std::int64_t> v;
    const toml::array* a = t.get_as<toml::array>(key);
    if (!a) {
      problems.push_back({at(t), fmt::format("manifest: missing array '{}'", key), ""});
      return v;
    }
    for (const auto& e : *a) v.push_back(e.value<std::int64_t>().value_or(0));
    return v;
  }
  std::vector<std::string> str_list(const toml::node* n) {
    std::vector<std::string> v;
    if (const toml::array* a = n ? n->as_array() : nullptr)
      for (const auto& e : *a) v.push_back(e.value<std::string>().value_or(""));
    return v;
  }
  template <class F>
  void each(const toml::table& root, std::string_view key, F f) {
    const toml::array* a = root.get_as<toml::array>(key);
    if (!a) return;
    for (const auto& e : *a)
      if (const toml::table* t = e.as_table()) f(*t);
  }
};

}  // namespace

std::string format_manifest(const Manifest& m) {
  using recipe::TomlKeys, recipe::TomlWriter, recipe::toml_array, recipe::toml_inline_table,
      recipe::toml_int, recipe::toml_int_array, recipe::toml_string_array;
  TomlWriter w;
  w.comment("Written by hp shard: the per-rank partitions of this directory (see hp-shard(1)).");
  w.table("manifest")
      .integer("version", m.version)
      .string("model", m.model)
      .string("recipe", m.recipe)
      .integer("dp", m.dp)
      .integer("tp", m.tp)
      .integer("pp", m.pp)
      .boolean("weights", m.weights);
  if (m.micro_batches != 1) w.integer("micro_batches", m.micro_batches);
  if (m.virtual_stages != 1) w.integer("virtual_stages", m.virtual_stages);
  w.value("device_matrix", toml_int_array(m.device_matrix))
      .value("alias_name", toml_string_array(m.alias_name));
  std::vector<std::pair<std::string, std::string>> dims;
  for (const auto& [k, v] : m.dims) dims.emplace_back(k, toml_int(v));
  w.value("dims", toml_inline_table(dims, TomlKeys::quoted));
  for (const auto& r : m.ranks)
    w.array_table("ranks")
        .integer("rank", r.rank)
        .integer("stage", r.stage)
        .string("file", r.file)
        .integer("dp", r.dp)
        .integer("tp", r.tp)
        .integer("pp", r.pp);
  for (const auto& g : m.groups)
    w.array_table("groups")
        .string("name", g.name)
        .string("kind", g.kind)
        .value("members", toml_int_array(g.members));
  for (const auto& st : m.stages)
    w.array_table("stages")
        .integer("index", st.index)
        .value("layers", toml_int_array(st.layers))
        .value("ranks", toml_int_array(st.ranks));
  for (const auto& b : m.boundaries)
    w.array_table("boundaries")
        .string("tensor", b.tensor)
        .integer("from_stage", b.from_stage)
        .integer("to_stage", b.to_stage)
        .integer("tag", b.tag);
  auto layouts = [&](const char* key, const std::vector<ManifestLayout>& v) {
    for (const auto& l : v) {
      std::vector<std::string> map;
      for (const auto& axes : l.tensor_map) map.push_back(toml_string_array(axes));
      w.array_table(key)
          .string("tensor", l.tensor)
          .value("shape", toml_int_array(l.shape))
          .value("tensor_map", toml_array(map))
          .value("partial", toml_string_array(l.partial))
          .string("origin", l.origin);
      if (l.batched) w.boolean("batched", true);
    }
  };
  layouts("inputs", m.inputs);
  layouts("outputs", m.outputs);
  layouts("layouts", m.layouts);
  for (const auto& r : m.redistributions)
    w.array_table("redistributions")
        .string("tensor", r.tensor)
        .string("consumer", r.consumer)
        .string("from", r.from)
        .string("to", r.to)
        .value("steps", toml_string_array(r.steps));
  return std::move(w).str();
}

Expected<Manifest> parse_manifest(std::string_view text, const std::string& display_path) {
  toml::table root;
  try {
    root = toml::parse(text, display_path);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return Error(Errc::bad_input, fmt::format("manifest: TOML syntax error: {}", e.description()),
                 b.line ? fmt::format("{}:{}:{}", display_path, b.line, b.column) : display_path);
  }
  Reader rd{display_path, {}};
  Manifest m;
  const toml::table* head = root.get_as<toml::table>("manifest");
  if (!head) return Error(Errc::bad_input, "manifest: missing [manifest] table", display_path);
  m.version = static_cast<int>(rd.get<std::int64_t>(*head, "version", 1));
  if (m.version != 1)
    return Error(Errc::bad_input,
                 fmt::format("manifest: version {} is not supported (this hp reads 1)", m.version),
                 rd.at(*head));
  m.model = rd.get<std::string>(*head, "model", "");
  m.recipe = rd.get<std::string>(*head, "recipe", "");
  m.dp = rd.get<std::int64_t>(*head, "dp", 1);
  m.tp = rd.get<std::int64_t>(*head, "tp", 1);
  m.pp = rd.get<std::int64_t>(*head, "pp", 1);
  m.weights = rd.get<bool>(*head, "weights", true);
  m.micro_batches = rd.get<std::int64_t>(*head, "micro_batches", 1, false);
  m.virtual_stages = rd.get<std::int64_t>(*head, "virtual_stages", 1, false);
  if (m.virtual_stages < 1)
    rd.problems.push_back(
        {rd.at(*head),
         fmt::format("manifest: virtual_stages = {} (must be >= 1)", m.virtual_stages), ""});
  if (m.micro_batches < 1)
    rd.problems.push_back(
        {rd.at(*head), fmt::format("manifest: micro_batches = {} (must be >= 1)", m.micro_batches),
         ""});
  m.device_matrix = rd.int_list(*head, "device_matrix");
  m.alias_name = rd.str_list(head->get("alias_name"));
  if (const toml::table* d = head->get_as<toml::table>("dims"))
    for (auto&& [k, v] : *d) m.dims[std::string(k.str())] = v.value<std::int64_t>().value_or(0);
  rd.each(root, "ranks", [&](const toml::table& t) {
    ManifestRank r;
    r.rank = rd.get<std::int64_t>(t, "rank", 0);
    r.stage = static_cast<int>(rd.get<std::int64_t>(t, "stage", 0));
    r.file = rd.get<std::string>(t, "file", "");
    r.dp = rd.get<std::int64_t>(t, "dp", 0);
    r.tp = rd.get<std::int64_t>(t, "tp", 0);
    r.pp = rd.get<std::int64_t>(t, "pp", 0);
    if (r.stage < 0 || r.stage >= m.pp * m.virtual_stages)
      rd.problems.push_back({rd.at(t),
                             fmt::format("manifest: rank {} names stage {}, there are {}", r.rank,
                                         r.stage, m.pp * m.virtual_stages),
                             ""});
    m.ranks.push_back(r);
  });
  rd.each(root, "groups", [&](const toml::table& t) {
    m.groups.push_back({rd.get<std::string>(t, "name", ""), rd.get<std::string>(t, "kind", ""),
                        rd.int_list(t, "members")});
  });
  rd.each(root, "stages", [&](const toml::table& t) {
    m.stages.push_back({static_cast<int>(rd.get<std::int64_t>(t, "index", 0)),
                        rd.int_list(t, "layers"), rd.int_list(t, "ranks")});
  });
  rd.each(root, "boundaries", [&](const toml::table& t) {
    m.boundaries.push_back({rd.get<std::string>(t, "tensor", ""),
                            static_cast<int>(rd.get<std::int64_t>(t, "from_stage", 0)),
                            static_cast<int>(rd.get<std::int64_t>(t, "to_stage", 0)),
                            static_cast<int>(rd.get<std::int64_t>(t, "tag", 0))});
  });
  auto layouts = [&](const char* key, std::vector<ManifestLayout>& out) {
    rd.each(root, key, [&](const toml::table& t) {
      ManifestLayout l;
      l.tensor = rd.get<std::string>(t, "tensor", "");
      l.shape = rd.int_list(t, "shape");
      if (const toml::array* a = t.get_as<toml::array>("tensor_map"))
        for (const auto& e : *a) l.tensor_map.push_back(rd.str_list(&e));
      l.partial = rd.str_list(t.get("partial"));
      l.origin = rd.get<std::string>(t, "origin", "", false);
      l.batched = rd.get<bool>(t, "batched", false, false);
      if (l.tensor_map.size() != l.shape.size())
        rd.problems.push_back({rd.at(t),
                               fmt::format("manifest: '{}' has {} dims but a tensor_map of {}",
                                           l.tensor, l.shape.size(), l.tensor_map.size()),
                               ""});
      out.push_back(std::move(l));
    });
  };
  layouts("inputs", m.inputs);
  layouts("outputs", m.outputs);
  layouts("layouts", m.layouts);
  rd.each(root, "redistributions", [&](const toml::table& t) {
    ManifestRedistribution r;
    r.tensor = rd.get<std::string>(t, "tensor", "");
    r.consumer = rd.get<std::string>(t, "consumer", "");
    r.from = rd.get<std::string>(t, "from", "");
    r.to = rd.get<std::string>(t, "to", "");
    r.steps = rd.str_list(t.get("steps"));
    m.redistributions.push_back(std::move(r));
  });
  if (!rd.problems.empty()) return collect_errors(Errc::bad_input, std::move(rd.problems));
  return m;
}

Expected<Manifest> read_manifest(const std::filesystem::path& path) {
  HP_ASSIGN_OR_RETURN(auto text, read_file(path));
  return parse_manifest(text, path.string());
}

}  // namespace hp::shard
