// Gradient rules of the data-movement ops: reshapes go back to the input's shape, transposes
// invert, slices and gathers scatter back (hp.train.SliceGrad / GatherGrad / GatherElementsGrad),
// concat splits, split concatenates (zeros for outputs nothing differentiated), expand sums back.
#include <fmt/core.h>

#include <numeric>

#include "grad_ctx.h"

namespace hp::train::detail {

namespace {

Status reshape_back(GradCtx& c) {
  c.grad(0, c.op("Reshape", {c.dout(0), c.shape_of(c.in(0))}));
  return {};
}

Status transpose(GradCtx& c) {
  std::vector<std::int64_t> perm = c.attr_ints("perm");
  if (perm.empty()) {
    const int r = c.rank(c.in(0));
    if (r < 0) return c.fail("Transpose without perm needs its input's rank, which is unknown");
    for (int k = r - 1; k >= 0; --k) perm.push_back(k);
  }
  // The gradient of an exported weight transpose (x @ W^T) arrives as Gemm(A, B) from MatMul's
  // rule: (op(A) op(B))^T = op'(B) op'(A) is one Gemm with swapped operands and flipped
  // transposes, and no transposed copy (the first Gemm is left without readers and removed).
  if (perm == std::vector<std::int64_t>{1, 0})
    if (const onnx::NodeProto* g = c.emitted_producer(c.dout(0));
        g && g->op_type() == "Gemm" && g->input_size() == 2) {
      std::int64_t ta = 0, tb = 0;
      double alpha = 1.0;
      for (const auto& a : g->attribute()) {
        if (a.name() == "transA") ta = a.i();
        if (a.name() == "transB") tb = a.i();
        if (a.name() == "alpha") alpha = a.f();
      }
      c.grad(0, c.op("Gemm", {g->input(1), g->input(0)},
                     {{"transA", 1 - tb}, {"transB", 1 - ta}, {"alpha", alpha}}));
      return {};
    }
  std::vector<std::int64_t> inv(perm.size());
  for (std::size_t k = 0; k < perm.size(); ++k) inv[static_cast<std::size_t>(perm[k])] = k;
  c.grad(0, c.op("Transpose", {c.dout(0)}, {{"perm", inv}}));
  return {};
}

Status slice(GradCtx& c) {
  std::vector<std::string> ins = {c.dout(0), c.shape_of(c.in(0))};
  for (int i = 1; i < c.n_in(); ++i) ins.push_back(c.in(i));
  c.grad(0, c.hp("SliceGrad", ins));
  return {};
}

Status gather(GradCtx& c) {
  c.grad(0, c.hp("GatherGrad", {c.dout(0), c.shape_of(c.in(0)), c.in(1)},
                 {{"axis", c.attr_i("axis", 0)}}));
  return {};
}

Status gather_elements(GradCtx& c) {
  c.grad(0, c.hp("GatherElementsGrad", {c.dout(0), c.shape_of(c.in(0)), c.in(1)},
                 {{"axis", c.attr_i("axis", 0)}}));
  return {};
}

Status expand(GradCtx& c) {
  c.grad(0, c.hp("SumTo", {c.dout(0), c.shape_of(c.in(0))}));
  return {};
}

/// The length of `t` along `axis` as a 1-D int64 tensor of one element.
std::string dim_of(GradCtx& c, const std::string& t, std::int64_t axis) {
  if (auto s = c.static_shape(t)) {
    const auto r = static_cast<std::int64_t>(s->size());
    return c.i64s({(*s)[static_cast<std::size_t>(axis < 0 ? axis + r : axis)]});
  }
  return c.op("Slice",
              {c.shape_of(t), c.i64s({axis}), c.i64s({axis == -1 ? INT64_MAX : axis + 1})});
}

Status concat(GradCtx& c) {
  const std::int64_t axis = c.attr_i("axis", 0);
  std::vector<std::string> sizes;
  for (int i = 0; i < c.n_in(); ++i) sizes.push_back(dim_of(c, c.in(i), axis));
  std::string split = c.op("Concat", sizes, {{"axis", std::int64_t{0}}});
  auto parts = c.op_n("Split", {c.dout(0), split}, c.n_in(), {{"axis", axis}});
  for (int i = 0; i < c.n_in(); ++i) c.grad(i, parts[static_cast<std::size_t>(i)]);
  return {};
}

Status split(GradCtx& c) {
  std::vector<std::string> parts;
  for (int j = 0; j < c.n_out(); ++j) {
    if (!c.dout(j).empty()) {
      parts.push_back(c.dout(j));
      continue;
    }
    parts.push_back(c.op("Expand", {c.scalar(0.0, c.out(j)), c.shape_of(c.out(j))}));
  }
  c.grad(0, c.op("Concat", parts, {{"axis", c.attr_i("axis", 0)}}));
  return {};
}

Status tile(GradCtx& c) {
  // y = tile(x, r): view dY as [r0, d0, r1, d1, ...] and sum the repeat axes.
  const int r = c.rank(c.in(0));
  auto xs = c.static_shape(c.in(0));
  auto reps = c.const_ints(c.in(1));
  if (r < 0 || !xs || !reps) return c.fail("Tile's gradient needs static input shape and repeats");
  std::vector<std::int64_t> split, axes;
  for (int k = 0; k < r; ++k) {
    split.push_back((*reps)[static_cast<std::size_t>(k)]);
    split.push_back((*xs)[static_cast<std::size_t>(k)]);
    axes.push_back(2 * k);
  }
  std::string v = c.op("Reshape", {c.dout(0), c.i64s(split)});
  c.grad(0, c.op("ReduceSum", {v, c.i64s(axes)}, {{"keepdims", std::int64_t{0}}}));
  return {};
}

Status pad(GradCtx& c) {
  // Constant-mode Pad with non-negative pads: the gradient is the slice of dY the input occupies.
  if (c.attr_s("mode", "constant") != "constant")
    return c.fail("only constant-mode Pad has a gradient rule");
  auto pads = c.const_ints(c.in(1));
  const int r = c.rank(c.in(0));
  if (!pads || r < 0 || static_cast<int>(pads->size()) != 2 * r)
    return c.fail("Pad's gradient needs constant pads and the input's rank");
  std::vector<std::int64_t> starts, ends, axes;
  for (int k = 0; k < r; ++k) {
    const auto b = (*pads)[static_cast<std::size_t>(k)];
    const auto e = (*pads)[static_cast<std::size_t>(k + r)];
    if (b < 0 || e < 0) return c.fail("Pad with negative pads has no gradient rule");
    starts.push_back(b);
    ends.push_back(e == 0 ? INT64_MAX : -e);
    axes.push_back(k);
  }
  c.grad(0, c.op("Slice", {c.dout(0), c.i64s(starts), c.i64s(ends), c.i64s(axes)}));
  return {};
}

/// ScatterElements / ScatterND: the data's gradient is dY where nothing was scattered over it
/// (everywhere under reduction "add"), the updates' gradient is dY gathered at their positions.
Status scatter(GradCtx& c) {
  const bool nd = c.op_type() == "ScatterND";
  const std::string reduction = c.attr_s("reduction", "none");
  if (reduction != "none" && reduction != "add")
    return c.fail("only scatters with reduction 'none' or 'add' have a gradient rule");
  if (c.wants(0)) {
    if (reduction == "add") {
      c.grad(0, c.dout(0));
    } else {
      std::string zeros = c.op("Expand", {c.scalar(0.0, c.in(2)), c.shape_of(c.in(2))});
      std::vector<Attr> attrs;
      if (!nd) attrs.push_back({"axis", c.attr_i("axis", 0)});
      c.grad(0, c.op(c.op_type(), {c.dout(0), c.in(1), zeros}, attrs));
    }
  }
  if (c.wants(2)) {
    if (nd)
      c.grad(2, c.op("GatherND", {c.dout(0), c.in(1)}));
    else
      c.grad(2, c.op("GatherElements", {c.dout(0), c.in(1)}, {{"axis", c.attr_i("axis", 0)}}));
  }
  return {};
}

}  // namespace

void register_shape_rules(RuleTable& t) {
  t["ScatterElements"] = scatter;
  t["ScatterND"] = scatter;
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}) t[op] = reshape_back;
  t["Transpose"] = transpose;
  t["Slice"] = slice;
  t["Gather"] = gather;
  t["GatherElements"] = gather_elements;
  t["Expand"] = expand;
  t["Concat"] = concat;
  t["Split"] = split;
  t["Tile"] = tile;
  t["Pad"] = pad;
}

}  // namespace hp::train::detail
