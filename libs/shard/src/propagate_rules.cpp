// Per-op sharding rules (docs/shard.md, "Propagation"; MatMul/Gemm in propagate_rules_contract.cpp;
// the rest follow the same principle: a dim an op mixes across — a normalised, reduced, softmaxed,
// split or concatenated dim — must be whole on every rank, every other dim keeps the split it
// arrives with).
#include "propagate_rules.h"
#include "propagate_rule_util.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <set>

namespace hp::shard::detail {
namespace {

// Elementwise ops on a blocked input (propagate.h): the output is blocked on the same dim when
// every input covering it is blocked the same way or is a flexible weight (a bias, then cut the
// same way).
void mark_blocked(const RuleContext& c, const std::vector<int>& slots, RuleResult& r) {
  if (c.out_shapes.empty() || r.out.empty()) return;
  std::size_t R = c.out_shapes[0].size();
  int d = -1;
  std::int64_t k = 1;
  for (int s : slots) {
    const auto& in = c.in[static_cast<std::size_t>(s)];
    if (!in.present || in.blocked_dim < 0) continue;
    int od = in.blocked_dim + static_cast<int>(R) - static_cast<int>(in.shape.size());
    if ((d >= 0 && (od != d || in.blocks != k)) || od < 0) return;
    d = od;
    k = in.blocks;
  }
  if (d < 0) return;
  auto ud = static_cast<std::size_t>(d);
  const Entry& e = r.out[0].dims[ud];
  if (e.empty()) return;
  for (int s : slots) {
    const auto& in = c.in[static_cast<std::size_t>(s)];
    if (!in.present) continue;
    std::size_t rk = in.shape.size();
    if (ud + rk < R) continue;
    std::size_t ik = ud + rk - R;
    if (in.shape[ik] == 1 && c.out_shapes[0][ud] != 1) continue;
    if (r.req[static_cast<std::size_t>(s)].dims[ik] != e) return;
    if (in.flexible)
      r.req_blocked[static_cast<std::size_t>(s)] = static_cast<int>(ik);
    else if (in.blocked_dim != static_cast<int>(ik))
      return;
  }
  for (std::size_t j = 0; j < r.out.size(); ++j)
    if (c.out_shapes[j].size() == R) r.out_blocked[j] = d;
  r.blocks = k;
  r.blocks_ok = true;
}

// Numpy-broadcasting elementwise ops over any number of inputs.
RuleResult elementwise(const RuleContext& c, const std::vector<int>& slots) {
  RuleResult r = base(c);
  if (c.out_shapes.empty()) return replicate_all(c);
  const auto& os = c.out_shapes[0];
  std::size_t R = os.size();
  std::vector<Entry> ent(R);
  bool partial_tp = false;
  for (std::size_t d = 0; d < R; ++d) {
    bool have = false, conflict = false;
    // A whole activation (no pending sum) meeting split activations: a residual stream, which the
    // next norm needs whole anyway, so gather the split one once here rather than before every
    // norm.
    bool whole_activation = false, split_all_activations = true;
    Entry chosen;
    for (int k : slots) {
      const auto& in = c.in[static_cast<std::size_t>(k)];
      if (!in.present || in.flexible) continue;
      std::size_t rk = in.shape.size();
      if (d + rk < R) continue;
      std::size_t ik = d + rk - R;
      if (in.shape[ik] == 1 && os[d] != 1) continue;
      const Entry& e = in.cur.dims[ik];
      if (e.empty())
        whole_activation = whole_activation || (in.is_activation && in.cur.partial.empty());
      else
        split_all_activations =
            split_all_activations && in.is_activation &&
            std::find(e.begin(), e.end(), c.dp_axis) == e.end();  // batch splits stay
      if (!have) {
        chosen = e;
        have = true;
      } else if (e != chosen) {
        // One side split, the other whole: slicing the whole one is free, gathering is not.
        if (chosen.empty())
          chosen = e;
        else if (!e.empty())
          conflict = true;
      }
    }
    if (whole_activation && split_all_activations) conflict = true;
    ent[d] = conflict ? Entry{} : chosen;
  }
  for (int k : slots) {
    const auto& in = c.in[static_cast<std::size_t>(k)];
    if (!in.present) continue;
    for (const auto& p : in.cur.partial)
      if (p.axis == c.tp_axis) partial_tp = true;
  }
  make_unique(ent, iota_order(R));
  // Sequence parallelism: a row-parallel partial sum entering the residual stream is
  // reduce-scattered over the sequence dim ([b, s, h]: dim R-2) instead of all-reduced.
  if (c.sequence_parallel && partial_tp && R >= 3 && c.tp_axis >= 0) {
    std::set<int> used;
    for (auto& e : ent) used.insert(e.begin(), e.end());
    Entry& sd = ent[R - 2];
    if (!used.count(c.tp_axis) && sd.empty() &&
        os[R - 2] % c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] == 0)
      sd = Entry{c.tp_axis};
  }
  for (int k : slots) {
    const auto& in = c.in[static_cast<std::size_t>(k)];
    if (!in.present) continue;
    std::size_t rk = in.shape.size();
    Sharding s = Sharding::replicated(rk);
    for (std::size_t ik = 0; ik < rk; ++ik) {
      std::size_t d = ik + R - rk;
      if (in.shape[ik] == 1 && os[d] != 1) continue;
      s.dims[ik] = ent[d];
    }
    r.req[static_cast<std::size_t>(k)] = s;
  }
  for (auto& o : r.out) o = make(ent);
  mark_blocked(c, slots, r);
  return r;
}

RuleResult elementwise_all(const RuleContext& c) { return elementwise(c, iota_order(c.in.size())); }

// Keeps the arriving split everywhere except `whole` dims; outputs of the same rank get the same.
RuleResult keep_except(const RuleContext& c, const std::set<int>& whole,
                       bool keep_partial = false) {
  RuleResult r = base(c);
  const auto& in = c.in[0];
  Sharding s = in.cur;
  if (in.flexible) s = Sharding::replicated(in.shape.size());
  for (int d : whole)
    if (d >= 0 && static_cast<std::size_t>(d) < s.dims.size())
      s.dims[static_cast<std::size_t>(d)].clear();
  if (!keep_partial) s.partial.clear();
  r.req[0] = s;
  for (std::size_t j = 0; j < r.out.size(); ++j)
    if (c.out_shapes[j].size() == s.dims.size()) r.out[j] = s;
  return r;
}

// Reshape as a regrouping of row-major dims: a split dim survives when it is the major non-trivial
// dim of its group on both sides and the output's major dim divides by its shard count (so
// [b, s, h*d] -> [b, s, h, d] keeps the split on h, and back).
RuleResult reshape(const RuleContext& c) {
  RuleResult r = base(c);
  const auto& in = c.in[0];
  const auto& I = in.shape;
  const auto& O = c.out_shapes[0];
  Sharding s = in.flexible ? Sharding::replicated(I.size()) : in.cur;
  std::vector<Entry> out(O.size());
  std::size_t i = 0, j = 0;
  while (i < I.size() || j < O.size()) {
    std::size_t ia = i, ja = j;
    std::int64_t pi = 1, pj = 1;
    if (i < I.size()) pi *= I[i++];
    if (j < O.size()) pj *= O[j++];
    while (pi != pj) {
      if (pi < pj && i < I.size())
        pi *= I[i++];
      else if (pj < pi && j < O.size())
        pj *= O[j++];
      else
        break;
    }
    // Major non-trivial dims of the group on each side.
    std::size_t im = ia, om = ja;
    while (im < i && I[im] == 1) ++im;
    while (om < j && O[om] == 1) ++om;
    for (std::size_t k = ia; k < i; ++k) {
      Entry& e = s.dims[k];
      if (e.empty()) continue;
      if (static_cast<int>(k) == in.blocked_dim) {
        // A blocked dim [k*n] -> [k, H, ..]: each block's split lands on H (the fused q|k|v head
        // split).
        if (pi == pj && i - ia == 1 && om + 1 < j && O[om] == in.blocks &&
            divides(*c.mesh, e, O[om + 1])) {
          out[om + 1] = e;
          r.blocks_ok = true;
        }
        continue;
      }
      bool ok = pi == pj && k == im && om < j && divides(*c.mesh, e, O[om]);
      if (ok)
        out[om] = e;
      else
        e.clear();
    }
  }
  r.req[0] = s;
  r.out[0] = make(out, s.partial);
  return r;
}

RuleResult transpose(const RuleContext& c) {
  RuleResult r = base(c);
  const auto& in = c.in[0];
  std::size_t R = in.shape.size();
  auto perm = attr_ints(*c.node, "perm");
  if (perm.empty())
    for (std::size_t i = 0; i < R; ++i) perm.push_back(static_cast<std::int64_t>(R - 1 - i));
  Sharding s = in.flexible ? Sharding::replicated(R) : in.cur;
  r.req[0] = s;
  Sharding o = s;
  for (std::size_t i = 0; i < R && i < perm.size(); ++i)
    o.dims[i] = s.dims[static_cast<std::size_t>(perm[i])];
  r.out[0] = o;
  return r;
}

std::vector<int> reduce_axes(const RuleContext& c, std::size_t rank) {
  std::vector<std::int64_t> axes = attr_ints(*c.node, "axes");
  if (axes.empty() && c.node->input_size() > 1 && !c.node->input(1).empty())
    axes = const_ints(*c.proto, c.node->input(1));
  if (axes.empty() && find_attr(*c.node, "axis")) axes.push_back(attr_int(*c.node, "axis", 0));
  std::vector<int> out;
  if (axes.empty()) {
    if (attr_int(*c.node, "noop_with_empty_axes", 0) != 0) return out;
    for (std::size_t d = 0; d < rank; ++d) out.push_back(static_cast<int>(d));
    return out;
  }
  for (auto a : axes) out.push_back(norm_axis(a, rank));
  return out;
}

RuleResult reduce(const RuleContext& c) {
  RuleResult r = base(c);
  const auto& in = c.in[0];
  std::size_t R = in.shape.size();
  auto axes = reduce_axes(c, R);
  std::set<int> whole(axes.begin(), axes.end());
  Sharding s = in.flexible ? Sharding::replicated(R) : in.cur;
  s.partial.clear();
  for (int d : whole) s.dims[static_cast<std::size_t>(d)].clear();
  r.req[0] = s;
  bool keep = attr_int(*c.node, "keepdims", 1) != 0;
  std::vector<Entry> o;
  for (std::size_t d = 0; d < R; ++d) {
    if (whole.count(static_cast<int>(d)) && !keep) continue;
    o.push_back(s.dims[d]);
  }
  if (o.size() == c.out_shapes[0].size())
    r.out[0] = make(o);
  else
    r.req[0] = Sharding::replicated(R);
  return r;
}

RuleResult expand(const RuleContext& c) {
  RuleResult r = base(c);
  const auto& in = c.in[0];
  const auto& os = c.out_shapes[0];
  std::size_t ri = in.shape.size(), R = os.size();
  if (ri > R) return replicate_all(c);
  Sharding s = in.flexible ? Sharding::replicated(ri) : in.cur;
  s.partial.clear();
  std::vector<Entry> o(R);
  for (std::size_t i = 0; i < ri; ++i) {
    std::size_t d = i + R - ri;
    if (in.shape[i] == os[d])
      o[d] = s.dims[i];
    else
      s.dims[i].clear();
  }
  r.req[0] = s;
  r.out[0] = make(o);
  return r;
}

RuleResult concat(const RuleContext& c) {
  RuleResult r = elementwise_all(c);
  if (c.out_shapes.empty()) return r;
  int axis = norm_axis(attr_int(*c.node, "axis", 0), c.out_shapes[0].size());
  for (auto& s : r.req)
    if (static_cast<std::size_t>(axis) < s.dims.size())
      s.dims[static_cast<std::size_t>(axis)].clear();
  for (auto& s : r.out)
    if (static_cast<std::size_t>(axis) < s.dims.size())
      s.dims[static_cast<std::size_t>(axis)].clear();
  return r;
}

const std::set<std::string>& elementwise_ops() {
  static const std::set<std::string> ops{
      "Add",     "Sub",     "Mul",         "Div",       "Pow",     "Max",         "Min",
      "Mod",     "Where",   "Equal",       "Less",      "Greater", "LessOrEqual", "GreaterOrEqual",
      "And",     "Or",      "Xor",         "Not",       "Relu",    "Gelu",        "Erf",
      "Tanh",    "Sigmoid", "Exp",         "Log",       "Sqrt",    "Reciprocal",  "Neg",
      "Abs",     "Cast",    "CastLike",    "Sin",       "Cos",     "Softplus",    "LeakyRelu",
      "Elu",     "Selu",    "HardSigmoid", "HardSwish", "Mish",    "Clip",        "Floor",
      "Ceil",    "Round",   "Sign",        "IsNaN",     "IsInf",   "PRelu",       "BitShift",
      "Dropout", "Identity"};
  return ops;
}

}  // namespace

std::vector<std::int64_t> const_ints(const onnx::GraphProto& g, const std::string& name) {
  const onnx::TensorProto* t = nullptr;
  for (const auto& i : g.initializer())
    if (i.name() == name) t = &i;
  if (!t)
    for (const auto& n : g.node())
      if (n.op_type() == "Constant" && n.output_size() == 1 && n.output(0) == name)
        for (const auto& a : n.attribute())
          if (a.name() == "value") t = &a.t();
  std::vector<std::int64_t> v;
  if (!t) return v;
  if (t->data_type() == onnx::TensorProto::INT64) {
    if (!t->raw_data().empty()) {
      v.resize(t->raw_data().size() / 8);
      std::memcpy(v.data(), t->raw_data().data(), v.size() * 8);
    } else {
      v.assign(t->int64_data().begin(), t->int64_data().end());
    }
  } else if (t->data_type() == onnx::TensorProto::INT32) {
    if (!t->raw_data().empty()) {
      std::vector<std::int32_t> w(t->raw_data().size() / 4);
      std::memcpy(w.data(), t->raw_data().data(), w.size() * 4);
      v.assign(w.begin(), w.end());
    } else {
      v.assign(t->int32_data().begin(), t->int32_data().end());
    }
  }
  return v;
}

RuleResult apply_rule(const RuleContext& c) {
  const std::string& op = c.node->op_type();
  const std::string& dom = c.node->domain();
  if (!dom.empty() && dom != "ai.onnx") return replicate_all(c);
  bool shapes_ok = !c.in.empty() && c.in[0].present;
  if (op == "Shape" || op == "Size" || op == "Constant") {  // read no data
    RuleResult r = base(c);
    r.blocks_ok = true;
    return r;
  }
  if (!shapes_ok) return replicate_all(c);
  if (elementwise_ops().count(op)) {
    // Dropout's second output (mask) and CastLike's target follow the data.
    return elementwise_all(c);
  }
  if (op == "MatMul") return matmul(c, false);
  if (op == "Gemm") return matmul(c, true);
  if (op == "Einsum") return einsum(c);
  if (op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" || op == "Flatten") return reshape(c);
  if (op == "Transpose") return transpose(c);
  if (op == "Gather") return gather(c);
  if (op == "Expand") return expand(c);
  if (op == "Conv") return conv(c);
  if (op == "Concat") return concat(c);
  std::size_t R = c.in[0].shape.size();
  if (op == "Softmax" || op == "LogSoftmax") {
    int axis = norm_axis(attr_int(*c.node, "axis", c.opset >= 13 ? -1 : 1), R);
    std::set<int> whole{axis};
    if (c.opset < 13)
      for (std::size_t d = static_cast<std::size_t>(axis); d < R; ++d)
        whole.insert(static_cast<int>(d));
    return keep_except(c, whole);
  }
  if (op == "LayerNormalization" || op == "RMSNormalization" ||
      op == "SimplifiedLayerNormalization") {
    int axis = norm_axis(attr_int(*c.node, "axis", -1), R);
    std::set<int> whole;
    for (std::size_t d = static_cast<std::size_t>(axis); d < R; ++d)
      whole.insert(static_cast<int>(d));
    RuleResult r = keep_except(c, whole);
    for (std::size_t k = 1; k < c.in.size(); ++k)
      r.req[k] = Sharding::replicated(c.in[k].shape.size());
    for (std::size_t j = 1; j < r.out.size(); ++j) {
      r.out[j] = Sharding::replicated(c.out_shapes[j].size());
      for (int d = 0; d < axis && static_cast<std::size_t>(d) < r.out[j].dims.size(); ++d)
        r.out[j].dims[static_cast<std::size_t>(d)] = r.req[0].dims[static_cast<std::size_t>(d)];
    }
    return r;
  }
  if (op.rfind("Reduce", 0) == 0 || op == "ArgMax" || op == "ArgMin") return reduce(c);
  if (op == "Split") {
    int axis = norm_axis(attr_int(*c.node, "axis", 0), R);
    const auto& in = c.in[0];
    if (in.blocked_dim == axis && !in.flexible &&
        static_cast<std::int64_t>(c.out_shapes.size()) == in.blocks) {
      // A fused q|k|v split into its k blocks: every part keeps the split of its block, locally.
      const Entry& e = in.cur.dims[static_cast<std::size_t>(axis)];
      bool even = !e.empty();
      for (const auto& os : c.out_shapes)
        even = even && os.size() == R &&
               os[static_cast<std::size_t>(axis)] * in.blocks ==
                   in.shape[static_cast<std::size_t>(axis)] &&
               divides(*c.mesh, e, os[static_cast<std::size_t>(axis)]);
      if (even) {
        RuleResult r = keep_except(c, {});
        r.blocks_ok = true;
        return r;
      }
    }
    return keep_except(c, {axis});
  }
  if (op == "TopK") {
    int axis = norm_axis(attr_int(*c.node, "axis", -1), R);
    return keep_except(c, {axis});
  }
  if (op == "Slice") {
    std::set<int> whole;
    const auto& os = c.out_shapes[0];
    for (std::size_t d = 0; d < R && d < os.size(); ++d)
      if (c.in[0].shape[d] != os[d]) whole.insert(static_cast<int>(d));
    // Slices that keep a dim's size but step through it are caught by their axes input.
    auto axes = c.node->input_size() > 3 ? const_ints(*c.proto, c.node->input(3))
                                         : std::vector<std::int64_t>{};
    for (auto a : axes) whole.insert(norm_axis(a, R));
    if (c.node->input_size() <= 3)
      for (std::size_t d = 0; d < R; ++d) whole.insert(static_cast<int>(d));
    return keep_except(c, whole);
  }
  if (op == "Trilu" && R >= 2)
    return keep_except(c, {static_cast<int>(R - 2), static_cast<int>(R - 1)});
  return replicate_all(c);
}

}  // namespace hp::shard::detail
