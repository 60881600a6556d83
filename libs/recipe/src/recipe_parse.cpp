// Reading a recipe. The recipe is the artifact users edit by hand, so the reader is strict (unknown
// keys are errors, with a did-you-mean hint, because a misspelt "micro_batchs" silently falling
// back to a default would be worse than refusing) and exhaustive (every problem in one run). Each
// section has one reader function that lists its keys; recipe_validate.cpp then checks values
// against each other. An unsupported [recipe] version stops reading early: its keys may mean
// something else.
//
// Enumerations accept their documented names only ("1f1b", not "1F1B"); optimizer_shard also
// accepts its ZeRO level as an integer, since that is how most users know it.
#include <fmt/core.h>

#include "hp/core/checked.h"
#include "hp/core/fs.h"
#include "hp/recipe/recipe.h"
#include "toml_reader.h"

namespace hp::recipe {
namespace {

using detail::TomlReader;

// Reads an enumeration given as a string; unknown names are reported with the list of valid ones.
template <class E, std::size_t N>
std::optional<E> get_enum(TomlReader& rd, const toml::table& t, std::string_view key,
                          const std::string& path,
                          const std::pair<std::string_view, E> (&names)[N]) {
  auto s = rd.get_string(t, key, path, false);
  if (!s) return std::nullopt;
  std::vector<std::string_view> valid;
  for (const auto& [name, value] : names) {
    if (*s == name) return value;
    valid.push_back(name);
  }
  std::string list;
  for (auto v : valid) list += (list.empty() ? "" : ", ") + std::string(v);
  std::string hint = detail::did_you_mean(*s, valid);
  rd.error(rd.loc(t.get(key)->source()),
           fmt::format("'{}' must be one of {}, got '{}'", TomlReader::join(path, key), list, *s),
           hint.empty() ? "valid values: " + list : hint);
  return std::nullopt;
}

constexpr std::pair<std::string_view, Schedule> kSchedules[] = {
    {"gpipe", Schedule::gpipe},
    {"1f1b", Schedule::one_f_one_b},
    {"interleaved", Schedule::interleaved},
    {"zb-h1", Schedule::zb_h1},
    {"zbv", Schedule::zbv}};
constexpr std::pair<std::string_view, bool> kDispatches[] = {{"routed", true}, {"gather", false}};
constexpr std::pair<std::string_view, bool> kZero3Gathers[] = {{"per-use", false},
                                                               {"per-step", true}};
constexpr std::pair<std::string_view, Recompute> kRecomputes[] = {
    {"none", Recompute::none}, {"selective", Recompute::selective}, {"full", Recompute::full}};
constexpr std::pair<std::string_view, int> kShardLevels[] = {
    {"none", 0}, {"optimizer", 1}, {"gradients", 2}, {"parameters", 3}};

void read_head(TomlReader& rd, const toml::table& t, Recipe& r) {
  rd.check_keys(t, "recipe", {"version", "name", "model", "cluster", "nodes"});
  if (auto v = rd.get_string(t, "name", "recipe", true)) r.name = *v;
  if (auto v = rd.get_string(t, "model", "recipe", true)) r.model = *v;
  if (auto v = rd.get_string(t, "cluster", "recipe", true)) r.cluster = *v;
  if (auto v = rd.get_int(t, "nodes", "recipe", false)) r.nodes = *v;
}

void read_model(TomlReader& rd, const toml::table& t, Recipe& r) {
  rd.check_keys(t, "model", {"dims"});
  const toml::table* dims = rd.get_table(t, "dims", "model", false);
  if (!dims) return;
  for (auto&& [k, v] : *dims) {
    auto n = rd.get_int(*dims, k.str(), "model.dims", true);
    if (!n) continue;
    // The model loader's bound on a dim (hp/core/checked.h): refused here too, so that
    // `verify --static` says what `shard` would.
    if (*n < 1 || *n > kMaxDim) {
      rd.error(rd.loc(v.source()),
               fmt::format("model.dims.{} = {} is outside 1..2^40", k.str(), *n),
               "a dim is a batch, sequence or similar size: a positive number of elements");
      continue;
    }
    r.dims[std::string(k.str())] = *n;
  }
}

void read_parallel(TomlReader& rd, const toml::table& t, Parallel& p) {
  const std::string path = "parallel";
  rd.check_keys(t, path,
                {"dp", "tp", "pp", "optimizer_shard", "shard_group", "micro_batch_size",
                 "micro_batches", "schedule", "virtual_stages", "sequence_parallel",
                 "expert_parallel", "bucket_mb", "expert_dispatch", "zero3_gather"});
  if (auto v = rd.get_int(t, "dp", path, true)) p.dp = *v;
  if (auto v = rd.get_int(t, "tp", path, true)) p.tp = *v;
  if (auto v = rd.get_int(t, "pp", path, true)) p.pp = *v;
  if (const toml::node* n = t.get("optimizer_shard"); n && n->is_integer()) {
    if (auto v = rd.get_int(t, "optimizer_shard", path, false))
      p.optimizer_shard = static_cast<int>(*v);
  } else if (n && n->is_string()) {
    if (auto v = get_enum(rd, t, "optimizer_shard", path, kShardLevels)) p.optimizer_shard = *v;
  } else if (n) {
    rd.error(
        rd.loc(n->source()),
        fmt::format("'parallel.optimizer_shard' must be an integer 0..3 or a level name, got {}",
                    detail::type_phrase(n->type())),
        "levels: 0 none, 1 optimizer, 2 gradients, 3 parameters");
  }
  if (auto v = rd.get_int(t, "shard_group", path, false)) p.shard_group = *v;
  if (auto v = rd.get_number(t, "bucket_mb", path, false)) p.bucket_mb = *v;
  if (auto v = rd.get_int(t, "micro_batch_size", path, false)) p.micro_batch_size = *v;
  if (auto v = rd.get_int(t, "micro_batches", path, false)) p.micro_batches = *v;
  if (auto v = get_enum(rd, t, "schedule", path, kSchedules)) p.schedule = *v;
  if (auto v = rd.get_int(t, "virtual_stages", path, false))
    p.virtual_stages = *v;
  else if (p.schedule == Schedule::zbv && !t.contains("virtual_stages"))
    p.virtual_stages = 2;  // the V always has two chunks per rank
  if (auto v = rd.get_bool(t, "sequence_parallel", path, false)) p.sequence_parallel = *v;
  if (auto v = rd.get_int(t, "expert_parallel", path, false)) p.expert_parallel = *v;
  if (auto v = get_enum(rd, t, "expert_dispatch", path, kDispatches)) p.routed_experts = *v;
  if (auto v = get_enum(rd, t, "zero3_gather", path, kZero3Gathers)) p.zero3_per_step = *v;
}

void read_stage(TomlReader& rd, const toml::table& t, const std::string& path, Stage& s) {
  rd.check_keys(t, path, {"index", "layers", "recompute", "recompute_layers", "ranks"});
  if (auto v = rd.get_int(t, "index", path, true)) s.index = *v;
  if (auto v = rd.get_int_list(t, "layers", path, true)) s.layers = *v;
  if (auto v = get_enum(rd, t, "recompute", path, kRecomputes)) s.recompute = *v;
  // recompute_layers = { full = "4-5", selective = [2] }: the keys are recompute modes.
  if (const toml::table* o = rd.get_table(t, "recompute_layers", path, false)) {
    const std::string sub = TomlReader::join(path, "recompute_layers");
    rd.check_keys(*o, sub, {"none", "selective", "full"});
    for (const auto& [name, mode] : kRecomputes)
      if (auto v = rd.get_int_list(*o, name, sub, false)) s.recompute_layers[mode] = *v;
  }
  if (auto v = rd.get_int_list(t, "ranks", path, false)) s.ranks = *v;
}

// tensor_map entries: "dp", "None", or ["dp", "sp"] (a dimension split over several axes).
void read_tensor_map(TomlReader& rd, const toml::table& t, const std::string& path, Layout& l) {
  const toml::array* a = rd.get_array(t, "tensor_map", path, true);
  if (!a) return;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const toml::node& e = *a->get(i);
    std::vector<std::string> axes;
    if (auto s = e.as_string()) {
      if (s->get() != "None") axes.push_back(s->get());
    } else if (auto inner = e.as_array()) {
      for (const auto& x : *inner) {
        if (auto xs = x.as_string()) {
          axes.push_back(xs->get());
        } else {
          rd.error(rd.loc(x.source()),
                   fmt::format("'{}.tensor_map[{}]' entries must be axis names, got {}", path, i,
                               detail::type_phrase(x.type())));
        }
      }
    } else {
      rd.error(rd.loc(e.source()), fmt::format("'{}.tensor_map[{}]' must be an axis name, \"None\" "
                                               "or an array of axis names, got {}",
                                               path, i, detail::type_phrase(e.type())));
    }
    l.tensor_map.push_back(std::move(axes));
  }
}

void read_layout(TomlReader& rd, const toml::table& t, const std::string& path, Layout& l) {
  rd.check_keys(t, path, {"device_matrix", "alias_name", "tensor_map", "rank_list"});
  if (auto v = rd.get_int_list(t, "device_matrix", path, true)) l.device_matrix = *v;
  if (auto v = rd.get_string_list(t, "alias_name", path, true)) l.alias_name = *v;
  read_tensor_map(rd, t, path, l);
  if (auto v = rd.get_int_list(t, "rank_list", path, false)) l.rank_list = *v;
}

void read_group(TomlReader& rd, const toml::table& t, const std::string& path, Group& g) {
  rd.check_keys(t, path, {"name", "ranks", "module", "backend", "env", "inputs", "outputs"});
  if (auto v = rd.get_string(t, "name", path, true)) g.name = *v;
  if (auto v = rd.get_int_list(t, "ranks", path, true)) g.ranks = *v;
  if (auto v = rd.get_string(t, "module", path, false)) g.module = *v;
  if (auto v = rd.get_string(t, "backend", path, false)) g.backend = *v;
  if (const toml::table* env = rd.get_table(t, "env", path, false))
    for (auto&& [k, v] : *env)
      if (auto s = rd.get_string(*env, k.str(), TomlReader::join(path, "env"), true))
        g.env[std::string(k.str())] = *s;
  if (auto v = rd.get_string_list(t, "inputs", path, false)) g.inputs = *v;
  if (auto v = rd.get_string_list(t, "outputs", path, false)) g.outputs = *v;
}

void read_sourced(TomlReader& rd, const toml::table& t, std::string_view key, bool bytes,
                  SourcedValue& out) {
  auto v = bytes ? rd.get_bytes(t, key, "offload", false) : rd.get_rate(t, key, "offload", false);
  if (v) out.value = *v, out.source = "user";  // typed in by hand unless a source says otherwise
  if (auto s = rd.get_string(t, std::string(key) + "_source", "offload", false)) out.source = *s;
}

void read_offload(TomlReader& rd, const toml::table& t, Offload& o) {
  rd.check_keys(t, "offload",
                {"enabled", "targets", "h2d_bandwidth", "h2d_bandwidth_source", "d2h_bandwidth",
                 "d2h_bandwidth_source", "host_memory", "host_memory_source", "margin",
                 "prefetch_lookahead", "device_budget"});
  if (auto v = rd.get_bool(t, "enabled", "offload", true)) o.enabled = *v;
  if (auto v = rd.get_string_list(t, "targets", "offload", false)) o.targets = *v;
  read_sourced(rd, t, "h2d_bandwidth", false, o.h2d_bandwidth);
  read_sourced(rd, t, "d2h_bandwidth", false, o.d2h_bandwidth);
  read_sourced(rd, t, "host_memory", true, o.host_memory);
  if (auto v = rd.get_number(t, "margin", "offload", false)) o.margin = *v;
  if (auto v = rd.get_int(t, "prefetch_lookahead", "offload", false)) o.prefetch_lookahead = *v;
  if (auto v = rd.get_bytes(t, "device_budget", "offload", false)) o.device_budget = *v;
}

void read_workload(TomlReader& rd, const toml::table& t, Workload& w) {
  rd.check_keys(t, "workload", {"mode", "dtype", "optimizer", "global_batch", "seq", "command"});
  if (auto v = rd.get_string(t, "mode", "workload", false)) w.mode = *v;
  if (auto v = rd.get_string(t, "dtype", "workload", false)) w.dtype = *v;
  if (auto v = rd.get_string(t, "optimizer", "workload", false)) w.optimizer = *v;
  if (auto v = rd.get_int(t, "global_batch", "workload", false)) w.global_batch = *v;
  if (auto v = rd.get_int(t, "seq", "workload", false)) w.seq = *v;
  if (auto v = rd.get_string(t, "command", "workload", false)) w.command = *v;
}

// [train]: names are read as strings here and checked against their lists in recipe_validate.cpp,
// beside the numeric ranges, so a wrong name and a wrong number read the same way.
void read_train(TomlReader& rd, const toml::table& t, Train& tr) {
  const std::string path = "train";
  rd.check_keys(
      t, path,
      {"loss", "logits", "labels", "optimizer", "lr", "betas", "eps", "weight_decay", "momentum",
       "clip_norm", "lr_schedule", "warmup_steps", "min_lr", "steps", "seed", "frozen"});
  if (auto v = rd.get_string(t, "loss", path, false)) tr.loss = *v;
  if (auto v = rd.get_string(t, "logits", path, false)) tr.logits = *v;
  if (auto v = rd.get_string(t, "labels", path, false)) tr.labels = *v;
  if (auto v = rd.get_string(t, "optimizer", path, false)) tr.optimizer = *v;
  if (auto v = rd.get_number(t, "lr", path, false)) tr.lr = *v;
  if (const toml::array* a = rd.get_array(t, "betas", path, false)) {
    std::vector<double> betas;
    bool ok = true;
    for (std::size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = *a->get(i);
      if (auto f = e.as_floating_point()) {
        betas.push_back(f->get());
      } else if (auto n = e.as_integer()) {
        betas.push_back(static_cast<double>(n->get()));
      } else {
        ok = false;
        rd.error(rd.loc(e.source()),
                 fmt::format("'train.betas[{}]' must be a number, got {}", i,
                             detail::type_phrase(e.type())),
                 "write two numbers, e.g. betas = [0.9, 0.999]");
      }
    }
    if (ok) tr.betas = std::move(betas);
  }
  if (auto v = rd.get_number(t, "eps", path, false)) tr.eps = *v;
  if (auto v = rd.get_number(t, "weight_decay", path, false)) tr.weight_decay = *v;
  if (auto v = rd.get_number(t, "momentum", path, false)) tr.momentum = *v;
  if (auto v = rd.get_number(t, "clip_norm", path, false)) tr.clip_norm = *v;
  if (auto v = rd.get_string(t, "lr_schedule", path, false)) tr.lr_schedule = *v;
  if (auto v = rd.get_int(t, "warmup_steps", path, false)) tr.warmup_steps = *v;
  if (auto v = rd.get_number(t, "min_lr", path, false)) tr.min_lr = *v;
  if (auto v = rd.get_int(t, "steps", path, false)) tr.steps = *v;
  if (auto v = rd.get_int(t, "seed", path, false)) tr.seed = *v;
  if (auto v = rd.get_string_list(t, "frozen", path, false)) tr.frozen = *v;
}

template <class T, class F>
void read_table_array(TomlReader& rd, const toml::table& root, std::string_view key,
                      std::vector<T>& out, F each) {
  const toml::array* a = rd.get_array(root, key, "", false);
  if (!a) return;
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::string path = fmt::format("{}[{}]", key, i);
    const toml::node& n = *a->get(i);
    out.emplace_back();
    if (auto t = n.as_table())
      each(*t, path, out.back());
    else
      rd.error(rd.loc(n.source()),
               fmt::format("'{}' must be a table, got {}", path, detail::type_phrase(n.type())),
               fmt::format("write each entry as a [[{}]] section", key));
  }
}

}  // namespace

RecipeDocument parse_recipe(std::string_view text, const std::string& display_path) {
  RecipeDocument doc{Recipe{}, SourceMap(display_path), {}, false};
  auto root = detail::parse_toml(text, display_path, doc.problems);
  if (!root) return doc;
  doc.syntax_ok = true;
  TomlReader rd(doc.where, doc.problems);
  Recipe& r = doc.recipe;

  rd.check_keys(*root, "",
                {"recipe", "model", "parallel", "stages", "layouts", "groups", "offload",
                 "workload", "train"});
  const toml::table* head = rd.get_table(*root, "recipe", "", true);
  if (head) {
    // The version decides how the rest reads, so an unsupported one stops here.
    if (auto v = rd.get_int(*head, "version", "recipe", true)) {
      if (*v != kRecipeVersion) {
        rd.error(
            doc.where.at("recipe.version"), fmt::format("unsupported recipe version {}", *v),
            fmt::format(
                "this hp reads recipe version {}; use the hp that wrote it, or run 'hp plan' again",
                kRecipeVersion));
        return doc;
      }
      r.version = static_cast<int>(*v);
    }
    read_head(rd, *head, r);
  }
  if (const toml::table* t = rd.get_table(*root, "model", "", false)) read_model(rd, *t, r);
  if (const toml::table* t = rd.get_table(*root, "parallel", "", true))
    read_parallel(rd, *t, r.parallel);
  read_table_array(
      rd, *root, "stages", r.stages,
      [&](const toml::table& t, const std::string& path, Stage& s) { read_stage(rd, t, path, s); });
  if (const toml::table* layouts = rd.get_table(*root, "layouts", "", false)) {
    for (auto&& [k, v] : *layouts) {
      std::string path = TomlReader::join("layouts", k.str());
      if (const toml::table* t = rd.get_table(*layouts, k.str(), "layouts", true))
        read_layout(rd, *t, path, r.layouts[std::string(k.str())]);
    }
  }
  read_table_array(
      rd, *root, "groups", r.groups,
      [&](const toml::table& t, const std::string& path, Group& g) { read_group(rd, t, path, g); });
  if (const toml::table* t = rd.get_table(*root, "offload", "", false))
    read_offload(rd, *t, r.offload.emplace());
  if (const toml::table* t = rd.get_table(*root, "workload", "", false))
    read_workload(rd, *t, r.workload.emplace());
  if (const toml::table* t = rd.get_table(*root, "train", "", false))
    read_train(rd, *t, r.train.emplace());

  detail::append_new(doc.problems, validate_recipe(r, doc.where));
  detail::sort_by_location(doc.problems);
  return doc;
}

Expected<RecipeDocument> read_recipe(const std::filesystem::path& path) {
  HP_ASSIGN_OR_RETURN(auto text, read_file(path));
  // A model handed where a recipe is expected would otherwise fail as a TOML syntax error at some
  // binary byte; a NUL in the text (protobuf has them, TOML may not) or the extension says which.
  if (path.extension() == ".onnx" || text.find('\0') != std::string::npos)
    return Error(Errc::bad_input,
                 path.extension() == ".onnx"
                     ? "this is an onnx model, not a recipe"
                     : "this is a binary file (an onnx model?), not a recipe",
                 path.string(),
                 "did you mean `hp plan MODEL` or `hp launch MODEL`? (`hp plan MODEL -o "
                 "RECIPE.toml` writes a recipe for it)");
  return parse_recipe(text, path.string());
}

Expected<Recipe> load_recipe(const std::filesystem::path& path) {
  HP_ASSIGN_OR_RETURN(auto doc, read_recipe(path));
  if (!doc.problems.empty()) return collect_errors(Errc::bad_input, std::move(doc.problems));
  return std::move(doc.recipe);
}

}  // namespace hp::recipe
