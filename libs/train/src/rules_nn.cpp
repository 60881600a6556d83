// Gradient rules of the neural-network ops: softmax and log-softmax, layer and batch normalization,
// the mean and sum reductions, convolution and pooling (hp.train kernels, docs/training.md) and
// TopK's values.
#include <fmt/core.h>

#include "grad_ctx.h"

namespace hp::train::detail {

namespace {

/// Input elements per output element of a reduction or pooling `x -> y`, in x's float type.
std::string fan_in(GradCtx& c, const std::string& x, const std::string& y) {
  std::string count = c.op("Div", {c.op("Size", {x}), c.op("Size", {y})});
  return c.op("Cast", {count}, {{"to", static_cast<std::int64_t>(c.elem_type(x))}});
}

Status softmax(GradCtx& c) {
  c.grad(0, c.hp(c.op_type() == "Softmax" ? "SoftmaxGrad" : "LogSoftmaxGrad", {c.dout(0), c.out(0)},
                 {{"axis", c.attr_i("axis", -1)}}));
  return {};
}

Status layer_norm(GradCtx& c) {
  std::vector<bool> want = {c.wants(0), c.wants(1), c.n_in() > 2 && c.wants(2)};
  auto g = c.op_opt("LayerNormGrad", {c.dout(0), c.in(0), c.in(1)}, want,
                    {{"axis", c.attr_i("axis", -1)}, {"epsilon", c.attr_f("epsilon", 1e-5)}},
                    kTrainDomain);
  for (int i = 0; i < 3; ++i) c.grad(i, g[static_cast<std::size_t>(i)]);
  return {};
}

/// ReduceSum / ReduceMean: dY brought back to the reduced axes and broadcast over them.
Status reduce(GradCtx& c) {
  const bool axes_input = c.op_type() == "ReduceSum" || c.opset() >= 18;
  std::optional<std::vector<std::int64_t>> axes;
  if (axes_input) {
    if (!c.in(1).empty()) {
      axes = c.const_ints(c.in(1));
      if (!axes) return c.fail("the reduction axes must be constant for the gradient");
    }
  } else if (c.has("axes")) {
    axes = c.attr_ints("axes");
  }
  if (axes && axes->empty()) axes.reset();
  if (!axes && c.attr_i("noop_with_empty_axes", 0)) {
    c.grad(0, c.dout(0));
    return {};
  }
  std::string g = c.dout(0);
  if (axes && c.attr_i("keepdims", 1) == 0) {
    const int r = c.rank(c.in(0));
    if (r < 0) return c.fail("the reduction's gradient needs its input's rank, unknown here");
    std::vector<std::int64_t> norm;
    for (auto a : *axes) norm.push_back(a < 0 ? a + r : a);
    std::sort(norm.begin(), norm.end());
    g = c.op("Unsqueeze", {g, c.i64s(norm)});
  }
  g = c.op("Expand", {g, c.shape_of(c.in(0))});
  if (c.op_type() == "ReduceMean") {
    g = c.op("Div", {g, fan_in(c, c.in(0), c.out(0))});
  }
  c.grad(0, g);
  return {};
}

/// ReduceSum or ReduceMean of `x` over `axes`, in the form the model's opset takes: the axes are an
/// input of ReduceSum from opset 13 and of ReduceMean from opset 18, an attribute before.
std::string reduce_over(GradCtx& c, const std::string& type, const std::string& x,
                        const std::vector<std::int64_t>& axes, bool keepdims) {
  const bool as_input = type == "ReduceSum" ? c.opset() >= 13 : c.opset() >= 18;
  std::vector<Attr> attrs = {{"keepdims", static_cast<std::int64_t>(keepdims)}};
  if (as_input) return c.op(type, {x, c.i64s(axes)}, attrs);
  attrs.push_back({"axes", axes});
  return c.op(type, {x}, attrs);
}

/// BatchNormalization, y = (x - mean) * inv * scale + B per channel (dim 1), inv = 1/sqrt(var+eps).
/// In training mode mean and var are the batch's own (biased) statistics, so they depend on x too:
///   dx = scale * inv * (dy - mean(dy) - xhat * mean(dy * xhat)),   xhat = (x - mean) * inv
/// (the means over every axis but the channel); in inference mode they are the given running
/// statistics: dx = scale * inv * dy. dscale = sum(dy * xhat), dB = sum(dy) either way. The running
/// statistics (inputs 3 and 4) are buffers, as in PyTorch: no gradient; the training-mode outputs
/// that update them carry none either (autodiff.cpp writes them back after each step).
Status batch_norm(GradCtx& c) {
  const std::string& dy = c.dout(0);
  if (dy.empty()) return {};
  const std::string& x = c.in(0);
  const int r = c.rank(x);
  if (r < 2) return c.fail("the gradient needs the input's rank (N x C x ...), unknown here");
  std::vector<std::int64_t> axes = {0};  // every axis but the channel's
  for (int d = 2; d < r; ++d) axes.push_back(d);
  const bool training = c.attr_i("training_mode", 0) != 0;
  const std::string eps = c.scalar(c.attr_f("epsilon", 1e-5), x);
  auto per_channel = [&](const std::string& v) { return c.op("Unsqueeze", {v, c.i64s(axes)}); };
  std::string centred, var;
  if (training) {
    centred = c.op("Sub", {x, reduce_over(c, "ReduceMean", x, axes, true)});
    var = reduce_over(c, "ReduceMean", c.op("Mul", {centred, centred}), axes, true);
  } else {
    centred = c.op("Sub", {x, per_channel(c.in(3))});
    var = per_channel(c.in(4));
  }
  const std::string inv = c.op("Reciprocal", {c.op("Sqrt", {c.op("Add", {var, eps})})});
  const std::string xhat = c.op("Mul", {centred, inv});
  const std::string dy_xhat = c.op("Mul", {dy, xhat});
  if (c.wants(1)) c.grad(1, reduce_over(c, "ReduceSum", dy_xhat, axes, false));
  if (c.wants(2)) c.grad(2, reduce_over(c, "ReduceSum", dy, axes, false));
  if (c.wants(0)) {
    std::string g = dy;
    if (training)
      g = c.op("Sub", {c.op("Sub", {dy, reduce_over(c, "ReduceMean", dy, axes, true)}),
                       c.op("Mul", {xhat, reduce_over(c, "ReduceMean", dy_xhat, axes, true)})});
    c.grad(0, c.op("Mul", {g, c.op("Mul", {per_channel(c.in(1)), inv})}));
  }
  return {};
}

Status conv(GradCtx& c) {
  std::vector<bool> want = {c.wants(0), c.wants(1), c.n_in() > 2 && c.wants(2)};
  auto g = c.op_opt("ConvGrad", {c.dout(0), c.in(0), c.in(1)}, want, c.all_attrs(), kTrainDomain);
  for (int i = 0; i < 3; ++i) c.grad(i, g[static_cast<std::size_t>(i)]);
  return {};
}

Status pool(GradCtx& c) {
  c.grad(0, c.hp(c.op_type() + "Grad", {c.dout(0), c.in(0)}, c.all_attrs()));
  return {};
}

Status global_average_pool(GradCtx& c) {
  std::string g = c.op("Div", {c.dout(0), fan_in(c, c.in(0), c.out(0))});
  c.grad(0, c.op("Expand", {g, c.shape_of(c.in(0))}));
  return {};
}

Status topk(GradCtx& c) {
  c.grad(0, c.hp("GatherElementsGrad", {c.dout(0), c.shape_of(c.in(0)), c.out(1)},
                 {{"axis", c.attr_i("axis", -1)}}));
  return {};
}

}  // namespace

void register_nn_rules(RuleTable& t) {
  t["Softmax"] = softmax;
  t["LogSoftmax"] = softmax;
  t["LayerNormalization"] = layer_norm;
  t["BatchNormalization"] = batch_norm;
  t["ReduceSum"] = reduce;
  t["ReduceMean"] = reduce;
  t["Conv"] = conv;
  t["MaxPool"] = pool;
  t["AveragePool"] = pool;
  t["GlobalAveragePool"] = global_average_pool;
  t["TopK"] = topk;
}

}  // namespace hp::train::detail
