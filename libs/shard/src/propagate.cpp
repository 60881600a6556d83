// Sharding propagation driver: walks the nodes in topological order, asks each op's rule
// (propagate_rules.cpp) what layout it needs of its inputs, fixes the layout of weights on their
// first use, and records a redistribution wherever a need differs from what the producer left.
#include "hp/shard/propagate.h"

#include <fmt/core.h>

#include <algorithm>
#include <map>

#include "propagate_rule_util.h"
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

// One run with fixed choices (class Run below); sets `retry.again` when a choice turned out wrong.
Expected<Propagation> propagate_once(const model::Model& model, const model::Graph& g,
                                     const PropagateOptions& o, Retry& retry);

}  // namespace

HeldView held_view(const std::vector<std::int64_t>& shape, const Sharding& layout,
                   const BlockedDim* b) {
  HeldView v{shape, layout};
  if (!b || b->dim < 0 || b->blocks <= 1 || static_cast<std::size_t>(b->dim) >= shape.size())
    return v;
  auto d = static_cast<std::size_t>(b->dim);
  auto at = static_cast<std::ptrdiff_t>(d);
  v.shape[d] = shape[d] / b->blocks;
  v.shape.insert(v.shape.begin() + at, b->blocks);
  v.layout.dims.insert(v.layout.dims.begin() + at, std::vector<int>{});
  return v;
}

HeldView held_view(const Propagation& p, int tensor, const std::vector<std::int64_t>& shape) {
  auto it = p.blocked.find(tensor);
  return held_view(shape, p.layout[static_cast<std::size_t>(tensor)],
                   it == p.blocked.end() ? nullptr : &it->second);
}

Expected<RedistPlan> plan_for_consumer(const Mesh& mesh, const Sharding& from, const Sharding& to,
                                       const std::vector<std::int64_t>& shape, int elem_bytes) {
  bool moves = false;
  for (std::size_t d = 0; d < from.dims.size() && d < to.dims.size(); ++d)
    for (int a : from.dims[d])
      for (std::size_t e = 0; e < to.dims.size(); ++e)
        if (e != d && std::find(to.dims[e].begin(), to.dims[e].end(), a) != to.dims[e].end())
          moves = true;
  if (!moves) return plan_steps(mesh, from, to, shape, elem_bytes);
  // A split moving between dims: the planner's all-to-all instead of a gather and a slice.
  return plan_redistribution(mesh, from, to, shape, elem_bytes);
}

Expected<Propagation> propagate(const model::Model& model, const model::Graph& g,
                                const PropagateOptions& o) {
  Retry retry;
  // Each retry removes one fusion or replicates one weight more, so this ends.
  for (std::size_t round = 0;; ++round) {
    retry.again = false;
    auto p = propagate_once(model, g, o, retry);
    if (!p) return p;
    if (retry.again && round <= 2 * g.tensors.size()) continue;
    if (retry.again)
      return Error(Errc::internal, "sharding propagation did not settle on fused projections");
    for (auto& [t, b] : p->blocked)
      p->origin[static_cast<std::size_t>(t)] +=
          fmt::format(" (blocked: {} blocks on dim {})", b.blocks, b.dim);
    HP_TRY(detail::check_consistent(g, *p));
    for (int t : retry.replicate) {
      // The weight itself, not the transposed copy the MatMul reads.
      int w = t;
      while (g.tensor(w).producer >= 0 && !g.node(g.tensor(w).producer).inputs.empty())
        w = g.node(g.tensor(w).producer).inputs[0];
      p->notes.push_back(
          fmt::format("'{}' is replicated: split over tp its output would cut a head that the "
                      "head reshape needs whole (fewer heads than tp ranks, as GQA's kv heads)",
                      g.tensor(w).name));
    }
    return p;
  }
}

namespace {

// One run of propagation with fixed choices (which projections are fused, which weights are
// replicated). run() is the table of contents; each step below is one member function.
class Run {
 public:
  Run(const model::Model& model, const model::Graph& g, const PropagateOptions& o, Retry& retry)
      : g_(g), o_(o), retry_(retry), pg_(model.proto->graph()) {
    const std::size_t nt = g.tensors.size();
    p_.mesh = o.mesh;
    p_.layout.resize(nt);
    p_.origin.resize(nt);
    decided_.assign(nt, false);
    for (std::size_t t = 0; t < nt; ++t)
      p_.layout[t] = Sharding::replicated(g.tensors[t].dims.size());
    c_.proto = &pg_;
    c_.graph = &g;
    c_.mesh = &o.mesh;
    c_.tp_axis = o.tp_axis;
    c_.dp_axis = o.dp_axis;
    c_.sequence_parallel = o.sequence_parallel;
    c_.opset = model_opset(model);
    c_.no_fuse = &retry.no_fuse;
    c_.replicate = &retry.replicate;
  }

  Expected<Propagation> run() {
    HP_TRY(seed_declared());
    seed_inputs();
    p_.reads.resize(g_.nodes.size());
    for (std::size_t i = 0; i < g_.nodes.size(); ++i) {
      c_.node = &pg_.node(static_cast<int>(i));
      if (defer_weight_copy(i)) continue;
      HP_TRY(describe_node(i));
      c_.node_index = static_cast<int>(i);
      HP_ASSIGN_OR_RETURN(const detail::RuleResult r,
                          unknown_ ? whole_on_every_rank(i) : detail::apply_rule(c_));
      const int node_root = blocked_root();
      if (node_root >= 0 && !r.blocks_ok) {
        retry_.no_fuse.insert(node_root);
        retry_.again = true;
        return std::move(p_);
      }
      HP_TRY(read_inputs(i, r, node_root));
      write_outputs(i, r);
    }
    replicate_unread_copies();
    HP_TRY(resolve_graph_outputs());
    if (!retry_.again) replicate_head_cut_weights();
    if (whole_nodes_ > 0)
      p_.notes.push_back(
          fmt::format("{} node(s) whose shapes are known only when they run (first: '{}', as in a "
                      "data-dependent routing loop) run whole on every rank, split inputs "
                      "gathered first",
                      whole_nodes_, first_whole_));
    return std::move(p_);
  }

 private:
  // The recipe's layouts come first and are never overridden; one that does not fit its tensor is
  // reported at the recipe line that declared it.
  Status seed_declared() {
    for (const auto& [t, s] : o_.declared) {
      const auto& tensor = g_.tensor(t);
      const auto w = o_.declared_where.find(t);
      auto ok = check_shape(o_.mesh, s, global_shape(tensor), tensor.name);
      if (!ok) {
        Error e = ok.error();
        if (w != o_.declared_where.end()) e.what.where = w->second;
        return e;
      }
      p_.layout[static_cast<std::size_t>(t)] = s;
      decided_[static_cast<std::size_t>(t)] = true;
      p_.origin[static_cast<std::size_t>(t)] =
          "recipe" + (w != o_.declared_where.end() ? " (" + w->second + ")" : std::string());
    }
    return {};
  }

  // Graph inputs without a declared layout: the batch (first) dim over the data-parallel axis, so
  // every data-parallel rank reads its own rows.
  void seed_inputs() {
    for (int in : g_.inputs) {
      const auto& t = g_.tensor(in);
      if (decided_[static_cast<std::size_t>(in)]) continue;
      Sharding s = Sharding::replicated(t.dims.size());
      if (o_.dp_axis >= 0 && !t.dims.empty()) {
        const std::int64_t n = o_.mesh.dims[static_cast<std::size_t>(o_.dp_axis)];
        if (n > 1 && t.dims[0].known() && t.dims[0].value % n == 0)
          s.dims[0] = {o_.dp_axis};
        else if (n > 1)
          p_.notes.push_back(fmt::format(
              "input '{}' is replicated over dp: its first dim ({}) does not divide by {}", t.name,
              t.dims[0].value, n));
      }
      p_.layout[static_cast<std::size_t>(in)] = s;
      decided_[static_cast<std::size_t>(in)] = true;
      p_.origin[static_cast<std::size_t>(in)] =
          s.dims.empty() || s.dims[0].empty() ? "replicated input" : "batch over dp";
    }
  }

  // Records that `node` reads `tensor` laid out as `to` while it was produced as `from`.
  Status add_redist(int tensor, int node, const Sharding& from, const Sharding& to) {
    const auto& t = g_.tensor(tensor);
    if (p_.blocked.count(tensor)) {
      // Blocked order is not the tensor's order: undo the fusion rather than move blocks around.
      retry_.no_fuse.insert(root_[tensor]);
      retry_.again = true;
      return {};
    }
    HP_ASSIGN_OR_RETURN(auto plan, plan_for_consumer(o_.mesh, from, to, global_shape(t),
                                                     std::max(1, model::elem_size(t.elem_type))));
    p_.redistributions.push_back(Redistribution{tensor, node, from, to, std::move(plan)});
    return {};
  }

  // A weight not laid out yet (or a copy deferred from one) takes whatever layout its first
  // consumer's rule asks for.
  bool is_flexible(int t) const {
    const auto& tensor = g_.tensor(t);
    return !decided_[static_cast<std::size_t>(t)] &&
           (tensor.kind == model::TensorKind::initializer || deferred_.count(t) > 0);
  }

  // The Transpose's perm of node `j` (reversed dims when absent), for a tensor of rank `rank`.
  std::vector<std::int64_t> perm_of(int j, std::size_t rank) const {
    std::vector<std::int64_t> perm;
    for (const auto& a : pg_.node(j).attribute())
      if (a.name() == "perm") perm.assign(a.ints().begin(), a.ints().end());
    if (perm.empty())
      for (std::size_t q = 0; q < rank; ++q)
        perm.push_back(static_cast<std::int64_t>(rank - 1 - q));
    return perm;
  }

  // A deferred copy whose weight another consumer has laid out already (exporters share one
  // initializer between layers through Identity copies when the initial values are equal): the
  // copy can no longer choose, because the weight is stored one way for every reader. The copy
  // node runs as an ordinary node on the weight as laid out, and a consumer that needs another
  // layout gets a redistribution. Without this, fix() would re-lay-out a weight that an earlier
  // node already read, and the two readers would disagree about its shape.
  void settle_copy(int t) {
    const auto d = deferred_.find(t);
    if (d == deferred_.end() || decided_[static_cast<std::size_t>(t)]) return;
    const int j = d->second;
    const int src = g_.node(j).inputs[0];
    settle_copy(src);
    if (!decided_[static_cast<std::size_t>(src)]) return;  // still free: fix() chooses for both
    const Sharding& in = p_.layout[static_cast<std::size_t>(src)];
    Sharding out = in;
    if (pg_.node(j).op_type() == "Transpose") {
      const auto perm = perm_of(j, in.dims.size());
      for (std::size_t q = 0; q < perm.size() && q < out.dims.size(); ++q)
        out.dims[q] = in.dims[static_cast<std::size_t>(perm[q])];
    }
    if (const auto blk = p_.blocked.find(src); blk != p_.blocked.end()) {
      int dim = blk->second.dim;
      if (pg_.node(j).op_type() == "Transpose") {
        const auto perm = perm_of(j, in.dims.size());
        for (std::size_t q = 0; q < perm.size(); ++q)
          if (perm[q] == blk->second.dim) dim = static_cast<int>(q);
      }
      p_.blocked[t] = {dim, blk->second.blocks};
      root_[t] = root_.count(src) ? root_[src] : src;
    }
    p_.reads[static_cast<std::size_t>(j)].assign(g_.node(j).inputs.size(), Sharding{});
    p_.reads[static_cast<std::size_t>(j)][0] = in;
    p_.layout[static_cast<std::size_t>(t)] = out;
    p_.origin[static_cast<std::size_t>(t)] = p_.origin[static_cast<std::size_t>(src)];
    decided_[static_cast<std::size_t>(t)] = true;
  }

  // Fixes the layout of `t`, and through a deferred Transpose/Identity/Cast the layout of the
  // weight it was computed from, so the weight is stored the way its consumer reads it.
  void fix(int t, const Sharding& need) {
    const auto ti = static_cast<std::size_t>(t);
    p_.layout[ti] = need;
    decided_[ti] = true;
    const auto d = deferred_.find(t);
    if (d == deferred_.end()) return;
    const int j = d->second;
    const auto& pn = pg_.node(j);
    const int src = g_.node(j).inputs[0];
    Sharding in = need;
    const auto blk = p_.blocked.find(t);
    if (pn.op_type() == "Transpose") {
      const auto perm = perm_of(j, need.dims.size());
      for (std::size_t q = 0; q < perm.size() && q < need.dims.size(); ++q)
        in.dims[static_cast<std::size_t>(perm[q])] = need.dims[q];
      if (blk != p_.blocked.end() && static_cast<std::size_t>(blk->second.dim) < perm.size())
        p_.blocked[src] = {static_cast<int>(perm[static_cast<std::size_t>(blk->second.dim)]),
                           blk->second.blocks};
    } else if (blk != p_.blocked.end()) {
      p_.blocked[src] = blk->second;
    }
    p_.reads[static_cast<std::size_t>(j)].assign(g_.node(j).inputs.size(), Sharding{});
    p_.reads[static_cast<std::size_t>(j)][0] = in;
    p_.origin[static_cast<std::size_t>(src)] = p_.origin[ti];
    fix(src, in);
  }

  // A weight the graph transposes (or casts) before use, as exporters do for Linear: the copy stays
  // undecided like the weight itself, and the layout its consumer picks is mapped back (fix()).
  bool defer_weight_copy(std::size_t i) {
    const auto& n = g_.nodes[i];
    const std::string& op = c_.node->op_type();
    if ((op == "Transpose" || op == "Identity" || op == "Cast") && n.inputs.size() == 1 &&
        n.inputs[0] >= 0 && n.outputs.size() == 1 && n.outputs[0] >= 0 &&
        is_flexible(n.inputs[0]) && g_.tensor(n.outputs[0]).kind == model::TensorKind::constant) {
      deferred_[n.outputs[0]] = static_cast<int>(i);
      return true;
    }
    return false;
  }

  // A node some of whose shapes are not known before it runs (NonZero, the rows a mask picks:
  // Mixtral's routing loop) cannot be split by a rule, which works on global shapes. It runs whole
  // on every rank instead: its inputs are replicated first (which needs their shapes, so a split
  // input of unknown shape is refused) and its outputs are whole; a later node that needs a split
  // takes its part by slicing. Correct for any op, at the price of the redundant work.
  Expected<detail::RuleResult> whole_on_every_rank(std::size_t i) {
    const auto& n = g_.nodes[i];
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const int t = n.inputs[k];
      if (t < 0 || shape_known(g_.tensor(t)) || c_.in[k].flexible) continue;
      if (p_.layout[static_cast<std::size_t>(t)] != Sharding::replicated(c_.in[k].shape.size()))
        return Error(Errc::bad_input,
                     fmt::format("node '{}' ({}) reads '{}', whose shape is not known before the "
                                 "node runs, split over ranks; hp shard cannot gather it",
                                 n.name, n.op_type, g_.tensor(t).name),
                     n.name, "bind the model's symbolic dims in the recipe's [model] dims");
    }
    if (whole_nodes_++ == 0) first_whole_ = n.name;
    return detail::replicate_all(c_);
  }

  // What the rule of node i sees: each input's shape, kind and current layout, and the output
  // shapes. Rules work on global shapes: `unknown_` says some dim is not known (the node then runs
  // whole, whole_on_every_rank).
  Status describe_node(std::size_t i) {
    const auto& n = g_.nodes[i];
    c_.in.assign(n.inputs.size(), {});
    bool known = true;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const int t = n.inputs[k];
      if (t < 0) continue;
      settle_copy(t);
      const auto& tensor = g_.tensor(t);
      auto& in = c_.in[k];
      in.present = true;
      in.shape = global_shape(tensor);
      // A weight the graph transposes or casts (a constant computed from it) is still a weight.
      in.is_weight = tensor.kind == model::TensorKind::initializer || deferred_.count(t) > 0 ||
                     (tensor.kind == model::TensorKind::constant && tensor.is_float());
      in.flexible = is_flexible(t);
      in.is_activation =
          tensor.kind == model::TensorKind::activation || tensor.kind == model::TensorKind::input;
      in.cur = p_.layout[static_cast<std::size_t>(t)];
      in.tensor = t;
      if (auto b = p_.blocked.find(t); b != p_.blocked.end()) {
        in.blocked_dim = b->second.dim;
        in.blocks = b->second.blocks;
      }
      known = known && shape_known(tensor);
    }
    c_.out_shapes.clear();
    for (int t : n.outputs) {
      if (t < 0) {
        c_.out_shapes.emplace_back();
        continue;
      }
      known = known && shape_known(g_.tensor(t));
      c_.out_shapes.push_back(global_shape(g_.tensor(t)));
    }
    unknown_ = !known;
    return {};
  }

  // The fused weight the node's first blocked input comes from (-1: no blocked input): blocked
  // inputs may only flow into rules that know blocks.
  int blocked_root() {
    for (const auto& in : c_.in)
      if (in.present && in.blocked_dim >= 0) return root_[in.tensor];
    return -1;
  }

  // Each input as the rule needs it: a flexible weight is fixed to that layout (replicated when it
  // does not fit), anything else gets a redistribution where the need differs from what it holds.
  Status read_inputs(std::size_t i, const detail::RuleResult& r, int node_root) {
    const auto& n = g_.nodes[i];
    p_.reads[i].resize(n.inputs.size());
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const int t = n.inputs[k];
      if (t < 0) continue;
      const auto ti = static_cast<std::size_t>(t);
      Sharding need = r.req[k];
      if (c_.in[k].flexible) {
        if (!check_shape(o_.mesh, need, c_.in[k].shape, g_.tensor(t).name)) {
          p_.notes.push_back(fmt::format("'{}' stays replicated: {} does not fit its shape",
                                         g_.tensor(t).name, format_sharding(o_.mesh, need)));
          need = Sharding::replicated(c_.in[k].shape.size());
        }
        p_.origin[ti] = r.why[k].empty() ? "propagated" : r.why[k];
        if (r.req_blocked[k] >= 0 && need.dims == r.req[k].dims) {
          p_.blocked[t] = {r.req_blocked[k], r.blocks};
          root_[t] = node_root >= 0 ? node_root : t;
        }
        fix(t, need);
      }
      p_.reads[i][k] = need;
      if (need != p_.layout[ti]) HP_TRY(add_redist(t, static_cast<int>(i), p_.layout[ti], need));
    }
    return {};
  }

  // The outputs take the rule's layouts; an output is blocked only when an input really is (a
  // weight left whole because its shape did not fit is not).
  void write_outputs(std::size_t i, const detail::RuleResult& r) {
    const auto& n = g_.nodes[i];
    for (std::size_t j = 0; j < n.outputs.size(); ++j) {
      const int t = n.outputs[j];
      if (t < 0) continue;
      p_.layout[static_cast<std::size_t>(t)] = r.out[j];
      decided_[static_cast<std::size_t>(t)] = true;
      p_.origin[static_cast<std::size_t>(t)] = "propagated";
      if (r.out_blocked[j] < 0) continue;
      int from = -1;
      for (std::size_t k = 0; k < n.inputs.size() && from < 0; ++k)
        if (n.inputs[k] >= 0 && p_.blocked.count(n.inputs[k])) from = root_[n.inputs[k]];
      if (from < 0) continue;
      p_.blocked[t] = {r.out_blocked[j], r.blocks};
      root_[t] = from;
    }
  }

  // Weight copies no node read: replicated, like their weights.
  void replicate_unread_copies() {
    for (const auto& [t, j] : deferred_) settle_copy(t);
    for (const auto& [t, j] : deferred_)
      if (!decided_[static_cast<std::size_t>(t)]) {
        p_.origin[static_cast<std::size_t>(t)] = "replicated";
        fix(t, Sharding::replicated(g_.tensor(t).dims.size()));
      }
  }

  // Graph outputs leave each rank whole except for the data-parallel split, so the job's outputs
  // are the unsharded model's rows.
  Status resolve_graph_outputs() {
    for (int out : g_.outputs) {
      const Sharding s = p_.layout[static_cast<std::size_t>(out)];
      Sharding want = Sharding::replicated(s.dims.size());
      for (std::size_t d = 0; d < s.dims.size(); ++d)
        for (int a : s.dims[d])
          if (a == o_.dp_axis) want.dims[d] = {a};
      if (want != s) HP_TRY(add_redist(out, -1, s, want));
    }
    return {};
  }

  // A head Reshape that gathers the output of a column-parallel projection (fewer heads than tp
  // ranks, as GQA's kv heads): replicate that weight in the next run, every rank computing it whole
  // is cheaper than gathering it.
  void replicate_head_cut_weights() {
    for (const auto& rd : p_.redistributions) {
      if (rd.node < 0 || g_.node(rd.node).op_type != "Reshape" || o_.tp_axis < 0) continue;
      auto has_tp = [&](const Sharding& s) {
        for (const auto& e : s.dims)
          if (std::find(e.begin(), e.end(), o_.tp_axis) != e.end()) return true;
        return false;
      };
      if (!has_tp(rd.from) || has_tp(rd.to) || !rd.from.partial.empty()) continue;
      int prod = g_.tensor(rd.tensor).producer;
      if (prod >= 0 && g_.node(prod).op_type == "Add")
        for (int in : g_.node(prod).inputs)
          if (in >= 0 && g_.tensor(in).producer >= 0 &&
              g_.node(g_.tensor(in).producer).op_type == "MatMul")
            prod = g_.tensor(in).producer;
      if (prod < 0 || g_.node(prod).op_type != "MatMul" || g_.node(prod).inputs.size() < 2)
        continue;
      const int w = g_.node(prod).inputs[1];
      if (w < 0 || p_.origin[static_cast<std::size_t>(w)] != "column-parallel" ||
          retry_.replicate.count(w))
        continue;
      retry_.replicate.insert(w);
      retry_.again = true;
    }
  }

  const model::Graph& g_;
  const PropagateOptions& o_;
  Retry& retry_;
  const onnx::GraphProto& pg_;
  Propagation p_;
  std::vector<bool> decided_;    // per tensor: its layout is final
  std::map<int, int> root_;      // blocked tensor -> the fused weight it comes from
  std::map<int, int> deferred_;  // weight copy -> the Transpose/Identity/Cast node computing it
  detail::RuleContext c_;
  bool unknown_ = false;  ///< describe_node: the node has a tensor of unknown shape
  int whole_nodes_ = 0;   ///< nodes run whole for that (whole_on_every_rank)
  std::string first_whole_;
};

Expected<Propagation> propagate_once(const model::Model& model, const model::Graph& g,
                                     const PropagateOptions& o, Retry& retry) {
  return Run(model, g, o, retry).run();
}

}  // namespace
}  // namespace hp::shard
