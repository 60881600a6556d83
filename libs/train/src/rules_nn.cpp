// Gradient rules of the neural-network ops: softmax and log-softmax, layer, batch and instance
// normalization, convolution and its transpose, pooling (hp.train kernels, docs/training.md), the
// depth/space rearrangements and TopK's values. The reductions are in rules_reduce.cpp.
#include <fmt/core.h>

#include "grad_ctx.h"

namespace hp::train::detail {

namespace {

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

/// ConvTranspose is Conv's input gradient, so its own gradients are Conv's other two products:
/// dX = Conv(dY, W) with the same strides, pads, dilations and groups (output_padding only adds
/// rows the Conv's floor drops), and dW the weight gradient of that Conv, i.e. ConvGrad with dY as
/// the input and X as the output gradient. W's layout (C_in x C_out/group x k) is that Conv's.
Status conv_transpose(GradCtx& c) {
  if (c.attr_s("auto_pad", "NOTSET") != "NOTSET" || c.has("output_shape"))
    return c.fail(
        "the gradient of a ConvTranspose needs explicit pads (no auto_pad or output_shape)");
  std::vector<Attr> attrs;
  for (const char* a : {"strides", "pads", "dilations", "kernel_shape"})
    if (c.has(a)) attrs.push_back({a, c.attr_ints(a)});
  attrs.push_back({"group", c.attr_i("group", 1)});
  const std::string& dy = c.dout(0);
  if (c.wants(0)) c.grad(0, c.op("Conv", {dy, c.in(1)}, attrs));
  if (c.wants(1))
    c.grad(1, c.op_opt("ConvGrad", {c.in(0), dy, c.in(1)}, {false, true, false}, attrs,
                       kTrainDomain)[1]);
  if (c.n_in() > 2 && c.wants(2)) {
    const int r = c.rank(c.out(0));
    if (r < 3) return c.fail("the bias gradient needs the output's rank, unknown here");
    std::vector<std::int64_t> axes = {0};
    for (int d = 2; d < r; ++d) axes.push_back(d);
    c.grad(2, reduce_over(c, "ReduceSum", dy, axes, false));
  }
  return {};
}

/// InstanceNormalization, y = scale_c (x - mean) / sqrt(var + eps) + B_c with the statistics over
/// each (n, c)'s spatial positions: batch normalization's training-mode gradient with the means
/// taken per instance, and scale's and B's gradients summed over the batch too.
Status instance_norm(GradCtx& c) {
  const std::string& dy = c.dout(0);
  const std::string& x = c.in(0);
  const int r = c.rank(x);
  if (r < 3) return c.fail("the gradient needs the input's rank (N x C x spatial), unknown here");
  std::vector<std::int64_t> spatial, channel = {0};
  for (int d = 2; d < r; ++d) spatial.push_back(d), channel.push_back(d);
  const std::string centred = c.op("Sub", {x, reduce_over(c, "ReduceMean", x, spatial, true)});
  const std::string var =
      reduce_over(c, "ReduceMean", c.op("Mul", {centred, centred}), spatial, true);
  const std::string inv = c.op(
      "Reciprocal", {c.op("Sqrt", {c.op("Add", {var, c.scalar(c.attr_f("epsilon", 1e-5), x)})})});
  const std::string xhat = c.op("Mul", {centred, inv});
  const std::string dy_xhat = c.op("Mul", {dy, xhat});
  if (c.wants(1)) c.grad(1, reduce_over(c, "ReduceSum", dy_xhat, channel, false));
  if (c.wants(2)) c.grad(2, reduce_over(c, "ReduceSum", dy, channel, false));
  if (c.wants(0)) {
    const std::string g =
        c.op("Sub", {c.op("Sub", {dy, reduce_over(c, "ReduceMean", dy, spatial, true)}),
                     c.op("Mul", {xhat, reduce_over(c, "ReduceMean", dy_xhat, spatial, true)})});
    const std::string scale = c.op("Unsqueeze", {c.in(1), c.i64s(channel)});
    c.grad(0, c.op("Mul", {g, c.op("Mul", {scale, inv})}));
  }
  return {};
}

/// DepthToSpace and SpaceToDepth permute elements, so each one's gradient is its inverse
/// permutation: SpaceToDepth undoes DepthToSpace in DCR mode and DepthToSpace (DCR) undoes
/// SpaceToDepth. CRD mode (PyTorch's PixelShuffle) has no inverse op, so its gradient is written
/// out: dY [N, C, H b, W b] -> [N, C, H, b, W, b] -> [N, C, b, b, H, W] -> X's shape.
Status depth_space(GradCtx& c) {
  const std::int64_t b = c.attr_i("blocksize", 1);
  const std::string& dy = c.dout(0);
  if (c.op_type() == "SpaceToDepth") {
    c.grad(0, c.op("DepthToSpace", {dy}, {{"blocksize", b}, {"mode", std::string("DCR")}}));
    return {};
  }
  if (c.attr_s("mode", "DCR") == "DCR") {
    c.grad(0, c.op("SpaceToDepth", {dy}, {{"blocksize", b}}));
    return {};
  }
  const std::string sx = c.shape_of(c.in(0));  // [N, C b^2, H, W]
  auto dim = [&](std::int64_t k) { return c.op("Slice", {sx, c.i64s({k}), c.i64s({k + 1})}); };
  const std::string split = c.op(
      "Concat",
      {dim(0), c.op("Div", {dim(1), c.i64s({b * b})}), dim(2), c.i64s({b}), dim(3), c.i64s({b})},
      {{"axis", std::int64_t{0}}});
  const std::string t = c.op("Transpose", {c.op("Reshape", {dy, split})},
                             {{"perm", std::vector<std::int64_t>{0, 1, 3, 5, 2, 4}}});
  c.grad(0, c.op("Reshape", {t, sx}));
  return {};
}

Status pool(GradCtx& c) {
  c.grad(0, c.hp(c.op_type() + "Grad", {c.dout(0), c.in(0)}, c.all_attrs()));
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
  t["Conv"] = conv;
  t["ConvTranspose"] = conv_transpose;
  t["InstanceNormalization"] = instance_norm;
  t["DepthToSpace"] = depth_space;
  t["SpaceToDepth"] = depth_space;
  t["MaxPool"] = pool;
  t["AveragePool"] = pool;
  t["TopK"] = topk;
}

}  // namespace hp::train::detail
