// Vocabulary-parallel cross entropy (loss_graph.h): under tensor parallelism, where hp shard
// splits the LM head by vocabulary, the logits are each member's block of the classes, all-gathered
// into the whole [N, C] before the loss. Gathering them and taking the softmax over all C classes
// on every member repeats the loss's work on each and moves N x C floats; Megatron's
// vocab-parallel loss needs three N-float all-reduces instead. With m, s each member's row maxima
// and sums of exp(x - m) over its block (hp.train.RowMaxSumExp, one pass):
//   M = AllReduce_max(m)                              the row maxima
//   S = AllReduce_sum(s * exp(m - M))                 the partition functions
//   T = AllReduce_sum(x[label] - M, on its owner)     the target's shifted logit
//   loss = mean over labels != -100 of (log S - T)
// and each member's gradient is its own block, softmax minus one-hot over the count
// (hp.train.VocabParallelCEGrad, one pass):
//   dx = (exp(x - M) / S - [c == label]) * valid / count.
// The all-gather's output then has no reader and leaves the training graph.
#include <fmt/core.h>

#include <algorithm>
#include <optional>

#include "hp/core/hp_domain.h"
#include "loss_graph.h"

namespace hp::train::detail {

namespace dom = hp::domain;

namespace {

/// The hp.AllGather along the last axis of the logits that writes `y` (directly or through an
/// Identity, as hp shard writes it), over exactly the tensor-parallel group; null otherwise.
const onnx::NodeProto* gather_of_logits(const GraphWriter& w, const GradSpec& spec,
                                        const std::string& y) {
  auto producer = [&](const std::string& t) -> const onnx::NodeProto* {
    for (const auto& n : w.graph->node())
      for (const auto& o : n.output())
        if (o == t) return &n;
    return nullptr;
  };
  const onnx::NodeProto* n = producer(y);
  if (n && n->op_type() == "Identity" && n->domain().empty() && n->input_size() == 1)
    n = producer(n->input(0));
  if (!n || n->domain() != dom::kDomain || n->op_type() != dom::kAllGather || n->input_size() != 1)
    return nullptr;
  std::int64_t axis = 0;
  std::vector<std::int64_t> group;
  for (const auto& a : n->attribute()) {
    if (a.name() == dom::kAttrAxis) axis = a.i();
    if (a.name() == dom::kAttrGroup) group.assign(a.ints().begin(), a.ints().end());
  }
  const int r = w.rank(n->input(0));
  if (r < 1 || (axis != -1 && axis != r - 1) || group != spec.tp.group) return nullptr;
  return n;
}

}  // namespace

std::optional<Expected<LossNodes>> emit_vocab_parallel_loss(GraphWriter& w, const GradSpec& spec) {
  if (spec.loss != LossKind::cross_entropy || spec.tp.group.size() < 2) return std::nullopt;
  const onnx::NodeProto* gather = gather_of_logits(w, spec, spec.logits);
  if (!gather) return std::nullopt;
  const std::string local = gather->input(0);
  const auto shape = w.static_shape(local);
  const auto member = std::find(spec.tp.group.begin(), spec.tp.group.end(), spec.tp.rank);
  if (!shape || shape->empty() || member == spec.tp.group.end()) return std::nullopt;
  const std::int32_t et = w.elem_type(local);
  if (et != onnx::TensorProto::FLOAT && et != onnx::TensorProto::DOUBLE) return std::nullopt;
  const std::int64_t block = shape->back();
  const std::int64_t first = block * (member - spec.tp.group.begin());
  // The labels, declared as the ordinary loss declares them (the logits' dims without the last).
  onnx::ValueInfoProto* in = w.graph->add_input();
  in->set_name(spec.labels);
  w.declare_like(*in, onnx::TensorProto::INT64, spec.logits, true);
  w.types[spec.labels] = onnx::TensorProto::INT64;

  auto op = [&](const std::string& type, const std::vector<std::string>& ins,
                const std::vector<Attr>& attrs = {},
                const std::string& domain = "") { return w.emit(type, ins, 1, attrs, domain)[0]; };
  auto all_reduce = [&](const std::string& x, const char* how) {
    return op(std::string(dom::kAllReduce), {x},
              {{std::string(dom::kAttrOp), std::string(how)},
               {std::string(dom::kAttrGroup), spec.tp.group}},
              std::string(dom::kDomain));
  };
  auto reduce = [&](const char* type, const std::string& x, bool keep, bool all) {
    std::vector<Attr> attrs = {{"keepdims", static_cast<std::int64_t>(keep)}};
    return all ? op(type, {x}, attrs) : op(type, {x, w.i64s({1})}, attrs);
  };
  const std::string x = op("Reshape", {local, w.i64s({-1, block})});  // [N, block]
  const std::string labels = op("Reshape", {spec.labels, w.i64s({-1})});
  // Each member's row maxima and sums of exponentials in one pass; the whole row's from them.
  auto ms = w.emit("RowMaxSumExp", {x}, 2, {}, kTrainDomain);
  const std::string m = all_reduce(ms[0], "max");
  const std::string s =
      all_reduce(op("Mul", {ms[1], op("Exp", {op("Sub", {ms[0], m})})}), "sum");  // [N, 1]
  // This member's classes are [first, first + block): the label's column here, if it owns it
  // (an ignored -100 falls below every block), else -1.
  const std::string col = op("Sub", {labels, w.i64s({first})});
  const std::string owns =
      op("And", {op("GreaterOrEqual", {col, w.i64s({0})}), op("Less", {col, w.i64s({block})})});
  const std::string col2 =
      op("Unsqueeze", {op("Where", {owns, col, w.i64s({-1})}), w.i64s({1})});  // [N, 1]
  const std::string owns2 = op("Unsqueeze", {owns, w.i64s({1})});
  const std::string picked =
      op("GatherElements", {x, op("Max", {col2, w.i64s({0})})}, {{"axis", std::int64_t{1}}});
  const std::string t = all_reduce(op("Where", {owns2, op("Sub", {picked, m}), w.scalar(0.0, et)}),
                                   "sum");  // x[label] - M
  const std::string valid = op(
      "Cast", {op("Unsqueeze", {op("Not", {op("Equal", {labels, w.i64s({-100})})}), w.i64s({1})})},
      {{"to", static_cast<std::int64_t>(et)}});  // [N, 1]
  const std::string count = reduce("ReduceSum", valid, false, true);
  LossNodes out;
  const std::string total =
      reduce("ReduceSum", op("Mul", {op("Sub", {op("Log", {s}), t}), valid}), false, true);
  out.loss = w.emit("Div", {total, count}, 1, {}, "", {w.fresh("loss")})[0];
  // Softmax minus the one-hot of the owned label, for the kept rows, over the count.
  const std::string d2 =
      op("VocabParallelCEGrad", {x, m, s, col2, op("Div", {valid, count})}, {}, kTrainDomain);
  out.dlogits = op("Reshape", {d2, w.shape_of(local)});
  out.dlogits_of = local;
  return Expected<LossNodes>(std::move(out));
}

}  // namespace hp::train::detail
