// split_backward (stages.h): a gradient model cut into the parts a pipeline schedule runs apart.
//
// The gradient model is the forward nodes followed by the loss and the backward
// (GradGraph::forward_nodes marks the boundary), so the forward part is its first nodes. What the
// backward reads of them is the stash, which the schedule keeps from a micro-batch's forward to its
// backward. Two kinds of reads are not stashed: a Shape or Size of a forward tensor (moved into the
// forward part, so the stash holds the shape and not the activation) and a Constant node's output
// (copied into each part that reads it).
//
// The zero-bubble cut divides the backward by what the previous stage waits for: B holds every
// backward node the loss and the input gradients need, W the rest, which only feed parameter
// gradients. A node both need is in B (it runs first); W reads its outputs (`carried`). A
// parameter gradient written by a node of B (LayerNormalization's, beside its input gradient)
// leaves from B.
#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <set>

#include "graph_parts.h"
#include "hp/train/stages.h"

namespace hp::train {

namespace {

enum Where : char { kForward, kB, kW };

struct Cutter {
  const onnx::GraphProto& g;
  std::vector<char> where;                ///< per node
  std::map<std::string, int> producer;    ///< tensor -> node
  std::vector<std::string> joint_inputs;  ///< graph inputs (not initializers), in order
  std::set<std::string> stash, carried;

  explicit Cutter(const onnx::GraphProto& graph) : g(graph) {}

  bool is_constant_node(int k) const {
    const auto& n = g.node(k);
    return n.op_type() == "Constant" && (n.domain().empty() || n.domain() == "ai.onnx") &&
           n.input_size() == 0;
  }

  /// Inputs and nodes of one backward part: Constant nodes copied in, inputs in the order graph
  /// inputs, stash, carried (each in node order).
  detail::PartSpec part(Where w) {
    detail::PartSpec p;
    for (int k = 0; k < g.node_size(); ++k)
      if (where[static_cast<std::size_t>(k)] == w) p.nodes.push_back(k);
    std::set<std::string> graph_in, stashed, from_b;
    std::set<int> copied;
    for (const auto& r : detail::outside_reads(g, p.nodes)) {
      auto it = producer.find(r);
      if (it == producer.end()) {
        if (std::find(joint_inputs.begin(), joint_inputs.end(), r) != joint_inputs.end())
          graph_in.insert(r);
        continue;  // an initializer: the part keeps it
      }
      const int k = it->second;
      if (is_constant_node(k))
        copied.insert(k);
      else if (where[static_cast<std::size_t>(k)] == kForward)
        stashed.insert(r);
      else
        from_b.insert(r);
    }
    stash.insert(stashed.begin(), stashed.end());
    carried.insert(from_b.begin(), from_b.end());
    p.nodes.insert(p.nodes.end(), copied.begin(), copied.end());
    std::sort(p.nodes.begin(), p.nodes.end());
    for (const auto& i : joint_inputs)
      if (graph_in.count(i)) p.inputs.push_back(i);
    for (const auto* s : {&stashed, &from_b})
      for (const auto& t : in_node_order(*s)) p.inputs.push_back(t);
    return p;
  }

  std::vector<std::string> in_node_order(const std::set<std::string>& s) const {
    std::vector<std::string> v(s.begin(), s.end());
    std::stable_sort(v.begin(), v.end(), [&](const std::string& a, const std::string& b) {
      return producer.at(a) < producer.at(b);
    });
    return v;
  }
};

bool is_shape_op(const onnx::NodeProto& n) {
  return (n.op_type() == "Shape" || n.op_type() == "Size") &&
         (n.domain().empty() || n.domain() == "ai.onnx") && n.input_size() == 1;
}

GradPart finish_part(const GradGraph& gg, const detail::PartSpec& p, const detail::TensorInfo& info,
                     const std::string& name) {
  GradPart out;
  out.model = detail::part_model(gg.model, p, info, name);
  out.inputs = p.inputs;
  out.outputs = p.outputs;
  std::set<std::string> inits;
  for (const auto& t : out.model.proto->graph().initializer()) inits.insert(t.name());
  for (const auto& w : gg.params)
    if (inits.count(w)) out.params.push_back(w);
  for (const auto& gname : gg.grads)
    if (std::find(p.outputs.begin(), p.outputs.end(), gname) != p.outputs.end())
      out.grads.push_back(gname);
  return out;
}

}  // namespace

Expected<GradParts> split_backward(const GradGraph& gg, BackwardSplit how) {
  Cutter c(gg.model.proto->graph());
  const onnx::GraphProto& g = c.g;
  const int n = g.node_size(), f = gg.forward_nodes;
  if (f < 0 || f > n)
    return Error(
        Errc::bad_input,
        fmt::format("[train] the gradient model has {} nodes, its forward_nodes is {}", n, f),
        gg.model.path.string());
  std::set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  for (const auto& v : g.input())
    if (!inits.count(v.name())) c.joint_inputs.push_back(v.name());
  for (int k = 0; k < n; ++k)
    for (const auto& o : g.node(k).output())
      if (!o.empty()) c.producer[o] = k;
  // The inputs the forward part can read: the data inputs, not the labels or incoming gradients.
  std::set<std::string> backward_inputs(gg.output_grad_inputs.begin(), gg.output_grad_inputs.end());
  if (!gg.labels.empty()) backward_inputs.insert(gg.labels);
  auto forward_readable = [&](const std::string& t) {
    auto it = c.producer.find(t);
    if (it != c.producer.end()) return it->second < f;
    return !backward_inputs.count(t);
  };
  c.where.assign(static_cast<std::size_t>(n), kB);
  for (int k = 0; k < n; ++k)
    if (k < f || (is_shape_op(g.node(k)) && forward_readable(g.node(k).input(0))))
      c.where[static_cast<std::size_t>(k)] = kForward;
  std::vector<std::string> joint_outputs;
  for (const auto& o : g.output()) joint_outputs.push_back(o.name());
  for (const auto& o : joint_outputs) {
    auto it = c.producer.find(o);
    if (it == c.producer.end() || c.where[static_cast<std::size_t>(it->second)] == kForward)
      return Error(Errc::internal,
                   fmt::format("[train] output '{}' of the gradient model is not written by its "
                               "backward nodes",
                               o),
                   gg.model.path.string());
  }
  if (how == BackwardSplit::input_weight) {
    // B: what the loss and the input gradients need; every other backward node goes to W.
    std::vector<std::string> targets = gg.input_grad_outputs;
    if (!gg.loss.empty()) targets.push_back(gg.loss);
    std::set<std::string> live(targets.begin(), targets.end());
    for (int k = n - 1; k >= f; --k) {
      if (c.where[static_cast<std::size_t>(k)] == kForward) continue;
      bool used = false;
      for (const auto& o : g.node(k).output()) used = used || (!o.empty() && live.count(o));
      if (used)
        detail::collect_reads(g.node(k), live);
      else
        c.where[static_cast<std::size_t>(k)] = kW;
    }
  }
  detail::PartSpec b = c.part(kB), w = c.part(kW);  // W after B: its reads of B are `carried`
  // Outputs of the backward parts.
  auto written_by = [&](const std::string& t, Where part) {
    return c.where[static_cast<std::size_t>(c.producer.at(t))] == part;
  };
  if (how == BackwardSplit::whole) {
    b.outputs = joint_outputs;
  } else {
    if (!gg.loss.empty()) b.outputs.push_back(gg.loss);
    for (const auto& o : gg.input_grad_outputs) b.outputs.push_back(o);
    for (const auto& gname : gg.grads)
      if (written_by(gname, kB)) b.outputs.push_back(gname);
    for (const auto& gname : gg.grads)
      if (written_by(gname, kW)) w.outputs.push_back(gname);
  }
  GradParts out;
  out.stash = c.in_node_order(c.stash);
  out.carried = c.in_node_order(c.carried);
  if (how == BackwardSplit::input_weight)
    for (const auto& t : out.carried) b.outputs.push_back(t);
  detail::PartSpec fw;
  for (int k = 0; k < n; ++k)
    if (c.where[static_cast<std::size_t>(k)] == kForward) fw.nodes.push_back(k);
  const auto fr = detail::outside_reads(g, fw.nodes);
  for (const auto& i : c.joint_inputs)
    if (std::find(fr.begin(), fr.end(), i) != fr.end()) fw.inputs.push_back(i);
  fw.outputs = gg.forward_outputs;
  for (const auto& t : out.stash)
    if (std::find(fw.outputs.begin(), fw.outputs.end(), t) == fw.outputs.end())
      fw.outputs.push_back(t);
  // Types and shapes: inference runs on the forward part alone (ONNX's inference does not know
  // the hp.train ops, and the stash is forward tensors); the backward's tensors are typed by
  // propagation.
  const detail::TensorInfo names_only;
  auto fg = model::build_graph(detail::part_model(gg.model, fw, names_only, "forward"), gg.dims);
  const detail::TensorInfo info(gg.model, fg ? &*fg : nullptr);
  const std::string name = g.name().empty() ? "grad" : g.name();
  out.forward = finish_part(gg, fw, info, name + "/forward");
  out.backward =
      finish_part(gg, b, info, name + (how == BackwardSplit::whole ? "/backward" : "/B"));
  // With the whole split W is an empty model, so every part can be inspected alike.
  out.weight = finish_part(gg, how == BackwardSplit::input_weight ? w : detail::PartSpec{}, info,
                           name + "/W");
  return out;
}

}  // namespace hp::train
