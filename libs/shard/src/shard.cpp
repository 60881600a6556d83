// hp shard: from a recipe to the propagated layouts and the per-stage node sets (prepare), then to
// the partition directory (write_partitions, manifest_build.cpp) or an explanation (explain.cpp).
#include "hp/shard/shard.h"

#include <fmt/core.h>
#include <fnmatch.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "hp/model/names.h"
#include "hp/recipe/verify.h"

namespace hp::shard {
namespace {

// The key path the recipe's SourceMap records for a [layouts."<name>"] table.
std::string layout_key(const std::string& name) {
  bool bare = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  if (bare) return "layouts." + name;
  std::string out = "layouts.\"";
  for (char c : name) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

bool is_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

Error at(Error e, std::string where) {
  e.what.where = std::move(where);
  return e;
}

// The stage mesh [dp, tp]; a recipe's [layouts] may rename its axes but not reshape it.
Expected<Mesh> stage_mesh(const Prepared& p) {
  const auto& r = p.recipe;
  std::vector<std::int64_t> dims{r.parallel.dp, r.parallel.tp};
  std::vector<std::string> axes{"dp", "tp"};
  const recipe::Layout* first = nullptr;
  std::string first_name;
  for (const auto& [name, l] : r.layouts) {
    std::string where = p.where.at(layout_key(name) + ".device_matrix");
    std::int64_t n = std::accumulate(l.device_matrix.begin(), l.device_matrix.end(),
                                     std::int64_t{1}, std::multiplies<>());
    if (n != r.parallel.dp * r.parallel.tp)
      return Error(
          Errc::bad_input,
          fmt::format(
              "layout of '{}': its mesh has {} devices, but each pipeline stage of the recipe has "
              "dp*tp = {}*{} = {}",
              name, n, r.parallel.dp, r.parallel.tp, r.parallel.dp * r.parallel.tp),
          where, fmt::format("use device_matrix = [{}, {}]", r.parallel.dp, r.parallel.tp));
    if (l.device_matrix != dims)
      return Error(
          Errc::bad_input,
          fmt::format("layout of '{}': device_matrix must be the stage mesh [dp, tp] = [{}, {}]",
                      name, r.parallel.dp, r.parallel.tp),
          where);
    if (!l.rank_list.empty()) {
      std::vector<std::int64_t> iota(static_cast<std::size_t>(n));
      std::iota(iota.begin(), iota.end(), 0);
      if (l.rank_list != iota)
        return Error(Errc::bad_input,
                     fmt::format("layout of '{}': a permuted rank_list is not supported by "
                                 "partitioning; stage ranks "
                                 "come from [[stages]] ranks",
                                 name),
                     p.where.at(layout_key(name) + ".rank_list"));
    }
    if (!first) {
      first = &l;
      first_name = name;
      axes = l.alias_name;
    } else if (l.alias_name != first->alias_name) {
      return Error(
          Errc::bad_input,
          fmt::format(
              "layout of '{}': alias_name differs from that of '{}'; all layouts share one mesh",
              name, first_name),
          p.where.at(layout_key(name) + ".alias_name"));
    }
  }
  auto m = Mesh::make(dims, axes);
  if (!m && first)
    return at(std::move(m).error(), p.where.at(layout_key(first_name) + ".alias_name"));
  return m;
}

// A [layouts] key that names no parameter: the closest names when it is a plain name (a PyTorch
// name the exporter renamed is found through its scope, hp/model/names.h), else where names are.
std::string layout_hint(const model::Graph& g, const std::string& name) {
  const auto close =
      is_glob(name) ? std::vector<std::string>{} : model::similar_tensor_names(g, name);
  if (close.empty())
    return "'hp shard RECIPE --explain NAME' shows a tensor; names are the ONNX initializer names";
  std::string list;
  for (std::size_t i = 0; i < close.size(); ++i)
    list += fmt::format("{}'{}'", i == 0 ? "" : i + 1 == close.size() ? " or " : ", ", close[i]);
  return fmt::format("did you mean {}? layouts name the ONNX initializers", list);
}

Status declare_layouts(const Prepared& p, PropagateOptions& o) {
  const auto& g = p.graph;
  std::vector<std::pair<std::string, const recipe::Layout*>> order;
  for (const auto& [name, l] : p.recipe.layouts)
    if (is_glob(name)) order.emplace_back(name, &l);
  for (const auto& [name, l] : p.recipe.layouts)
    if (!is_glob(name)) order.emplace_back(name, &l);  // exact names win over globs
  for (const auto& [name, l] : order) {
    std::string where = p.where.at(layout_key(name));
    std::vector<int> hits;
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
      const auto& tensor = g.tensors[t];
      bool eligible =
          tensor.kind == model::TensorKind::initializer || tensor.kind == model::TensorKind::input;
      if (!eligible) continue;
      bool match =
          is_glob(name) ? fnmatch(name.c_str(), tensor.name.c_str(), 0) == 0 : tensor.name == name;
      if (match) hits.push_back(static_cast<int>(t));
    }
    if (hits.empty()) {
      int any = g.find_tensor(name);
      return Error(
          Errc::bad_input,
          any >= 0
              ? fmt::format(
                    "layout of '{}': only parameters and graph inputs take layouts; this tensor "
                    "is computed (its layout is propagated)",
                    name)
              : fmt::format("layout '{}' matches no parameter or graph input of {}", name,
                            p.model_path.filename().string()),
          where, layout_hint(g, name));
    }
    for (int t : hits) {
      const auto& tensor = g.tensor(t);
      auto s = parse_tensor_map(o.mesh, l->tensor_map, tensor.name,
                                static_cast<int>(tensor.dims.size()));
      if (!s) return at(std::move(s).error(), p.where.at(layout_key(name) + ".tensor_map"));
      auto ok = check_shape(o.mesh, *s, global_shape(tensor), tensor.name);
      if (!ok) return at(std::move(ok).error(), p.where.at(layout_key(name) + ".tensor_map"));
      o.declared[t] = *s;
      o.declared_where[t] = where;
    }
  }
  return {};
}

// Stages are virtual stages: with an interleaved schedule each of the pp pipeline ranks holds v
// model chunks, virtual stage j = chunk * pp + rank group (Megatron's interleaving), so there are
// pp * v of them and stage j runs on the ranks of stage j % pp. Otherwise v = 1.
Status assign_stages(Prepared& p) {
  const auto& r = p.recipe;
  const auto& L = p.layering;
  auto nb = static_cast<std::int64_t>(L.blocks.size());
  const std::int64_t v =
      r.parallel.schedule == recipe::Schedule::interleaved ? r.parallel.virtual_stages : 1;
  std::int64_t groups = r.parallel.pp, pp = groups * v, per = r.parallel.dp * r.parallel.tp;
  std::vector<StageNodes> stages(static_cast<std::size_t>(pp));
  if (!r.stages.empty()) {
    if (static_cast<std::int64_t>(r.stages.size()) != pp)
      return Error(Errc::bad_input,
                   v > 1 ? fmt::format("{} [[stages]] for pp = {} x virtual_stages = {}",
                                       r.stages.size(), groups, v)
                         : fmt::format("{} [[stages]] for pp = {}", r.stages.size(), pp),
                   p.where.at("stages"));
    for (std::size_t i = 0; i < r.stages.size(); ++i) {
      const auto& st = r.stages[i];
      if (st.index < 0 || st.index >= pp)
        return Error(Errc::bad_input,
                     fmt::format("stage index {} is outside 0..{}", st.index, pp - 1),
                     p.where.at(fmt::format("stages[{}].index", i)));
      auto& dst = stages[static_cast<std::size_t>(st.index)];
      dst.layers = st.layers;
      dst.ranks = st.ranks;
      for (auto b : st.layers)
        if (b < 0 || b >= nb)
          return Error(Errc::bad_input,
                       fmt::format("stage {} lists layer {}, but the model has {} blocks (0..{})",
                                   st.index, b, nb, nb - 1),
                       p.where.at(fmt::format("stages[{}].layers", i)));
      if (!st.ranks.empty() && static_cast<std::int64_t>(st.ranks.size()) != per)
        return Error(Errc::bad_input,
                     fmt::format("stage {} has {} ranks, a stage needs dp*tp = {}", st.index,
                                 st.ranks.size(), per),
                     p.where.at(fmt::format("stages[{}].ranks", i)));
    }
  } else {
    if (pp > 1 && nb < pp)
      return Error(
          Errc::bad_input,
          fmt::format("pp = {} stages, but the model has {} repeated blocks to split", pp, nb),
          p.where.at("parallel.pp"), "lower pp or list [[stages]] explicitly");
    for (std::int64_t s = 0; s < pp; ++s)
      for (std::int64_t b = s * nb / pp; b < (s + 1) * nb / pp; ++b)
        stages[static_cast<std::size_t>(s)].layers.push_back(b);
  }
  for (std::int64_t s = 0; s < pp; ++s) {
    auto& st = stages[static_cast<std::size_t>(s)];
    st.index = static_cast<int>(s);
    if (st.ranks.empty())
      for (std::int64_t i = 0; i < per; ++i) st.ranks.push_back((s % groups) * per + i);
    if (s >= groups && st.ranks != stages[static_cast<std::size_t>(s % groups)].ranks)
      return Error(
          Errc::bad_input,
          fmt::format(
              "virtual stage {} must run on the ranks of stage {} (chunk {} of the same ranks)", s,
              s % groups, s / groups),
          p.where.at("stages"));
    if (s == 0) st.nodes = L.prologue.nodes;
    for (auto b : st.layers) {
      const auto& blk = L.blocks[static_cast<std::size_t>(b)].nodes;
      st.nodes.insert(st.nodes.end(), blk.begin(), blk.end());
    }
    if (s == pp - 1)
      st.nodes.insert(st.nodes.end(), L.epilogue.nodes.begin(), L.epilogue.nodes.end());
  }
  p.plan.stages = std::move(stages);
  return plan_boundaries(p.plan);
}

}  // namespace

// With several pipeline stages the partitions run one micro-batch at a time (they have static
// shapes), so the batch dims — the symbolic axis 0 of every graph input — are bound to batch /
// micro_batches. Without a pipeline the micro-batches are a planning notion only and the partitions
// take the batch.
Status bind_micro_batch_dims(Prepared& p) {
  const auto& r = p.recipe;
  p.dims = r.dims;
  p.micro_batches = r.parallel.pp > 1 ? r.parallel.micro_batches : 1;
  for (const auto& in : p.model.proto->graph().input()) {
    const auto& shape = in.type().tensor_type().shape();
    if (shape.dim_size() > 0 && shape.dim(0).has_dim_param())
      p.batch_dims.insert(shape.dim(0).dim_param());
  }
  if (p.micro_batches <= 1) return {};
  if (p.batch_dims.empty())
    return Error(
        Errc::bad_input,
        fmt::format(
            "micro_batches = {} needs a symbolic batch dim (axis 0 of a graph input); the model "
            "has none",
            p.micro_batches),
        p.where.at("parallel.micro_batches"),
        "set micro_batches = 1 or export the model with a dynamic batch");
  for (const auto& name : p.batch_dims) {
    auto it = p.dims.find(name);
    if (it == p.dims.end()) continue;  // reported as an unbound dim below
    if (it->second % p.micro_batches != 0)
      return Error(Errc::bad_input,
                   fmt::format("dim '{}' = {} does not split into micro_batches = {}", name,
                               it->second, p.micro_batches),
                   p.where.at("parallel.micro_batches"),
                   "make the batch a multiple of micro_batches");
    it->second /= p.micro_batches;
  }
  return {};
}

Expected<std::unique_ptr<Prepared>> prepare(const std::filesystem::path& recipe_path) {
  HP_ASSIGN_OR_RETURN(auto doc, recipe::read_recipe(recipe_path));
  if (!doc.problems.empty()) return collect_errors(Errc::bad_input, std::move(doc.problems));
  return prepare(doc.recipe, doc.where, recipe_path);
}

Expected<std::unique_ptr<Prepared>> prepare(const recipe::Recipe& recipe,
                                            const recipe::SourceMap& where,
                                            const std::filesystem::path& recipe_path) {
  auto p = std::make_unique<Prepared>();
  p->recipe_path = recipe_path;
  p->recipe = recipe;
  p->where = where;
  const auto& r = p->recipe;
  if (r.model.empty())
    return Error(Errc::bad_input, "the recipe names no model", p->where.at("recipe"));
  p->model_path = recipe_path.parent_path() / r.model;
  HP_ASSIGN_OR_RETURN(p->model, model::load_model(p->model_path));
  HP_TRY(bind_micro_batch_dims(*p));
  HP_ASSIGN_OR_RETURN(p->graph, model::build_graph(p->model, p->dims));
  if (!p->graph.unknown_dims.empty()) {
    std::string names;
    for (const auto& d : p->graph.unknown_dims) names += (names.empty() ? "" : ", ") + d;
    return Error(
        Errc::bad_input,
        fmt::format("the model's dims {} are not bound; partitions have static shapes", names),
        p->where.at("model.dims"), "add them to [model] dims = { ... }");
  }
  p->layering = model::discover_layers(p->graph);
  if (p->layering.blocks.empty()) {
    // No repeated blocks: the whole model is block 0, as hp plan prices and writes it (its
    // [[stages]] list layer 0), so one stage holds everything and pp > 1 is refused below.
    auto& L = p->layering;
    model::Block whole = std::move(L.prologue);
    whole.name = "block.0";
    whole.nodes.insert(whole.nodes.end(), L.epilogue.nodes.begin(), L.epilogue.nodes.end());
    L.blocks.push_back(std::move(whole));
    L.prologue = model::Block{"prologue"};
    L.epilogue = model::Block{"epilogue"};
  }

  PropagateOptions o;
  HP_ASSIGN_OR_RETURN(o.mesh, stage_mesh(*p));
  o.dp_axis = p->dp_axis = 0;
  o.tp_axis = p->tp_axis = 1;
  o.sequence_parallel = r.parallel.sequence_parallel;
  HP_TRY(declare_layouts(*p, o));
  HP_ASSIGN_OR_RETURN(p->prop, propagate(p->model, p->graph, o));
  p->plan.model = &p->model;
  p->plan.graph = &p->graph;
  p->plan.prop = &p->prop;
  HP_TRY(assign_stages(*p));
  return p;
}

Status check_shardable(const recipe::Recipe& recipe, const std::filesystem::path& recipe_path) {
  HP_TRY(prepare(recipe, recipe::SourceMap(recipe_path.string()), recipe_path));
  return {};
}

Expected<ShardReport> run(const ShardOptions& options) {
  if (options.out_dir.empty() && options.explain.empty())
    return Error(Errc::usage, "hp shard needs -o DIR (write partitions) or --explain TENSOR");
  HP_TRY(recipe::check_recipe_before_use(options.recipe, options.preset_dirs));
  HP_ASSIGN_OR_RETURN(auto p, prepare(options.recipe));
  if (!options.explain.empty()) {
    HP_ASSIGN_OR_RETURN(auto text, explain(*p, options.explain, options.json));
    return ShardReport{std::move(text), {}};
  }
  OutputDirOptions guard;
  guard.force = options.force;
  guard.inputs = {options.recipe};
  HP_ASSIGN_OR_RETURN(auto rep, write_partitions(*p, options.out_dir, guard));
  if (options.json) rep.summary = rep.json + "\n";
  return rep;
}

}  // namespace hp::shard
