// Layer norm exported as primitives, fused into one LayerNormalization node (exec_fuse_graph.h).
//
// Below opset 17 PyTorch exports nn.LayerNorm as
//     mean = ReduceMean(x, axes) -> d = Sub(x, mean) -> Pow(d, 2) -> ReduceMean(axes) -> Add(eps)
//     -> Sqrt -> Div(d, .) -> Mul(., gamma) [-> Add(., beta)]
// nine passes over the activation and eight intermediates; LayerNormalization is one pass per row.
// Fused only when it computes the same: the axes are the last ones (negative, as PyTorch writes
// them, since the rank is not known here), both means keep their dims, the exponent is 2 and eps a
// constant scalar, every intermediate is read by the chain alone (d by the Pow and the Div) and is
// no graph output, eps and the exponent are of rank 0 or 1, and gamma and beta are weights either
// of one element (rank 0 or 1) or of as many dims as axes, none of them 1 (so that the Mul and Add
// broadcast them exactly as LayerNormalization applies them, over the normalised dims). The chain's
// last node becomes the fused one; the others are marked dead. The training graph's backward reads
// only x and gamma of the chain (libs/train/src/norm_chain.cpp), so it fuses there too.
#include <algorithm>
#include <cstring>

#include "exec_fuse_graph.h"

namespace hp::exec {

namespace {

/// The int64 values of a weight or Constant-node output, else nullopt.
std::optional<std::vector<std::int64_t>> const_ints(const FuseGraph& g, int t) {
  const HostTensor* h = g.constant(t);
  if (!h || h->dtype != HP_I64) return std::nullopt;
  std::vector<std::int64_t> v(static_cast<std::size_t>(h->numel()));
  if (!v.empty()) std::memcpy(v.data(), h->data.data(), v.size() * sizeof(std::int64_t));
  return v;
}

/// A ReduceMean keeping its dims over the last axes, as negative axes sorted: their count, else 0.
std::size_t trailing_mean_axes(FuseGraph& g, const PreparedNode& n) {
  if (n.op_type != "ReduceMean" || !n.domain.empty() || n.outputs.size() != 1 || n.inputs.empty() ||
      n.inputs[0] < 0)
    return 0;
  std::optional<std::vector<std::int64_t>> axes;
  for (const hp_op_attr& a : n.attrs) {
    const std::string name = a.name;
    if (name == "keepdims" && a.kind == HP_ATTR_INT && a.i == 0) return 0;
    if (name == "noop_with_empty_axes" && a.kind == HP_ATTR_INT && a.i != 0) return 0;
    if (name == "axes" && a.kind == HP_ATTR_INTS) axes.emplace(a.ints, a.ints + a.n);
  }
  if (!axes && n.inputs.size() >= 2) axes = const_ints(g, n.inputs[1]);
  if (!axes || axes->empty()) return 0;
  std::sort(axes->begin(), axes->end());
  const auto k = static_cast<std::int64_t>(axes->size());
  for (std::int64_t j = 0; j < k; ++j)
    if ((*axes)[static_cast<std::size_t>(j)] != j - k) return 0;
  return axes->size();
}

/// gamma or beta: a float weight of one element, or of `k` dims none of which is 1.
bool affine_ok(FuseGraph& g, int t, std::size_t k) {
  const HostTensor* h = g.weight(t);
  if (!h || (h->dtype != HP_F32 && h->dtype != HP_F64)) return false;
  if (h->numel() == 1) return h->dims.size() <= 1;  // a higher rank would broadcast x up
  return h->dims.size() == k &&
         std::all_of(h->dims.begin(), h->dims.end(), [](std::int64_t d) { return d > 1; });
}

bool is_binary(const PreparedNode* n, const char* op) {
  return n && n->op_type == op && n->domain.empty() && n->inputs.size() == 2 &&
         n->outputs.size() == 1 && n->inputs[0] >= 0 && n->inputs[1] >= 0;
}

}  // namespace

int fuse_layer_norm(FuseGraph& g) {
  int fused = 0;
  for (PreparedNode& mean : g.im.nodes) {
    if (mean.dead) continue;
    const std::size_t k = trailing_mean_axes(g, mean);
    if (k == 0) continue;
    const int x = mean.inputs[0];
    PreparedNode* sub = g.sole_reader(mean.outputs[0]);
    if (!is_binary(sub, "Sub") || sub->inputs[0] != x || sub->inputs[1] != mean.outputs[0])
      continue;
    const int d = sub->outputs[0];
    if (d < 0 || g.readers[static_cast<std::size_t>(d)] != 2) continue;  // the Pow and the Div
    PreparedNode *pow = nullptr, *div = nullptr;
    for (PreparedNode& n : g.im.nodes)
      if (!n.dead && is_binary(&n, "Pow") && n.inputs[0] == d && n.inputs[1] != d)
        pow = &n;
      else if (!n.dead && is_binary(&n, "Div") && n.inputs[0] == d && n.inputs[1] != d)
        div = &n;
    if (!pow || !div || g.other_than_const(*pow, "Pow", 2.0f, false) != d ||
        !g.low_rank_scalar(pow->inputs[1]))
      continue;
    PreparedNode* var = g.sole_reader(pow->outputs[0]);
    if (!var || var->inputs[0] != pow->outputs[0] || trailing_mean_axes(g, *var) != k) continue;
    PreparedNode* add = g.sole_reader(var->outputs[0]);
    if (!is_binary(add, "Add")) continue;
    const int eps_t = add->inputs[0] == var->outputs[0] ? add->inputs[1] : add->inputs[0];
    const std::optional<float> eps = g.low_rank_scalar(eps_t);
    if (!eps || !(*eps >= 0)) continue;
    PreparedNode* sqrt = g.sole_reader(add->outputs[0]);
    if (!sqrt || !is_unary(*sqrt, "Sqrt") || g.sole_reader(sqrt->outputs[0]) != div ||
        div->inputs[1] != sqrt->outputs[0])
      continue;
    PreparedNode* mul = g.sole_reader(div->outputs[0]);
    if (!is_binary(mul, "Mul")) continue;
    const int gamma = mul->inputs[0] == div->outputs[0] ? mul->inputs[1] : mul->inputs[0];
    if (gamma == div->outputs[0] || !affine_ok(g, gamma, k)) continue;
    PreparedNode* tail = mul;
    int beta = -1;
    if (PreparedNode* bias = g.sole_reader(mul->outputs[0]); is_binary(bias, "Add")) {
      const int b = bias->inputs[0] == mul->outputs[0] ? bias->inputs[1] : bias->inputs[0];
      if (b != mul->outputs[0] && affine_ok(g, b, k)) {
        tail = bias;
        beta = b;
      }
    }
    mean.dead = sub->dead = pow->dead = var->dead = add->dead = sqrt->dead = div->dead = true;
    if (tail != mul) mul->dead = true;
    tail->op_type = "LayerNormalization";
    tail->opset = 17;
    tail->inputs = {x, gamma};
    if (beta >= 0) tail->inputs.push_back(beta);
    tail->attrs.clear();
    add_int_attr(*tail, "axis", -static_cast<std::int64_t>(k));
    add_float_attr(*tail, "epsilon", *eps);
    ++fused;
  }
  return fused;
}

}  // namespace hp::exec
