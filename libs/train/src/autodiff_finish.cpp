// Engine::finish (autodiff_engine.h): the gradient model's outputs (the loss, one gradient per
// trained tensor, the input gradients of a pipeline stage, the buffers' new values), then the
// removal of every node nothing reads.
#include <fmt/core.h>

#include <algorithm>

#include "autodiff_engine.h"
#include "graph_parts.h"
#include "rewrite.h"
#include "stage_grads.h"

namespace hp::train::detail {

namespace {

/// Removes the nodes whose outputs nothing reads: forward outputs the loss does not need, and
/// gradient nodes a later rule superseded (a Gemm folded into its transpose's). `keep` names
/// tensors kept although no output reads them (a stage's forward outputs, which its forward part
/// sends on). Returns how many of the first `forward_nodes` nodes remain.
int remove_dead(onnx::GraphProto& g, int forward_nodes, std::vector<std::string> keep) {
  for (const auto& o : g.output()) keep.push_back(o.name());
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  int kept_forward = 0;
  for (int k : detail::needed_nodes(g, keep, {})) {
    kept.Add()->Swap(g.mutable_node(k));
    kept_forward += k < forward_nodes;
  }
  g.mutable_node()->Swap(&kept);
  return kept_forward;
}

/// Readers of a tensor through Identity aliases (what "tied" counts).
int readers(const onnx::GraphProto& g, const std::string& t, int depth = 0) {
  int r = 0;
  for (const auto& n : g.node())
    for (const auto& i : n.input())
      if (i == t) {
        r += n.op_type() == "Identity" && depth < 16 ? readers(g, n.output(0), depth + 1) : 1;
        break;
      }
  return r;
}

}  // namespace

Status Engine::finish(GradGraph& out, const std::string& loss) {
  onnx::GraphProto& g = *w.graph;
  g.clear_output();
  if (!loss.empty()) {
    auto* lo = g.add_output();
    lo->set_name(loss);
    lo->mutable_type()->mutable_tensor_type()->set_elem_type(w.elem_type(spec.logits));
    lo->mutable_type()->mutable_tensor_type()->mutable_shape();
  }
  const auto stats = detail::batch_norm_buffers(g, forward_nodes, out.untrained);
  std::vector<std::string> kept;
  std::vector<std::pair<std::string, std::string>> finals;  ///< gradient tensor, output name
  std::set<std::string> taken;
  for (const auto& n : g.node())
    for (const auto& o : n.output()) taken.insert(o);
  for (const auto& t : g.initializer()) taken.insert(t.name());
  for (const auto& p : out.params) {
    std::string gsum = accumulated(p);
    if (gsum.empty()) {
      out.untrained.emplace(p, "no path to the loss (its gradient is zero)");
      continue;
    }
    std::string name = p + "_grad";
    while (taken.count(name)) name += "_";
    taken.insert(name);
    finals.emplace_back(gsum, name);
    auto* vo = g.add_output();
    vo->set_name(name);
    auto* tt = vo->mutable_type()->mutable_tensor_type();
    int idx = fg.find_tensor(p);
    tt->set_elem_type(fg.tensor(idx).elem_type);
    auto* sh = tt->mutable_shape();
    for (const auto& d : fg.tensor(idx).dims) sh->add_dim()->set_dim_value(d.value);
    kept.push_back(p);
    out.grads.push_back(name);
    // Readers in the model as exported: the rewritten forward reads a folded weight twice (its
    // Gemm and the Transpose the backward keeps), which is no tie.
    if (int r = readers(*exported, p); r > 1) {
      out.tied[p] = r;
      for (const auto& n : exported->node())
        if (n.op_type() == "Identity" && n.input_size() == 1 && n.input(0) == p) {
          out.aliased.push_back(p);
          break;
        }
    }
  }
  out.params = kept;
  for (const auto& in : spec.input_grads) {
    // An input without a path to the loss still sends its (zero) gradient back, so the previous
    // stage's backward runs as for any other.
    std::string gsum = accumulated(in);
    if (gsum.empty())
      gsum = w.emit("Expand", {w.scalar(0.0, w.elem_type(in)), w.shape_of(in)}, 1)[0];
    const std::string name = detail::stage_grad_name(in);
    finals.emplace_back(gsum, name);
    w.declare_like(*g.add_output(), w.elem_type(in), in);
    g.mutable_output(g.output_size() - 1)->set_name(name);
    out.input_grad_outputs.push_back(name);
  }
  if (spec.update_buffers)
    for (const auto& [stat, value] : stats) {
      w.declare_like(*g.add_output(), w.elem_type(stat), stat);
      g.mutable_output(g.output_size() - 1)->set_name(value);
      out.buffer_updates.emplace_back(stat, value);
    }
  // A gradient that an emitted node writes and nothing else reads becomes the output by renaming
  // that node's output; otherwise (a forward tensor, or one shared with another gradient) an
  // Identity copies it out.
  std::map<std::string, int> reads_of;
  for (const auto& n : g.node())
    for (const auto& i : n.input()) ++reads_of[i];
  std::map<std::string, std::string>
      moved;  ///< renamed gradient tensors (two params may share one)
  for (const auto& [gsum, name] : finals) {
    if (auto m = moved.find(gsum); m != moved.end()) {
      w.emit("Identity", {m->second}, 1, {}, "", {name});
      continue;
    }
    onnx::NodeProto* maker = nullptr;
    if (w.made.count(gsum) && reads_of[gsum] == 0)
      for (int k = forward_nodes; k < g.node_size() && !maker; ++k)
        for (int j = 0; j < g.node(k).output_size(); ++j)
          if (g.node(k).output(j) == gsum) {
            maker = g.mutable_node(k);
            maker->set_output(j, name);
            moved[gsum] = name;
            break;
          }
    if (!maker) w.emit("Identity", {gsum}, 1, {}, "", {name});
  }
  w.made.clear();  // the pointers do not survive the removal
  if (!spec.logits.empty())
    out.forward_outputs.push_back(loss_reads.empty() ? spec.logits : loss_reads);
  for (const auto& o : spec.output_grads)
    if (std::find(out.forward_outputs.begin(), out.forward_outputs.end(), o) ==
        out.forward_outputs.end())
      out.forward_outputs.push_back(o);
  out.forward_nodes =
      detail::hoist_shape_reads(g, remove_dead(g, forward_nodes, out.forward_outputs));
  return {};
}

}  // namespace hp::train::detail
