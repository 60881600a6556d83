// Whether an expert layer can be dispatched by its routing (hp/train/expert_parallel.h,
// routed_indices): the exported graph runs every expert on every token and then keeps only the
// (token, expert) pairs its router chose, so running each expert on its routed tokens alone, and
// leaving the other pairs zero, computes the same values and the same gradients, provided that
//  - what reads the stacked outputs keeps only the chosen pairs: a GatherElements along the expert
//    axis by the top-k indices (broadcast along trailing axes), or a product with a gate scattered
//    from the top-k weights into zeros (that gate is zero elsewhere, and its gradient reaches the
//    weights only at the chosen pairs); and
//  - every expert treats its tokens' rows independently (matrix products with weights, elementwise
//    ops, normalisations over the last axis), so a subset of the rows gives a subset of the result.
// Anything else keeps the all-gather dispatch, which computes what the export computes.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <set>

#include "expert_index.h"

namespace hp::train::detail {

namespace {

/// `t` is a TopK's indices along the last axis of a [tokens, experts] tensor: returns them.
std::string topk_indices(const Index& ix, const std::string& t) {
  auto p = ix.producer.find(t);
  if (p == ix.producer.end()) return "";
  const auto& n = ix.g.node(p->second);
  if (n.op_type() != "TopK" || n.output_size() < 2 || n.output(1) != t) return "";
  const std::int64_t axis = attr_int(n, "axis", -1);
  return axis == -1 || axis == 1 ? t : "";
}

/// Follows `t` up through what only copies it along new trailing axes (Unsqueeze after axis 1,
/// Expand, Identity) to the tensor it came from.
std::string through_broadcasts(const Index& ix, std::string t) {
  for (int hops = 0; hops < 8; ++hops) {
    auto p = ix.producer.find(t);
    if (p == ix.producer.end()) return t;
    const auto& n = ix.g.node(p->second);
    if (n.op_type() == "Unsqueeze") {
      auto axes = n.input_size() > 1 ? ix.ints(n.input(1)) : std::nullopt;
      if (!axes) return t;
      for (std::int64_t a : *axes)
        if (a != -1 && a < 2) return t;
    } else if (n.op_type() != "Expand" && n.op_type() != "Identity") {
      return t;
    }
    t = n.input(0);
  }
  return t;
}

/// A zero constant of any shape (torch.zeros_like exports ConstantOfShape with value 0): every
/// field that can hold the value's element is zero.
bool zeros(const Index& ix, const std::string& t) {
  auto p = ix.producer.find(t);
  if (p == ix.producer.end()) return false;
  const auto& n = ix.g.node(p->second);
  if (n.op_type() != "ConstantOfShape") return false;
  for (const auto& a : n.attribute()) {
    if (a.name() != "value") continue;
    const auto& v = a.t();
    auto all_zero = [](const auto& list) {
      return std::all_of(list.begin(), list.end(), [](auto x) { return x == 0; });
    };
    if (!all_zero(v.float_data()) || !all_zero(v.double_data()) || !all_zero(v.int32_data()) ||
        !all_zero(v.int64_data()) || !all_zero(v.uint64_data()) || !all_zero(v.raw_data()))
      return false;
  }
  return true;  // no value: zeros
}

/// A tensor every row reads the same way: a constant or weight of rank <= 1 (broadcast along the
/// last axis) or whose first dimension is 1. Anything else could hold a row per token.
bool same_for_every_row(const Index& ix, const std::string& t) {
  const onnx::TensorProto* v = nullptr;
  if (auto it = ix.inits.find(t); it != ix.inits.end()) v = it->second;
  if (auto p = ix.producer.find(t);
      !v && p != ix.producer.end() && ix.g.node(p->second).op_type() == "Constant")
    for (const auto& a : ix.g.node(p->second).attribute())
      if (a.name() == "value") v = &a.t();
  return v && (v->dims_size() <= 1 || v->dims(0) == 1);
}

/// Ops that act on each row of their row-derived inputs alone.
bool row_op(const onnx::NodeProto& n) {
  static const std::set<std::string> elementwise{
      "Add",  "Sub",  "Mul",      "Div",  "Pow",      "Sqrt",     "Reciprocal",  "Neg",
      "Abs",  "Exp",  "Log",      "Erf",  "Tanh",     "Sigmoid",  "Relu",        "LeakyRelu",
      "Elu",  "Selu", "Celu",     "Gelu", "Softplus", "Softsign", "HardSigmoid", "HardSwish",
      "Mish", "Clip", "Identity", "Cast", "Dropout",  "Min",      "Max",         "Where"};
  const std::string& op = n.op_type();
  if (!n.domain().empty() && n.domain() != "ai.onnx") return false;
  if (elementwise.count(op)) return true;
  if (op == "LayerNormalization" || op == "Softmax" || op == "LogSoftmax")
    return attr_int(n, "axis", -1) == -1;
  return false;
}

bool rows_independent(const Index& ix, const ExpertLayer& l) {
  for (std::size_t x = 0; x < l.nodes.size(); ++x) {
    std::set<std::string> rows{l.tokens};
    for (int k : l.nodes[x]) {  // graph order: producers first
      const auto& n = ix.g.node(k);
      std::vector<bool> from_rows;
      bool any = false;
      for (const auto& i : n.input()) {
        from_rows.push_back(rows.count(i) > 0);
        any = any || from_rows.back();
      }
      if (!any) continue;  // computed from weights and constants alone
      if (n.op_type() == "MatMul" || n.op_type() == "Gemm") {
        // rows x weight: the rows must be the left operand, the rest not row-derived
        if (!from_rows[0] || attr_int(n, "transA", 0) != 0) return false;
        for (std::size_t i = 1; i < from_rows.size(); ++i)
          if (from_rows[i]) return false;
      } else if (!row_op(n)) {
        return false;
      } else {
        for (int i = 0; i < n.input_size(); ++i)
          if (!from_rows[static_cast<std::size_t>(i)] && !n.input(i).empty() &&
              !same_for_every_row(ix, n.input(i)))
            return false;
      }
      for (const auto& o : n.output()) rows.insert(o);
    }
    // What the expert stacks must come from its rows (not a constant of the full token count).
    if (!rows.count(ix.g.node(l.unsqueeze[x]).input(0))) return false;
  }
  return true;
}

}  // namespace

std::string routed_indices(const Index& ix, const ExpertLayer& l) {
  if (l.axis != 1) return "";  // [tokens, experts, ...]
  auto r = ix.readers.find(l.stacked);
  if (r == ix.readers.end() || r->second.size() != 1 || ix.graph_outputs.count(l.stacked))
    return "";
  const auto& reader = ix.g.node(r->second.front());
  std::string indices;
  if (reader.op_type() == "GatherElements" && reader.input(0) == l.stacked &&
      attr_int(reader, "axis", 0) == 1) {
    indices = topk_indices(ix, through_broadcasts(ix, reader.input(1)));
  } else if (reader.op_type() == "Mul" && reader.input_size() == 2) {
    const std::string gate =
        through_broadcasts(ix, reader.input(0) == l.stacked ? reader.input(1) : reader.input(0));
    auto p = ix.producer.find(gate);
    if (p == ix.producer.end()) return "";
    const auto& s = ix.g.node(p->second);
    const std::int64_t axis = attr_int(s, "axis", 0);
    bool plain = true;  // no reduction attribute: the updates are written, not added
    for (const auto& a : s.attribute()) plain = plain && a.name() != "reduction";
    if (s.op_type() == "ScatterElements" && s.input_size() == 3 && (axis == 1 || axis == -1) &&
        plain && zeros(ix, s.input(0)))
      indices = topk_indices(ix, s.input(1));
  }
  if (indices.empty() || !rows_independent(ix, l)) return "";
  return indices;
}

}  // namespace hp::train::detail
