// Exported attention fused into one hp.nn.Attention node (exec_fuse_graph.h).
//
// PyTorch exports scaled dot-product attention over heads as
//     Q' = Transpose(Q), K' = Transpose(K), V' = Transpose(V)        (heads to the front)
//     P = hp.nn.MaskedSoftmax(MatMul(Q', K'), mask)                   (fuse_masked_softmax's)
//     O = Transpose(MatMul(P, V'))                                    (heads back)
// hp.nn.Attention (Q, K, V, mask?) with the attributes of the MaskedSoftmax (scale, fill,
// fill_where) and the absorbed Transposes' perms (perm_q, perm_k, perm_v, perm_o; absent where
// there was no Transpose) computes it per batch and head, reading Q, K and V where they lie and
// writing O in its final layout: no transposed copies, and the scores of a few query rows at a time
// stay in cache from the first matmul through the softmax to the second (plugins/cpu/
// cpu_ops_attention.cpp). Fused only when the scores and probabilities are read by the chain alone
// and are no graph outputs, which leaves training graphs (their backward reads the probabilities)
// as they are. A Transpose is absorbed when the chain is its only reader and it has an explicit
// perm.
#include "exec_fuse_graph.h"

namespace hp::exec {

namespace {

/// The explicit perm of a Transpose node, else empty.
std::vector<std::int64_t> perm_of(const PreparedNode& n) {
  if (!is_unary(n, "Transpose")) return {};
  for (const hp_op_attr& a : n.attrs)
    if (std::string(a.name) == "perm" && a.kind == HP_ATTR_INTS)
      return std::vector<std::int64_t>(a.ints, a.ints + a.n);
  return {};
}

bool plain_matmul(const PreparedNode* n) {
  return n && !n->dead && n->op_type == "MatMul" && n->domain.empty() && n->inputs.size() == 2 &&
         n->outputs.size() == 1 && n->inputs[0] >= 0 && n->inputs[1] >= 0;
}

}  // namespace

int fuse_attention(FuseGraph& g) {
  int fused = 0;
  for (std::size_t k = 0; k < g.im.nodes.size(); ++k) {
    PreparedNode* pv = &g.im.nodes[k];
    if (!plain_matmul(pv)) continue;
    PreparedNode* sm = g.sole_producer(pv->inputs[0]);
    if (!sm || sm->op_type != "MaskedSoftmax" || sm->domain != "hp.nn") continue;
    PreparedNode* qk = g.sole_producer(sm->inputs[0]);
    if (!plain_matmul(qk)) continue;
    // Each operand: the Transpose's input and perm when the chain is its only reader.
    struct Operand {
      int tensor;
      std::vector<std::int64_t> perm;
      PreparedNode* transpose = nullptr;
    };
    auto operand = [&](int t) {
      Operand o{t, {}};
      PreparedNode* p = g.sole_producer(t);
      if (p && !p->dead) {
        o.perm = perm_of(*p);
        if (!o.perm.empty()) {
          o.tensor = p->inputs[0];
          o.transpose = p;
        }
      }
      return o;
    };
    const Operand q = operand(qk->inputs[0]), kk = operand(qk->inputs[1]),
                  v = operand(pv->inputs[1]);
    // The output: absorbed into a Transpose that alone reads it (which then becomes the node).
    PreparedNode* out = g.sole_reader(pv->outputs[0]);
    std::vector<std::int64_t> perm_o = out ? perm_of(*out) : std::vector<std::int64_t>{};
    PreparedNode* keep = perm_o.empty() ? pv : out;
    std::vector<int> inputs{q.tensor, kk.tensor, v.tensor};
    if (sm->inputs.size() > 1) inputs.push_back(sm->inputs[1]);
    const std::vector<hp_op_attr> softmax_attrs = sm->attrs;
    for (const Operand* o : {&q, &kk, &v})
      if (o->transpose) o->transpose->dead = true;
    sm->dead = true;
    qk->dead = true;
    if (keep != pv) pv->dead = true;
    rewrite_as(*keep, "Attention", std::move(inputs));
    for (const hp_op_attr& a : softmax_attrs) {
      const std::string name = a.name;
      if (name == "scale" || name == "fill") add_float_attr(*keep, a.name, a.f);
      if (name == "fill_where") add_int_attr(*keep, a.name, a.i);
    }
    for (auto [name, perm] :
         {std::pair{"perm_q", q.perm}, {"perm_k", kk.perm}, {"perm_v", v.perm}, {"perm_o", perm_o}})
      if (!perm.empty()) add_ints_attr(*keep, name, perm);
    ++fused;
  }
  return fused;
}

}  // namespace hp::exec
