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

}  // namespace

void register_comm_rules(RuleTable& t) {
  const std::string d = std::string(dom::kDomain) + ".";
  t[d + std::string(dom::kAllReduce)] = all_reduce_rule;
  t[d + std::string(dom::kAllGather)] = all_gather_rule;
  t[d + std::string(dom::kReduceScatter)] = reduce_scatter_rule;
  t[d + std::string(dom::kAllToAll)] = all_to_all_rule;
}

}  // namespace hp::train::detail
