// The middle of exported attention fused into one hp.nn.MaskedSoftmax node (exec_fuse_graph.h).
//
// PyTorch exports scaled, masked attention scores as
//     s = Mul(QK, scale) (or Div(QK, d)) -> Where(mask, fill, s) (or Where(mask, s, fill)) ->
//     Softmax
// three passes over the batch x heads x seq x seq scores. hp.nn.MaskedSoftmax (X, mask?) with
// attributes scale, fill and fill_where does them in one pass per row (plugins/cpu/
// cpu_ops_attention.cpp). Fused only when it computes the same, up to float rounding (a Div by d
// becomes a product with 1/d): the Softmax works along the last axis (opset 13 or later without an
// axis, or axis -1), the scale and fill are constant scalars of rank 0 or 1,
// and the Mul's and Where's outputs are read by the chain alone and are no graph outputs. Either
// the scale or the mask may be missing, not both. In a training graph the backward reads the
// Softmax's output (kept: the fused node writes it), the mask and the constants, not the
// intermediates, so it fuses there too.
#include "exec_fuse_graph.h"

namespace hp::exec {

namespace {

/// Softmax along the last axis, whatever the rank.
bool last_axis_softmax(const PreparedNode& n) {
  if (!is_unary(n, "Softmax") || n.outputs[0] < 0) return false;
  for (const hp_op_attr& a : n.attrs)
    if (std::string(a.name) == "axis") return a.kind == HP_ATTR_INT && a.i == -1;
  return n.opset >= 13;  // the default axis is -1 from opset 13 (1, flattening, before)
}

}  // namespace

int fuse_masked_softmax(FuseGraph& g) {
  int fused = 0;
  for (PreparedNode& sm : g.im.nodes) {
    if (sm.dead || !last_axis_softmax(sm)) continue;
    int scores = sm.inputs[0], mask = -1;
    float fill = 0, scale = 1;
    bool fill_where = true;
    PreparedNode* where = g.sole_producer(scores);
    if (where && where->op_type == "Where" && where->domain.empty() && where->inputs.size() == 3 &&
        where->outputs.size() == 1 && where->inputs[0] >= 0) {
      auto a = g.low_rank_scalar(where->inputs[1]), b = g.low_rank_scalar(where->inputs[2]);
      if (a && !b && where->inputs[2] >= 0) {
        fill = *a;
        scores = where->inputs[2];
      } else if (b && !a && where->inputs[1] >= 0) {
        fill = *b;
        fill_where = false;
        scores = where->inputs[1];
      } else {
        where = nullptr;
      }
      if (where) mask = where->inputs[0];
    } else {
      where = nullptr;
    }
    PreparedNode* mul = g.sole_producer(scores);
    if (mul && mul->domain.empty() && mul->inputs.size() == 2 && mul->outputs.size() == 1 &&
        (mul->op_type == "Mul" || mul->op_type == "Div")) {
      const bool div = mul->op_type == "Div";
      auto right = g.low_rank_scalar(mul->inputs[1]);
      auto left = div ? std::nullopt : g.low_rank_scalar(mul->inputs[0]);
      if (right && !(div && *right == 0) && mul->inputs[0] >= 0) {
        scale = div ? 1.f / *right : *right;
        scores = mul->inputs[0];
      } else if (left && mul->inputs[1] >= 0) {
        scale = *left;
        scores = mul->inputs[1];
      } else {
        mul = nullptr;
      }
    } else {
      mul = nullptr;
    }
    if (!where && !mul) continue;
    if (where) where->dead = true;
    if (mul) mul->dead = true;
    rewrite_as(sm, "MaskedSoftmax",
               mask >= 0 ? std::vector<int>{scores, mask} : std::vector<int>{scores});
    add_float_attr(sm, "scale", scale);
    add_float_attr(sm, "fill", fill);
    add_int_attr(sm, "fill_where", fill_where ? 1 : 0);
    ++fused;
  }
  return fused;
}

}  // namespace hp::exec
