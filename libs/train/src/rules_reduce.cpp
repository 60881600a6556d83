// Gradient rules of the reductions (docs/training.md, "Gradient rules"): ReduceSum and ReduceMean,
// the norms and log-sums (ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp),
// ReduceMax / ReduceMin and the global pools. Each brings dY (and, where the derivative reads it,
// Y) back over the reduced axes and broadcasts it to X's shape, then multiplies by the local
// derivative. Max and min split dY evenly among the elements equal to the extreme, as PyTorch's
// amax / amin do (ReLU outputs tie at zero often enough for this to matter).
#include <algorithm>

#include "grad_ctx.h"

namespace hp::train::detail {

std::string reduce_over(GradCtx& c, const std::string& type, const std::string& x,
                        const std::vector<std::int64_t>& axes, bool keepdims) {
  const bool as_input = type == "ReduceSum" ? c.opset() >= 13 : c.opset() >= 18;
  std::vector<Attr> attrs = {{"keepdims", static_cast<std::int64_t>(keepdims)}};
  if (axes.empty()) return c.op(type, {x}, attrs);  // every axis
  if (as_input) return c.op(type, {x, c.i64s(axes)}, attrs);
  attrs.push_back({"axes", axes});
  return c.op(type, {x}, attrs);
}

std::string fan_in(GradCtx& c, const std::string& x, const std::string& y) {
  std::string count = c.op("Div", {c.op("Size", {x}), c.op("Size", {y})});
  return c.op("Cast", {count}, {{"to", static_cast<std::int64_t>(c.elem_type(x))}});
}

namespace {

/// The axes a Reduce* node reduces: an input from opset 18 (ReduceSum from 13), an attribute
/// before. Empty means every axis; `noop` an empty list with noop_with_empty_axes (the identity).
struct Axes {
  std::vector<std::int64_t> axes;
  bool noop = false;
};

Expected<Axes> axes_of(GradCtx& c) {
  Axes r;
  const bool axes_input = c.op_type() == "ReduceSum" || c.opset() >= 18;
  if (axes_input) {
    if (!c.in(1).empty()) {
      auto a = c.const_ints(c.in(1));
      if (!a) return c.fail("the reduction axes must be constant for the gradient");
      r.axes = *a;
    }
  } else if (c.has("axes")) {
    r.axes = c.attr_ints("axes");
  }
  r.noop = r.axes.empty() && c.attr_i("noop_with_empty_axes", 0) != 0;
  if (!r.axes.empty()) {
    const int rank = c.rank(c.in(0));
    if (rank < 0) return c.fail("the reduction's gradient needs its input's rank, unknown here");
    for (auto& a : r.axes) a = a < 0 ? a + rank : a;
    std::sort(r.axes.begin(), r.axes.end());
  }
  return r;
}

/// `t`, of the reduction's output shape, broadcast back to X's shape.
std::string back(GradCtx& c, const Axes& a, const std::string& t) {
  std::string g = t;
  if (!a.axes.empty() && c.attr_i("keepdims", 1) == 0) g = c.op("Unsqueeze", {g, c.i64s(a.axes)});
  return c.op("Expand", {g, c.shape_of(c.in(0))});
}

Status reduce(GradCtx& c) {
  auto a = axes_of(c);
  if (!a) return a.error();
  if (a->noop) return c.grad(0, c.dout(0)), Status{};
  const std::string& x = c.in(0);
  const std::string dy = back(c, *a, c.dout(0));
  const std::string& type = c.op_type();
  std::string g;
  if (type == "ReduceSum") {
    g = dy;
  } else if (type == "ReduceMean") {
    g = c.op("Div", {dy, fan_in(c, x, c.out(0))});
  } else if (type == "ReduceSumSquare") {  // 2 x
    g = c.op("Mul", {dy, c.op("Mul", {x, c.scalar(2.0, x)})});
  } else if (type == "ReduceL1") {  // sign(x)
    g = c.op("Mul", {dy, c.op("Sign", {x})});
  } else if (type == "ReduceL2") {  // x / y, 0 where y = 0 (torch's norm backward)
    const std::string y = back(c, *a, c.out(0));
    const std::string zero = c.scalar(0.0, x);
    const std::string at_zero = c.op("Equal", {y, zero});
    const std::string safe = c.op("Where", {at_zero, c.scalar(1.0, x), y});
    g = c.op("Where", {at_zero, zero, c.op("Mul", {dy, c.op("Div", {x, safe})})});
  } else if (type == "ReduceLogSum") {  // 1 / sum = exp(-y)
    g = c.op("Mul", {dy, c.op("Exp", {c.op("Neg", {back(c, *a, c.out(0))})})});
  } else if (type == "ReduceLogSumExp") {  // softmax over the reduced axes: exp(x - y)
    g = c.op("Mul", {dy, c.op("Exp", {c.op("Sub", {x, back(c, *a, c.out(0))})})});
  } else {  // ReduceMax / ReduceMin: dY split evenly over the elements equal to the result
    const std::string hit = c.op("Equal", {x, back(c, *a, c.out(0))});
    const std::string count = reduce_over(
        c, "ReduceSum", c.op("Cast", {hit}, {{"to", static_cast<std::int64_t>(c.elem_type(x))}}),
        a->axes, true);
    g = c.op("Where", {hit, c.op("Div", {dy, count}), c.scalar(0.0, x)});
  }
  c.grad(0, g);
  return {};
}

std::vector<std::int64_t> spatial_axes(int rank) {
  std::vector<std::int64_t> axes;
  for (int d = 2; d < rank; ++d) axes.push_back(d);
  return axes;
}

Status global_average_pool(GradCtx& c) {
  std::string g = c.op("Div", {c.dout(0), fan_in(c, c.in(0), c.out(0))});
  c.grad(0, c.op("Expand", {g, c.shape_of(c.in(0))}));
  return {};
}

Status global_max_pool(GradCtx& c) {  // Y is N x C x 1...: it broadcasts against X as it is
  const std::string& x = c.in(0);
  const int r = c.rank(x);
  if (r < 3) return c.fail("the gradient needs the input's rank (N x C x spatial), unknown here");
  const std::string hit = c.op("Equal", {x, c.out(0)});
  const std::string count = reduce_over(
      c, "ReduceSum", c.op("Cast", {hit}, {{"to", static_cast<std::int64_t>(c.elem_type(x))}}),
      spatial_axes(r), true);
  c.grad(0, c.op("Where", {hit, c.op("Div", {c.dout(0), count}), c.scalar(0.0, x)}));
  return {};
}

}  // namespace

void register_reduce_rules(RuleTable& t) {
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2",
                         "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMin"})
    t[op] = reduce;
  t["GlobalAveragePool"] = global_average_pool;
  t["GlobalMaxPool"] = global_max_pool;
}

}  // namespace hp::train::detail
