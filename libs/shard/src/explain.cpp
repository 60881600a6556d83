// hp shard --explain TENSOR: the tensor's layout and where it came from, each rank's slice as index
// ranges, and every redistribution on its path (its producer's side and each consumer's).
#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "hp/model/names.h"
#include "hp/shard/shard.h"

namespace hp::shard {
namespace {

std::string ranges_text(const std::vector<Range>& rs) {
  std::string s = "[";
  for (std::size_t i = 0; i < rs.size(); ++i)
    s += rs[i].end < 0 ? fmt::format("{}:", i ? ", " : "")  // whole, of a size known at run time
                       : fmt::format("{}{}:{}", i ? ", " : "", rs[i].begin, rs[i].end);
  return s + "]";
}

// A dim known only when the tensor is computed (-1: docs/shard.md) prints as "?".
std::string dims_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i)
    s += (i ? ", " : "") + (v[i] < 0 ? std::string("?") : std::to_string(v[i]));
  return s + "]";
}

std::string axes_text(const Mesh& mesh, const std::vector<int>& axes) {
  std::string s;
  for (int a : axes) s += (s.empty() ? "" : "*") + mesh.axes[static_cast<std::size_t>(a)];
  return s;
}

// What training does with a step's gradient (docs/training.md, "Tensor parallelism": the conjugate
// of each collective; libs/train/src/rules_comm.cpp).
std::string conjugate(const Mesh& mesh, const RedistStep& st) {
  const std::string over = axes_text(mesh, st.axes);
  switch (st.kind) {
    case StepKind::all_reduce:
      return st.op == ReduceOp::sum ? "the gradient passes through (each rank's partial sum had "
                                      "the whole gradient)"
                                    : "no gradient (only a sum is differentiated)";
    case StepKind::all_gather:
      return fmt::format("each rank keeps its block of dim {} of the gradient (a local slice)",
                         st.dim);
    case StepKind::reduce_scatter:
      return fmt::format("all_gather dim {} over {} of the gradient", st.dim, over);
    case StepKind::all_to_all:
      return fmt::format("all_to_all over {} of the gradient, split dim {} and concat dim {}", over,
                         st.concat_dim, st.dim);
    case StepKind::local_slice:
      return "the gradient is zero outside the slice, and is all-reduced where the whole tensor "
             "enters the region (below)";
    case StepKind::permute: return "the reverse permute of the gradient";
  }
  return "";
}

}  // namespace

Expected<std::string> explain(const Prepared& p, const std::string& name, bool json) {
  const auto& g = p.graph;
  auto found = model::resolve_tensor_name(g, name);
  if (!found) {
    Error e = std::move(found).error();
    e.what.where = p.model_path.string();
    return e;
  }
  const int t = found->tensor;
  const auto& tensor = g.tensor(t);
  const auto& mesh = p.prop.mesh;
  const Sharding& s = p.prop.layout[static_cast<std::size_t>(t)];
  auto shape = global_shape(tensor);
  std::set<int> stages;
  for (const auto& st : p.plan.stages)
    for (int i : st.nodes) {
      const auto& n = g.node(i);
      bool touches = std::find(n.inputs.begin(), n.inputs.end(), t) != n.inputs.end() ||
                     std::find(n.outputs.begin(), n.outputs.end(), t) != n.outputs.end();
      if (touches) stages.insert(st.index);
    }
  nlohmann::json j;
  j["tensor"] = g.tensor(t).name;
  if (!found->note.empty()) j["resolved"] = {{"name", name}, {"note", found->note}};
  j["shape"] = shape;
  j["layout"] = format_sharding(mesh, s);
  j["origin"] = p.prop.origin[static_cast<std::size_t>(t)];
  j["mesh"] = {{"device_matrix", mesh.dims}, {"alias_name", mesh.axes}};
  std::string text = found->note.empty() ? std::string() : found->note + "\n";
  text += fmt::format("tensor {}  shape {}\nlayout {}  ({})  on mesh {} {}\n", tensor.name,
                      dims_text(shape), format_sharding(mesh, s),
                      p.prop.origin[static_cast<std::size_t>(t)], dims_text(mesh.dims),
                      fmt::format("({})", fmt::join(mesh.axes, ", ")));
  if (std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d < 0; }))
    text += "its shape is known only when it is computed: it is whole on every rank of its stage\n";
  // A blocked tensor (fused q|k|v) is held as the view [.., k, n/k, ..]: its slices are of the
  // view.
  HeldView view = held_view(p.prop, t, shape);
  auto blk = p.prop.blocked.find(t);
  if (blk != p.prop.blocked.end()) {
    j["blocked"] = {
        {"dim", blk->second.dim}, {"blocks", blk->second.blocks}, {"view_shape", view.shape}};
    text += fmt::format(
        "blocked: dim {} is {} equal blocks, each split as the layout says; ranges below are "
        "of the view {}\n",
        blk->second.dim, blk->second.blocks, dims_text(view.shape));
  }
  j["slices"] = nlohmann::json::array();
  text += "slices:\n";
  for (int si : stages) {
    const auto& st = p.plan.stages[static_cast<std::size_t>(si)];
    for (std::size_t pos = 0; pos < st.ranks.size(); ++pos) {
      auto rs = slice_of(mesh, view.layout, view.shape, static_cast<std::int64_t>(pos));
      auto c = mesh.coords(static_cast<std::int64_t>(pos));
      nlohmann::json rj;
      rj["rank"] = st.ranks[pos];
      rj["stage"] = si;
      rj["coords"] = c;
      rj["ranges"] = nlohmann::json::array();
      for (const auto& r : rs) rj["ranges"].push_back({r.begin, r.end});
      rj["local_shape"] = local_shape(mesh, s, shape, static_cast<std::int64_t>(pos));
      j["slices"].push_back(rj);
      text += fmt::format("  rank {:>3} (stage {}, {} {}, {} {}): {}\n", st.ranks[pos], si,
                          mesh.axes[0], c[0], mesh.axes.size() > 1 ? mesh.axes[1] : "",
                          c.size() > 1 ? c[1] : 0, ranges_text(rs));
    }
  }
  j["redistributions"] = nlohmann::json::array();
  int count = 0;
  for (const auto& r : p.prop.redistributions) {
    if (r.tensor != t) continue;
    ++count;
    std::string consumer = r.node >= 0
                               ? fmt::format("{} ({})", g.node(r.node).name, g.node(r.node).op_type)
                               : std::string("graph output");
    std::string plan = describe_plan(mesh, r.plan);
    nlohmann::json backward = nlohmann::json::array();
    for (auto it = r.plan.steps.rbegin(); it != r.plan.steps.rend(); ++it)
      backward.push_back(conjugate(mesh, *it));
    j["redistributions"].push_back({{"consumer", consumer},
                                    {"from", format_sharding(mesh, r.from)},
                                    {"to", format_sharding(mesh, r.to)},
                                    {"steps", plan},
                                    {"backward", backward}});
    text += fmt::format("redistribution before {}: {} -> {}\n", consumer,
                        format_sharding(mesh, r.from), format_sharding(mesh, r.to));
    for (std::size_t a = 0, b; a < plan.size(); a = b + 1) {
      b = plan.find('\n', a);
      if (b == std::string::npos) b = plan.size();
      if (b > a) text += "  " + plan.substr(a, b - a) + "\n";
    }
    for (const auto& line : backward) text += "  backward: " + line.get<std::string>() + "\n";
  }
  if (count == 0) text += "no redistribution: every consumer reads it as produced\n";
  // Training: a tensor every tensor-parallel member holds whole, read by nodes that compute in
  // parts, has its gradient all-reduced over tp (a region entry, Megatron's f).
  std::vector<std::string> parts;
  const bool floating = tensor.elem_type == 1 || tensor.elem_type == 10 || tensor.elem_type == 11 ||
                        tensor.elem_type == 16;
  if (floating && !varies_on_last_axis(mesh, s))
    for (const auto& st : p.plan.stages)
      for (int i : st.nodes) {
        const auto& n = g.node(i);
        if (std::find(n.inputs.begin(), n.inputs.end(), t) == n.inputs.end()) continue;
        bool split = false;
        for (int o : n.outputs)
          split = split ||
                  (o >= 0 && varies_on_last_axis(mesh, p.prop.layout[static_cast<std::size_t>(o)]));
        if (split) parts.push_back(n.name.empty() ? n.op_type : n.name);
      }
  j["region_entry"] = !parts.empty();
  if (!parts.empty())
    text += fmt::format(
        "backward (training): read whole by {} node(s) computing in parts ({}{}), so its "
        "gradient from them is all-reduced over {}\n",
        parts.size(), parts.front(), parts.size() > 1 ? ", ..." : "", mesh.axes.back());
  for (const auto& b : p.plan.boundaries)
    if (b.tensor == t)
      text += fmt::format(
          "pipeline: sent from stage {} to stage {} (tag {}); in training its gradient goes "
          "back from stage {} to stage {}\n",
          b.from_stage, b.to_stage, b.tag, b.to_stage, b.from_stage);
  if (json) return j.dump(2) + "\n";
  return text;
}

}  // namespace hp::shard
