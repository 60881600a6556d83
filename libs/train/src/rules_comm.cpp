// Gradient rules of the "hp"-domain collectives that hp shard writes into a rank's partition
// (hp/core/hp_domain.h): each one's conjugate (docs/training.md, "Tensor parallelism").
//
// They hold because the gradient arriving at a tensor every member holds whole is, on every
// member, the whole gradient: where a same-valued tensor enters a region the members compute in
// parts, the gradient is all-reduced (the Identity rule in rules_elementwise.cpp, GradSpec::tp).
//   AllReduce(sum)  Y = Σ X_r                  dX_r = dY
//   AllGather       Y = [X_0 | X_1 | ...]      dX_r = member r's block of dY
//   ReduceScatter   Y_r = block r of Σ X_q      dX_r = AllGather(dY)
//   AllToAll        blocks exchanged           the reverse exchange (split and concat swapped)
//   Dispatch        Y_e = the rows routed to    Combine(dY_e, I), summed over the expert axis
//                   local expert e             (a token's rows at all its experts; stacked X: not
//                                              summed)
//   Combine         Z[t, e] = the row of (t,e) dY_e = Dispatch(dZ, I) of the stacked gradient
//   Routed rows move to the members holding their experts and back, so no member sums anything
//   another holds: the conjugate of each is the other.
#include <fmt/core.h>

#include <algorithm>

#include "grad_ctx.h"
#include "hp/core/hp_domain.h"

namespace hp::train::detail {

namespace dom = hp::domain;

std::string all_reduce(GradCtx& c, const std::string& g, const std::vector<std::int64_t>& group) {
  return c.op(
      std::string(dom::kAllReduce), {g},
      {{std::string(dom::kAttrOp), std::string("sum")}, {std::string(dom::kAttrGroup), group}},
      std::string(dom::kDomain));
}

namespace {

std::vector<Attr> group_attrs(GradCtx& c) {
  std::vector<Attr> a{{std::string(dom::kAttrGroup), c.attr_ints(std::string(dom::kAttrGroup))}};
  if (c.has(std::string(dom::kAttrGroupName)))
    a.push_back({std::string(dom::kAttrGroupName),
                 c.attr_s(std::string(dom::kAttrGroupName), "") + ".grad"});
  return a;
}

Status all_reduce_rule(GradCtx& c) {
  const std::string op = c.attr_s(std::string(dom::kAttrOp), "sum");
  if (op != "sum")
    return c.fail(fmt::format("an all-reduce with op '{}' has no gradient (only sum)", op));
  c.grad(0, c.dout(0));
  return {};
}

Status all_gather_rule(GradCtx& c) {
  const auto group = c.attr_ints(std::string(dom::kAttrGroup));
  auto me = std::find(group.begin(), group.end(), c.tp_rank());
  if (me == group.end())
    return c.fail(fmt::format("rank {} is not in the node's group", c.tp_rank()));
  const auto shape = c.static_shape(c.in(0));
  if (!shape) return c.fail("the gathered tensor's shape must be static for the gradient");
  std::int64_t axis = c.attr_i(std::string(dom::kAttrAxis), 0);
  if (axis < 0) axis += static_cast<std::int64_t>(shape->size());
  if (axis < 0 || axis >= static_cast<std::int64_t>(shape->size()))
    return c.fail(fmt::format("axis {} is outside the tensor's {} dims", axis, shape->size()));
  const std::int64_t block = (*shape)[static_cast<std::size_t>(axis)];
  const std::int64_t begin = block * (me - group.begin());
  c.grad(0, c.op("Slice", {c.dout(0), c.i64s({begin}), c.i64s({begin + block}), c.i64s({axis})}));
  return {};
}

Status reduce_scatter_rule(GradCtx& c) {
  const std::string op = c.attr_s(std::string(dom::kAttrOp), "sum");
  if (op != "sum")
    return c.fail(fmt::format("a reduce-scatter with op '{}' has no gradient (only sum)", op));
  auto attrs = group_attrs(c);
  attrs.push_back({std::string(dom::kAttrAxis), c.attr_i(std::string(dom::kAttrAxis), 0)});
  c.grad(0, c.op(std::string(dom::kAllGather), {c.dout(0)}, attrs, std::string(dom::kDomain)));
  return {};
}

Status all_to_all_rule(GradCtx& c) {
  auto attrs = group_attrs(c);
  attrs.push_back(
      {std::string(dom::kAttrSplitAxis), c.attr_i(std::string(dom::kAttrConcatAxis), 0)});
  attrs.push_back(
      {std::string(dom::kAttrConcatAxis), c.attr_i(std::string(dom::kAttrSplitAxis), 0)});
  c.grad(0, c.op(std::string(dom::kAllToAll), {c.dout(0)}, attrs, std::string(dom::kDomain)));
  return {};
}

std::vector<Attr> routed_attrs(GradCtx& c, bool stacked) {
  auto a = group_attrs(c);
  a.push_back({std::string(dom::kAttrExperts), c.attr_i(std::string(dom::kAttrExperts), 0)});
  if (stacked) a.push_back({std::string(dom::kAttrStacked), std::int64_t{1}});
  return a;
}

Status dispatch_rule(GradCtx& c) {
  if (!c.wants(0)) return {};
  std::vector<std::string> ins;
  for (int j = 0; j < c.n_out(); ++j)  // an expert whose rows get no gradient: zeros
    ins.push_back(!c.dout(j).empty()
                      ? c.dout(j)
                      : c.op("Expand", {c.scalar(0.0, c.out(j)), c.shape_of(c.out(j))}));
  ins.push_back(c.in(1));
  const std::string z =
      c.op(std::string(dom::kCombine), ins, routed_attrs(c, false), std::string(dom::kDomain));
  if (c.attr_i(std::string(dom::kAttrStacked), 0) != 0) {
    c.grad(0, z);
    return {};
  }
  c.grad(0, c.op("ReduceSum", {z, c.i64s({1})}, {{"keepdims", std::int64_t{0}}}));
  return {};
}

Status combine_rule(GradCtx& c) {
  const int m = c.n_in() - 1;
  if (c.dout(0).empty() || m < 1) return {};
  const auto ys = c.op_n(std::string(dom::kDispatch), {c.dout(0), c.in(m)}, m,
                         routed_attrs(c, true), std::string(dom::kDomain));
  for (int j = 0; j < m; ++j) c.grad(j, ys[static_cast<std::size_t>(j)]);
  return {};
}

}  // namespace

void register_comm_rules(RuleTable& t) {
  const std::string d = std::string(dom::kDomain) + ".";
  t[d + std::string(dom::kAllReduce)] = all_reduce_rule;
  t[d + std::string(dom::kAllGather)] = all_gather_rule;
  t[d + std::string(dom::kReduceScatter)] = reduce_scatter_rule;
  t[d + std::string(dom::kAllToAll)] = all_to_all_rule;
  t[d + std::string(dom::kDispatch)] = dispatch_rule;
  t[d + std::string(dom::kCombine)] = combine_rule;
}

}  // namespace hp::train::detail
