// Sharding propagation driver: walks the nodes in topological order, asks each op's rule
// (propagate_rules.cpp) what layout it needs of its inputs, fixes the layout of weights on their
// first use, and records a redistribution wherever a need differs from what the producer left.
#include "hp/shard/propagate.h"

#include <fmt/core.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "propagate_rules.h"

namespace hp::shard {

std::vector<std::int64_t> global_shape(const model::Tensor& t) {
  std::vector<std::int64_t> s;
  for (const auto& d : t.dims) s.push_back(d.value);
  return s;
}

namespace {

int model_opset(const model::Model& m) {
  auto it = m.opsets.find("");
  return it == m.opsets.end() ? 17 : static_cast<int>(it->second);
}

bool shape_known(const model::Tensor& t) {
  if (!t.has_shape) return false;
  return std::all_of(t.dims.begin(), t.dims.end(), [](const model::Dim& d) { return d.known(); });
}

// What a run of propagation asks of the next one: fusions to undo, head-cut weights to replicate.
struct Retry {
  std::set<int> no_fuse, replicate;
  bool again = false;
};

// One run with fixed choices; sets `retry.again` when a choice turned out wrong.
Expected<Propagation> propagate_once(const model::Model& model, const model::Graph& g, const PropagateOptions& o,
                                     Retry& retry);

}  // namespace

HeldView held_view(const std::vector<std::int64_t>& shape, const Sharding& layout, const BlockedDim* b) {
  HeldView v{shape, layout};
  if (!b || b->dim < 0 || b->blocks <= 1 || static_cast<std::size_t>(b->dim) >= shape.size()) return v;
  auto d = static_cast<std::size_t>(b->dim);
  auto at = static_cast<std::ptrdiff_t>(d);
  v.shape[d] = shape[d] / b->blocks;
  v.shape.insert(v.shape.begin() + at, b->blocks);
  v.layout.dims.insert(v.layout.dims.begin() + at, std::vector<int>{});
  return v;
}

HeldView held_view(const Propagation& p, int tensor, const std::vector<std::int64_t>& shape) {
  auto it = p.blocked.find(tensor);
  return held_view(shape, p.layout[static_cast<std::size_t>(tensor)], it == p.blocked.end() ? nullptr : &it->second);
}

Expected<RedistPlan> plan_for_consumer(const Mesh& mesh, const Sharding& from, const Sharding& to,
                                       const std::vector<std::int64_t>& shape, int elem_bytes) {
  bool moves = false;
  for (std::size_t d = 0; d < from.dims.size() && d < to.dims.size(); ++d)
    for (int a : from.dims[d])
      for (std::size_t e = 0; e < to.dims.size(); ++e)
        if (e != d && std::find(to.dims[e].begin(), to.dims[e].end(), a) != to.dims[e].end()) moves = true;
  if (!moves) return plan_steps(mesh, from, to, shape, elem_bytes);
  // A split moving between dims: the planner's all-to-all instead of a gather and a slice.
  return plan_redistribution(mesh, from, to, shape, elem_bytes);
}

Expected<Propagation> propagate(const model::Model& model, const model::Graph& g, const PropagateOptions& o) {
  Retry retry;
  // Each retry removes one fusion or replicates one weight more, so this ends.
  for (std::size_t round = 0;; ++round) {
    retry.again = false;
    auto p = propagate_once(model, g, o, retry);
    if (!p) return p;
    if (retry.again && round <= 2 * g.tensors.size()) continue;
    if (retry.again) return Error(Errc::internal, "sharding propagation did not settle on fused projections");
    for (auto& [t, b] : p->blocked)
      p->origin[static_cast<std::size_t>(t)] += fmt::format(" (blocked: {} blocks on dim {})", b.blocks, b.dim);
    for (int t : retry.replicate) {
      // The weight itself, not the transposed copy the MatMul reads.
      int w = t;
      while (g.tensor(w).producer >= 0 && !g.node(g.tensor(w).producer).inputs.empty())
        w = g.node(g.tensor(w).producer).inputs[0];
      p->notes.push_back(fmt::format("'{}' is replicated: split over tp its output would cut a head that the "
                                     "head reshape needs whole (fewer heads than tp ranks, as GQA's kv heads)",
                                     g.tensor(w).name));
    }
    return p;
  }
}

namespace {

Expected<Propagation> propagate_once(const model::Model& model, const model::Graph& g, const PropagateOptions& o,
                                     Retry& retry) {
  const onnx::GraphProto& pg = model.proto->graph();
  Propagation p;
  p.mesh = o.mesh;
  std::size_t nt = g.tensors.size();
  p.layout.resize(nt);
  p.origin.resize(nt);
  std::vector<bool> decided(nt, false);
  for (std::size_t t = 0; t < nt; ++t) p.layout[t] = Sharding::replicated(g.tensors[t].dims.size());

  for (const auto& [t, s] : o.declared) {
    const auto& tensor = g.tensor(t);
    auto ok = check_shape(o.mesh, s, global_shape(tensor), tensor.name);
    if (!ok) {
      Error e = ok.error();
      auto w = o.declared_where.find(t);
      if (w != o.declared_where.end()) e.what.where = w->second;
      return e;
    }
    p.layout[static_cast<std::size_t>(t)] = s;
    decided[static_cast<std::size_t>(t)] = true;
    auto w = o.declared_where.find(t);
    p.origin[static_cast<std::size_t>(t)] = "recipe" + (w != o.declared_where.end() ? " (" + w->second + ")" : std::string());
  }
  // Graph inputs: the batch (first) dim over the data-parallel axis.
  for (int in : g.inputs) {
    auto& t = g.tensor(in);
    if (decided[static_cast<std::size_t>(in)]) continue;
    Sharding s = Sharding::replicated(t.dims.size());
    if (o.dp_axis >= 0 && !t.dims.empty()) {
      std::int64_t n = o.mesh.dims[static_cast<std::size_t>(o.dp_axis)];
      if (n > 1 && t.dims[0].known() && t.dims[0].value % n == 0) s.dims[0] = {o.dp_axis};
      else if (n > 1)
        p.notes.push_back(fmt::format("input '{}' is replicated over dp: its first dim ({}) does not divide by {}",
                                      t.name, t.dims[0].value, n));
    }
    p.layout[static_cast<std::size_t>(in)] = s;
    decided[static_cast<std::size_t>(in)] = true;
    p.origin[static_cast<std::size_t>(in)] = s.dims.empty() || s.dims[0].empty() ? "replicated input" : "batch over dp";
  }

  std::map<int, int> root;  // blocked tensor -> the fused weight it comes from
  auto add_redist = [&](int tensor, int node, const Sharding& from, const Sharding& to) -> Status {
    const auto& t = g.tensor(tensor);
    auto b = p.blocked.find(tensor);
    if (b != p.blocked.end()) {
      // Blocked order is not the tensor's order: undo the fusion rather than move blocks around.
      retry.no_fuse.insert(root[tensor]);
      retry.again = true;
      return {};
    }
    auto plan = plan_for_consumer(o.mesh, from, to, global_shape(t), std::max(1, model::elem_size(t.elem_type)));
    if (!plan) return std::move(plan).error();
    p.redistributions.push_back(Redistribution{tensor, node, from, to, std::move(*plan)});
    return {};
  };

  p.reads.resize(g.nodes.size());
  detail::RuleContext c;
  c.proto = &pg;
  c.graph = &g;
  c.mesh = &o.mesh;
  c.tp_axis = o.tp_axis;
  c.dp_axis = o.dp_axis;
  c.sequence_parallel = o.sequence_parallel;
  c.opset = model_opset(model);
  c.no_fuse = &retry.no_fuse;
  c.replicate = &retry.replicate;
  // A weight the graph transposes (or casts) before use, as exporters do for Linear: the copy stays
  // undecided like the weight itself, and the layout its consumer picks is mapped back onto the weight.
  std::map<int, int> deferred;  // constant tensor -> the node computing it from a flexible weight
  auto is_flexible = [&](int t) {
    const auto& tensor = g.tensor(t);
    return !decided[static_cast<std::size_t>(t)] &&
           (tensor.kind == model::TensorKind::initializer || deferred.count(t) > 0);
  };
  std::function<void(int, const Sharding&)> fix = [&](int t, const Sharding& need) {
    auto ti = static_cast<std::size_t>(t);
    p.layout[ti] = need;
    decided[ti] = true;
    auto d = deferred.find(t);
    if (d == deferred.end()) return;
    int j = d->second;
    const auto& pn = pg.node(j);
    int src = g.node(j).inputs[0];
    Sharding in = need;
    auto blk = p.blocked.find(t);
    if (pn.op_type() == "Transpose") {
      std::vector<std::int64_t> perm;
      for (const auto& a : pn.attribute())
        if (a.name() == "perm") perm.assign(a.ints().begin(), a.ints().end());
      if (perm.empty())
        for (std::size_t q = 0; q < need.dims.size(); ++q) perm.push_back(static_cast<std::int64_t>(need.dims.size() - 1 - q));
      for (std::size_t q = 0; q < perm.size() && q < need.dims.size(); ++q)
        in.dims[static_cast<std::size_t>(perm[q])] = need.dims[q];
      if (blk != p.blocked.end() && static_cast<std::size_t>(blk->second.dim) < perm.size())
        p.blocked[src] = {static_cast<int>(perm[static_cast<std::size_t>(blk->second.dim)]), blk->second.blocks};
    } else if (blk != p.blocked.end()) {
      p.blocked[src] = blk->second;
    }
    p.reads[static_cast<std::size_t>(j)].assign(g.node(j).inputs.size(), Sharding{});
    p.reads[static_cast<std::size_t>(j)][0] = in;
    p.origin[static_cast<std::size_t>(src)] = p.origin[ti];
    fix(src, in);
  };
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const auto& n = g.nodes[i];
    c.node = &pg.node(static_cast<int>(i));
    const std::string& op = c.node->op_type();
    if ((op == "Transpose" || op == "Identity" || op == "Cast") && n.inputs.size() == 1 && n.inputs[0] >= 0 &&
        n.outputs.size() == 1 && n.outputs[0] >= 0 && is_flexible(n.inputs[0]) &&
        g.tensor(n.outputs[0]).kind == model::TensorKind::constant) {
      deferred[n.outputs[0]] = static_cast<int>(i);
      continue;
    }
    c.in.assign(n.inputs.size(), {});
    bool known = true;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      int t = n.inputs[k];
      if (t < 0) continue;
      const auto& tensor = g.tensor(t);
      auto& in = c.in[k];
      in.present = true;
      in.shape = global_shape(tensor);
      // A weight the graph transposes or casts (a constant computed from it) is still a weight.
      in.is_weight = tensor.kind == model::TensorKind::initializer || deferred.count(t) > 0 ||
                     (tensor.kind == model::TensorKind::constant && tensor.is_float());
      in.flexible = is_flexible(t);
      in.is_activation = tensor.kind == model::TensorKind::activation || tensor.kind == model::TensorKind::input;
      in.cur = p.layout[static_cast<std::size_t>(t)];
      in.tensor = t;
      if (auto b = p.blocked.find(t); b != p.blocked.end()) {
        in.blocked_dim = b->second.dim;
        in.blocks = b->second.blocks;
      }
      known = known && shape_known(tensor);
    }
    c.out_shapes.clear();
    for (int t : n.outputs) {
      if (t < 0) { c.out_shapes.emplace_back(); continue; }
      known = known && shape_known(g.tensor(t));
      c.out_shapes.push_back(global_shape(g.tensor(t)));
    }
    if (!known)
      return Error(Errc::bad_input,
                   fmt::format("node '{}' ({}) has tensors of unknown shape; hp shard needs every dim bound",
                               n.name, n.op_type),
                   n.name, "bind the model's symbolic dims in the recipe's [model] dims");
    c.node_index = static_cast<int>(i);
    detail::RuleResult r = detail::apply_rule(c);
    // Blocked inputs only flow into rules that know blocks; the fused weight they come from.
    int node_root = -1;
    for (const auto& in : c.in)
      if (in.present && in.blocked_dim >= 0 && node_root < 0) node_root = root[in.tensor];
    if (node_root >= 0 && !r.blocks_ok) {
      retry.no_fuse.insert(node_root);
      retry.again = true;
      return p;
    }
    p.reads[i].resize(n.inputs.size());
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      int t = n.inputs[k];
      if (t < 0) continue;
      auto ti = static_cast<std::size_t>(t);
      Sharding need = r.req[k];
      if (c.in[k].flexible) {
        if (!check_shape(o.mesh, need, c.in[k].shape, g.tensor(t).name)) {
          p.notes.push_back(fmt::format("'{}' stays replicated: {} does not fit its shape",
                                        g.tensor(t).name, format_sharding(o.mesh, need)));
          need = Sharding::replicated(c.in[k].shape.size());
        }
        p.origin[ti] = r.why[k].empty() ? "propagated" : r.why[k];
        if (r.req_blocked[k] >= 0 && need.dims == r.req[k].dims) {
          p.blocked[t] = {r.req_blocked[k], r.blocks};
          root[t] = node_root >= 0 ? node_root : t;
        }
        fix(t, need);
      }
      p.reads[i][k] = need;
      if (need != p.layout[ti]) HP_TRY(add_redist(t, static_cast<int>(i), p.layout[ti], need));
    }
    for (std::size_t j = 0; j < n.outputs.size(); ++j) {
      int t = n.outputs[j];
      if (t < 0) continue;
      p.layout[static_cast<std::size_t>(t)] = r.out[j];
      decided[static_cast<std::size_t>(t)] = true;
      p.origin[static_cast<std::size_t>(t)] = "propagated";
      if (r.out_blocked[j] >= 0) {
        // Blocked only when an input really is (a weight left whole because its shape did not fit is not).
        int from = -1;
        for (std::size_t k = 0; k < n.inputs.size() && from < 0; ++k)
          if (n.inputs[k] >= 0 && p.blocked.count(n.inputs[k])) from = root[n.inputs[k]];
        if (from < 0) continue;
        p.blocked[t] = {r.out_blocked[j], r.blocks};
        root[t] = from;
      }
    }
  }
  // Weight copies no node read: replicated, like their weights.
  for (const auto& [t, j] : deferred)
    if (!decided[static_cast<std::size_t>(t)]) {
      p.origin[static_cast<std::size_t>(t)] = "replicated";
      fix(t, Sharding::replicated(g.tensor(t).dims.size()));
    }
  // Graph outputs leave each rank whole except for the data-parallel split.
  for (int out : g.outputs) {
    Sharding s = p.layout[static_cast<std::size_t>(out)];
    Sharding want = Sharding::replicated(s.dims.size());
    for (std::size_t d = 0; d < s.dims.size(); ++d)
      for (int a : s.dims[d])
        if (a == o.dp_axis) want.dims[d] = {a};
    if (want != s) HP_TRY(add_redist(out, -1, s, want));
  }
  if (retry.again) return p;
  // A head Reshape that gathers the output of a column-parallel projection (fewer heads than tp
  // ranks, as GQA's kv heads): replicate that weight instead, every rank computes the whole thing.
  for (const auto& rd : p.redistributions) {
    if (rd.node < 0 || g.node(rd.node).op_type != "Reshape" || o.tp_axis < 0) continue;
    auto has_tp = [&](const Sharding& s) {
      for (const auto& e : s.dims)
        if (std::find(e.begin(), e.end(), o.tp_axis) != e.end()) return true;
      return false;
    };
    if (!has_tp(rd.from) || has_tp(rd.to) || !rd.from.partial.empty()) continue;
    int prod = g.tensor(rd.tensor).producer;
    if (prod >= 0 && g.node(prod).op_type == "Add")
      for (int in : g.node(prod).inputs)
        if (in >= 0 && g.tensor(in).producer >= 0 && g.node(g.tensor(in).producer).op_type == "MatMul")
          prod = g.tensor(in).producer;
    if (prod < 0 || g.node(prod).op_type != "MatMul" || g.node(prod).inputs.size() < 2) continue;
    int w = g.node(prod).inputs[1];
    if (w < 0 || p.origin[static_cast<std::size_t>(w)] != "column-parallel" || retry.replicate.count(w)) continue;
    retry.replicate.insert(w);
    retry.again = true;
  }
  return p;
}

}  // namespace
}  // namespace hp::shard
