// Loss nodes. cross_entropy reshapes the logits to [N, C] and the labels to [N] and uses ONNX's
// SoftmaxCrossEntropyLoss (mean over labels != -100, PyTorch's F.cross_entropy); its gradient is
// the fused hp.train.SoftmaxCrossEntropyGrad over the log-probabilities the loss node already
// computed. mse is ReduceMean((y - t)^2) with gradient 2 (y - t) / numel.
#include <fmt/core.h>

#include <limits>

#include "loss_graph.h"

namespace hp::train::detail {

namespace {

/// Declares graph input `name` of `elem_type` with the logits' dims (all of them, or without the
/// last).
void declare_input(GraphWriter& w, const std::string& name, std::int32_t elem_type,
                   const std::string& like, bool drop_last) {
  onnx::ValueInfoProto* v = w.graph->add_input();
  v->set_name(name);
  w.declare_like(*v, elem_type, like, drop_last);
  w.types[name] = elem_type;
}

}  // namespace

Expected<LossNodes> emit_loss(GraphWriter& w, const GradSpec& spec) {
  const std::string& y = spec.logits;
  const std::int32_t et = w.elem_type(y);
  if (et != onnx::TensorProto::FLOAT && et != onnx::TensorProto::DOUBLE)
    return Error(Errc::bad_input,
                 fmt::format("the loss reads '{}', which is not a float32/float64 tensor", y));
  if (auto vocab = emit_vocab_parallel_loss(w, spec)) return std::move(*vocab);
  LossNodes out;
  out.dlogits_of = y;
  if (spec.loss == LossKind::mse) {
    declare_input(w, spec.labels, et, y, false);
    std::string d = w.emit("Sub", {y, spec.labels}, 1)[0];
    std::string sq = w.emit("Mul", {d, d}, 1)[0];
    out.loss =
        w.emit("ReduceMean", {sq}, 1, {{"keepdims", std::int64_t{0}}}, "", {w.fresh("loss")})[0];
    std::string n =
        w.emit("Cast", {w.emit("Size", {y}, 1)[0]}, 1, {{"to", static_cast<std::int64_t>(et)}})[0];
    std::string coef = w.emit("Div", {w.scalar(2.0, et), n}, 1)[0];
    out.dlogits = w.emit("Mul", {d, coef}, 1)[0];
    return out;
  }
  const int r = w.rank(y);
  if (r < 1)
    return Error(Errc::bad_input,
                 fmt::format("cross_entropy needs the rank of '{}' (logits with the class axis "
                             "last); shape inference could not tell it",
                             y));
  declare_input(w, spec.labels, onnx::TensorProto::INT64, y, true);
  std::string logits2 = y, labels1 = spec.labels;
  if (r != 2) {
    std::string shape2;
    auto s = w.static_shape(y);
    if (s && !s->empty()) {
      shape2 = w.i64s({-1, s->back()});
    } else {
      std::string c = w.emit(
          "Slice",
          {w.shape_of(y), w.i64s({-1}), w.i64s({std::numeric_limits<std::int64_t>::max()})}, 1)[0];
      shape2 = w.emit("Concat", {w.i64s({-1}), c}, 1, {{"axis", std::int64_t{0}}})[0];
    }
    logits2 = w.emit("Reshape", {y, shape2}, 1)[0];
    labels1 = w.emit("Reshape", {spec.labels, w.i64s({-1})}, 1)[0];
  }
  auto outs = w.emit("SoftmaxCrossEntropyLoss", {logits2, labels1}, 2,
                     {{"reduction", std::string("mean")}, {"ignore_index", std::int64_t{-100}}}, "",
                     {w.fresh("loss"), w.fresh("log_prob")});
  out.loss = outs[0];
  std::string d2 = w.emit(
      "SoftmaxCrossEntropyGrad", {w.scalar(1.0, et), outs[1], labels1}, 1,
      {{"ignore_index", std::int64_t{-100}}, {"reduction", std::string("mean")}}, kTrainDomain)[0];
  out.dlogits = r == 2 ? d2 : w.emit("Reshape", {d2, w.shape_of(y)}, 1)[0];
  return out;
}

}  // namespace hp::train::detail
