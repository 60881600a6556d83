// manifest.toml writing (hp/recipe/toml_writer.h: fixed key order, so manifests diff well) and
// reading (TOML++).
#include "hp/shard/manifest.h"

#include <fmt/core.h>

#include <toml++/toml.h>

#include <limits>
#include <set>

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

// Degrees, counts and sizes are bounded like the recipe's (libs/recipe/src/recipe_validate.cpp), so
// products of them cannot overflow and nothing read here sizes an allocation unchecked.
constexpr std::int64_t kMaxCount = std::int64_t{1} << 20;
constexpr std::int64_t kMaxElements = std::int64_t{1} << 50;

// Stage numbers and tags are ints: a value outside int's range reads as -1 (refused as a stage)
// rather than wrapping into a valid-looking one.
int small(std::int64_t v) {
  return v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()
             ? -1
             : static_cast<int>(v);
}

// A partition file is a plain name inside the manifest's directory: no separators, no "..", no
// absolute path, nothing hidden.
bool plain_file_name(const std::string& f) {
  if (f.empty() || f.front() == '.' || f.size() > 255) return false;
  for (char c : f)
    if (c == '/' || c == '\\' || static_cast<unsigned char>(c) < 0x20) return false;
  return true;
}

// What the runtime assumes of a manifest (libs/job/src/sharded.cpp: rank_inputs, assemble_outputs,
// run_rank) checked once here: every coordinate within its degree, every rank and stage number
// within the counts, no rank entry twice, shapes bounded and their tensor maps on the mesh.
void check_manifest(const Manifest& m, const std::string& file, std::vector<Diagnostic>& out) {
  auto fail = [&](std::string msg) { out.push_back({file, "manifest: " + std::move(msg), ""}); };
  bool counts_ok = true;
  for (auto [key, v] : {std::pair<const char*, std::int64_t>{"dp", m.dp},
                        {"tp", m.tp},
                        {"pp", m.pp},
                        {"micro_batches", m.micro_batches},
                        {"virtual_stages", m.virtual_stages}})
    if (v < 1 || v > kMaxCount) {
      fail(fmt::format("{} = {} (must be 1..{})", key, v, kMaxCount));
      counts_ok = false;
    }
  if (!counts_ok) return;  // everything below multiplies them
  const std::int64_t world = m.dp * m.tp * m.pp;
  const std::int64_t stages = m.pp * m.virtual_stages;
  if (world > kMaxCount || stages > kMaxCount)
    return fail(
        fmt::format("dp*tp*pp = {} ranks, {} stages (at most {} each)", world, stages, kMaxCount));
  // The stage mesh is [dp, tp] (hp/shard/shard.h).
  std::int64_t devices = 1;
  for (auto d : m.device_matrix) {
    if (d < 1 || d > kMaxCount) return fail(fmt::format("device_matrix has an axis of {}", d));
    devices *= d;
    if (devices > kMaxCount) return fail("device_matrix has too many devices");
  }
  if (m.device_matrix.size() != m.alias_name.size())
    fail(fmt::format("device_matrix has {} axes but alias_name has {}", m.device_matrix.size(),
                     m.alias_name.size()));
  if (devices != m.dp * m.tp)
    fail(fmt::format("device_matrix holds {} devices but dp*tp is {}", devices, m.dp * m.tp));
  std::set<std::pair<std::int64_t, int>> seen;
  for (const auto& r : m.ranks) {
    if (r.rank < 0 || r.rank >= world)
      fail(fmt::format("rank {} is outside 0..{}", r.rank, world - 1));
    if (r.stage < 0 || r.stage >= stages)
      fail(fmt::format("rank {} names stage {}, there are {}", r.rank, r.stage, stages));
    else if (r.dp < 0 || r.dp >= m.dp || r.tp < 0 || r.tp >= m.tp || r.pp < 0 || r.pp >= stages)
      fail(fmt::format("rank {} has coordinates dp={} tp={} pp={} outside dp={} tp={} pp={}",
                       r.rank, r.dp, r.tp, r.pp, m.dp, m.tp, stages));
    else if (r.stage % m.pp != r.pp % m.pp)  // pp is the stage's, with virtual stages
      fail(fmt::format("rank {} runs stage {} but its pipeline coordinate is {}", r.rank, r.stage,
                       r.pp));
    if (!seen.emplace(r.rank, r.stage).second)
      fail(fmt::format("rank {} lists stage {} twice", r.rank, r.stage));
    if (!plain_file_name(r.file))
      fail(fmt::format("rank {}'s file '{}' is not a plain file name in the manifest's directory",
                       r.rank, r.file));
  }
  // Whether the table is complete is the recipe's question (attach_manifest compares the rank
  // count; run_rank wants every chunk of its rank): here, only that no entry is out of bounds.
  if (static_cast<std::int64_t>(m.ranks.size()) > world * m.virtual_stages)
    fail(fmt::format("the rank table has {} entries; dp*tp*pp = {} ranks with {} chunk(s) each",
                     m.ranks.size(), world, m.virtual_stages));
  for (const auto& g : m.groups)
    for (auto r : g.members)
      if (r < 0 || r >= world) fail(fmt::format("group '{}' names rank {}", g.name, r));
  for (const auto& st : m.stages) {
    if (st.index < 0 || st.index >= stages)
      fail(fmt::format("stage index {} is outside 0..{}", st.index, stages - 1));
    for (auto r : st.ranks)
      if (r < 0 || r >= world) fail(fmt::format("stage {} names rank {}", st.index, r));
  }
  for (const auto& b : m.boundaries)
    if (b.from_stage < 0 || b.from_stage >= stages || b.to_stage < 0 || b.to_stage >= stages)
      fail(fmt::format("boundary '{}' joins stages {} and {}; there are {}", b.tensor, b.from_stage,
                       b.to_stage, stages));
  for (const auto& [name, v] : m.dims)
    if (v < 1) fail(fmt::format("dim '{}' = {} (must be >= 1)", name, v));
  const std::set<std::string> axes(m.alias_name.begin(), m.alias_name.end());
  auto layouts = [&](const std::vector<ManifestLayout>& v) {
    for (const auto& l : v) {
      std::int64_t n = 1;
      for (auto d : l.shape) {
        if (d < 0 || (d > 0 && n > kMaxElements / d)) {
          fail(fmt::format("'{}' has a shape with dim {} (at most {} elements in all)", l.tensor, d,
                           kMaxElements));
          break;
        }
        n *= d;
      }
      if (l.batched && l.shape.empty()) fail(fmt::format("'{}' is batched but a scalar", l.tensor));
      for (const auto& dim : l.tensor_map)
        for (const auto& a : dim)
          if (!axes.count(a))
            fail(fmt::format("'{}' is split over unknown axis '{}'", l.tensor, a));
      for (const auto& a : l.partial)
        if (!axes.count(a))
          fail(fmt::format("'{}' is partial over unknown axis '{}'", l.tensor, a));
    }
  };
  layouts(m.inputs);
  layouts(m.outputs);
  layouts(m.layouts);
}

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
  m.version = small(rd.get<std::int64_t>(*head, "version", 1));
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
    r.stage = small(rd.get<std::int64_t>(t, "stage", 0));
    // Located here (the check after parsing knows only the file); the degrees may be anything yet.
    const bool bounded =
        m.pp >= 1 && m.pp <= kMaxCount && m.virtual_stages >= 1 && m.virtual_stages <= kMaxCount;
    if (bounded && (r.stage < 0 || r.stage >= m.pp * m.virtual_stages))
      rd.problems.push_back({rd.at(t),
                             fmt::format("manifest: rank {} names stage {}, there are {}", r.rank,
                                         r.stage, m.pp * m.virtual_stages),
                             ""});
    r.file = rd.get<std::string>(t, "file", "");
    r.dp = rd.get<std::int64_t>(t, "dp", 0);
    r.tp = rd.get<std::int64_t>(t, "tp", 0);
    r.pp = rd.get<std::int64_t>(t, "pp", 0);
    m.ranks.push_back(r);
  });
  rd.each(root, "groups", [&](const toml::table& t) {
    m.groups.push_back({rd.get<std::string>(t, "name", ""), rd.get<std::string>(t, "kind", ""),
                        rd.int_list(t, "members")});
  });
  rd.each(root, "stages", [&](const toml::table& t) {
    m.stages.push_back({small(rd.get<std::int64_t>(t, "index", 0)), rd.int_list(t, "layers"),
                        rd.int_list(t, "ranks")});
  });
  rd.each(root, "boundaries", [&](const toml::table& t) {
    m.boundaries.push_back(
        {rd.get<std::string>(t, "tensor", ""), small(rd.get<std::int64_t>(t, "from_stage", 0)),
         small(rd.get<std::int64_t>(t, "to_stage", 0)), small(rd.get<std::int64_t>(t, "tag", 0))});
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
  if (rd.problems.empty()) check_manifest(m, display_path, rd.problems);
  if (!rd.problems.empty()) return collect_errors(Errc::bad_input, std::move(rd.problems));
  return m;
}

Expected<Manifest> read_manifest(const std::filesystem::path& path) {
  HP_ASSIGN_OR_RETURN(auto text, read_file(path));
  return parse_manifest(text, path.string());
}

}  // namespace hp::shard
