// build_grad_graph (autodiff.h): the forward model plus loss and backward nodes, as one ONNX model.
//
// Which nodes get a backward: a tensor "requires grad" when it is a trainable initializer or a
// floating-point output of a node reading one (forward pass over the node list); it "reaches the
// loss" when the logits depend on it (backward pass). Nodes with an output in both sets are
// differentiated, in reverse order, each by its op's rule (rules_*.cpp; If and Loop by
// control_grad.cpp, as their subgraphs read outer tensors); the gradient arriving at a
// tensor read by several nodes is the Sum of their contributions. Integer tensors carry no
// gradient, which cuts Shape arithmetic, masks and indices without rules.
//
// A pipeline stage (stage_grads.h) differs only at the ends: the gradients arriving at its
// output_grads outputs are graph inputs that seed the backward beside (or instead of) the loss's,
// and its input_grads inputs require grad like parameters, their sums leaving as graph outputs.
//
// Recomputation: the first time the backward reaches a node of a recomputed block, the block's
// forward nodes are cloned there with renamed outputs, and the block's rules read the clones. The
// forward's own activations of the block then die at their last forward reader (the executor frees
// a tensor after its last reader in node order, and keeps an already sorted graph's order).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "autodiff_engine.h"
#include "graph_parts.h"
#include "hp/model/layers.h"
#include "loss_graph.h"
#include "rewrite.h"
#include "stage_grads.h"

namespace hp::train {

namespace {

using detail::GraphWriter;

bool glob_match(const char* p, const char* s) {
  if (!*p) return !*s;
  if (*p == '*') return glob_match(p + 1, s) || (*s && glob_match(p, s + 1));
  return *s && (*p == '?' || *p == *s) && glob_match(p + 1, s + 1);
}

using detail::collect_reads;
using detail::is_float_type;

}  // namespace

namespace detail {

Status Engine::check_loss_names() const {
  const auto& pg = model.proto->graph();
  bool found = false;
  for (const auto& o : pg.output()) found = found || o.name() == spec.logits;
  if (!found) {
    std::string names;
    for (const auto& o : pg.output()) names += (names.empty() ? "" : ", ") + o.name();
    return Error(Errc::bad_input,
                 fmt::format("[train] logits '{}' names no graph output (the outputs: {})",
                             spec.logits, names),
                 model.path.string());
  }
  if (fg.find_tensor(spec.labels) >= 0)
    return Error(
        Errc::bad_input,
        fmt::format("[train] labels '{}' is already a tensor of the model; name the labels "
                    "input differently",
                    spec.labels),
        model.path.string());
  return {};
}

Status Engine::check_and_mark(GradGraph& out) {
  const auto& pg = model.proto->graph();
  if (!spec.logits.empty()) HP_TRY(check_loss_names());
  HP_TRY(detail::check_stage_spec(w, spec, model.path.string()));
  for (const auto& t : pg.initializer()) {
    const std::string& name = t.name();
    if (!is_float_type(t.data_type())) continue;
    bool frozen = false;
    for (const auto& g : spec.frozen) frozen = frozen || glob_match(g.c_str(), name.c_str());
    if (frozen) {
      out.untrained[name] = "frozen by [train].frozen";
      continue;
    }
    if (requires_grad.insert(name).second) out.params.push_back(name);
  }
  // The inputs whose gradient the previous stage wants carry one like a parameter.
  requires_grad.insert(spec.input_grads.begin(), spec.input_grads.end());
  reads.resize(static_cast<std::size_t>(pg.node_size()));
  for (int k = 0; k < pg.node_size(); ++k) {
    const auto& n = pg.node(k);
    collect_reads(n, reads[static_cast<std::size_t>(k)]);
    if (detail::cuts_gradient(n.op_type())) continue;
    bool any = false;
    for (const auto& i : reads[static_cast<std::size_t>(k)]) any = any || requires_grad.count(i);
    if (!any) continue;
    for (const auto& o : n.output()) {
      // A sequence may hold float tensors: it carries their gradient, and an op of it without a
      // rule is then an error rather than a weight silently left untrained.
      const int t = o.empty() ? -1 : fg.find_tensor(o);
      if (!o.empty() && (is_float_type(w.elem_type(o)) || (t >= 0 && fg.tensor(t).sequence)))
        requires_grad.insert(o);
    }
  }
  if (!spec.logits.empty()) reaches_loss.insert(spec.logits);
  reaches_loss.insert(spec.output_grads.begin(), spec.output_grads.end());
  for (int k = pg.node_size() - 1; k >= 0; --k) {
    const auto& n = pg.node(k);
    bool any = false;
    for (const auto& o : n.output()) any = any || reaches_loss.count(o);
    if (any)
      for (const auto& i : reads[static_cast<std::size_t>(k)]) reaches_loss.insert(i);
  }
  return {};
}

Status Engine::recompute_setup() {
  if (spec.recompute_blocks.empty()) return {};
  model::Layering layers = model::discover_layers(fg);
  if (layers.blocks.empty() && spec.recompute_blocks == std::vector<std::int64_t>{0}) {
    // The planner and hp shard see a model without repeated blocks as one block 0: recomputing
    // all of it would keep as much alive as not recomputing, so nothing is cloned.
    notes.push_back("the model has no repeated blocks: recompute of block 0 changes nothing");
    return {};
  }
  for (std::int64_t b : spec.recompute_blocks) {
    if (b < 0 || b >= static_cast<std::int64_t>(layers.blocks.size()))
      return Error(
          Errc::bad_input,
          fmt::format("recompute names block {}, the model has {} blocks", b, layers.blocks.size()),
          model.path.string());
    for (int n : layers.blocks[static_cast<std::size_t>(b)].nodes) {
      block_of[n] = static_cast<int>(b);
      block_nodes[static_cast<int>(b)].push_back(n);
    }
  }
  return {};
}

void Engine::emit_clones(int block) {
  const auto& pg = *w.graph;
  for (int k : block_nodes[block]) {
    const auto& n = pg.node(k);
    if (n.op_type() == "Dropout" && n.output_size() >= 2 && !n.output(1).empty()) {
      replay_dropout(n);
      continue;
    }
    onnx::NodeProto* c = w.graph->add_node();
    *c = n;
    c->set_name(w.fresh("recompute"));
    for (int i = 0; i < c->input_size(); ++i) c->set_input(i, renamed(n.input(i)));
    for (int j = 0; j < c->output_size(); ++j) {
      if (n.output(j).empty()) continue;
      std::string r = n.output(j) + "/recompute";
      rename[n.output(j)] = r;
      w.origin[r] = n.output(j);
      c->set_output(j, r);
    }
    ++clones;
  }
}

/// A recomputed training-mode Dropout must drop what the forward dropped: its clone applies the
/// forward's mask (kept alive, one byte per element) instead of drawing a new one.
void Engine::replay_dropout(const onnx::NodeProto& n) {
  const std::string x = renamed(n.input(0));
  const std::int32_t et = w.elem_type(n.input(0));
  std::string one = w.scalar(1.0, et);
  std::string ratio =
      n.input_size() > 1 && !n.input(1).empty() ? renamed(n.input(1)) : w.scalar(0.5, et);
  if (w.elem_type(ratio) != et)
    ratio = w.emit("Cast", {ratio}, 1, {{"to", static_cast<std::int64_t>(et)}})[0];
  std::string scale = w.emit("Div", {one, w.emit("Sub", {one, ratio}, 1)[0]}, 1)[0];
  if (n.input_size() > 2 && !n.input(2).empty())
    scale = w.emit("Where", {renamed(n.input(2)), scale, one}, 1)[0];
  std::string y = n.output(0) + "/recompute";
  w.emit("Where", {n.output(1), w.emit("Mul", {x, scale}, 1)[0], w.scalar(0.0, et)}, 1, {}, "",
         {y});
  rename[n.output(0)] = y;
  w.origin[y] = n.output(0);
  ++clones;
}

Status Engine::backward(std::vector<Diagnostic>& errors) {
  // The copy's forward nodes (indices below forward_nodes): Dropout may have gained its mask.
  const auto& pg = *w.graph;
  const auto& table = detail::rules();
  for (int k = forward_nodes - 1; k >= 0; --k) {
    // A layer-norm chain is differentiated at its last node as the one op it computes.
    auto ln = norm_tail.find(k);
    const auto& n = ln != norm_tail.end() ? ln->second : pg.node(k);
    bool active = false;
    for (const auto& o : n.output())
      active = active || (requires_grad.count(o) && reaches_loss.count(o));
    if (!active) continue;
    std::vector<std::string> douts;
    bool any = false;
    for (const auto& o : n.output()) {
      douts.push_back(o.empty() ? "" : accumulated(o));
      any = any || !douts.back().empty();
    }
    if (!any) continue;
    if (auto gl = gelu_tail.find(k); gl != gelu_tail.end()) {
      auto b = block_of.find(k);
      if (b != block_of.end() && recomputed.insert(b->second).second) emit_clones(b->second);
      contrib[gl->second].push_back(
          w.emit("GeluGrad", {douts[0], renamed(gl->second)}, 1, {}, detail::kTrainDomain)[0]);
      continue;
    }
    const std::string key = n.domain().empty() || n.domain() == "ai.onnx"
                                ? n.op_type()
                                : n.domain() + "." + n.op_type();
    if (key == "If" || key == "Loop") {  // their subgraphs read outer tensors: control_grad.h
      auto b = block_of.find(k);
      if (b != block_of.end() && recomputed.insert(b->second).second) emit_clones(b->second);
      auto r = detail::control_flow_grad(w, k, douts, control);
      if (!r)
        for (auto& d : r.error().all()) errors.push_back(std::move(d));
      else
        for (auto& [t, g] : *r) contrib[t].push_back(g);
      continue;
    }
    auto rule = table.find(key);
    const std::string where =
        fmt::format("node '{}' ({})", n.name().empty() ? n.output(0) : n.name(), key);
    if (rule == table.end()) {
      errors.push_back({where, "no gradient rule for this op, and it lies on a trainable path",
                        "freeze the initializers it depends on with [train].frozen, or export "
                        "the model without it"});
      continue;
    }
    auto b = block_of.find(k);
    if (b != block_of.end() && recomputed.insert(b->second).second) emit_clones(b->second);
    std::vector<std::string> ins, outs;
    std::vector<bool> wants;
    for (const auto& i : n.input()) {
      ins.push_back(i.empty() ? i : renamed(i));
      wants.push_back(!i.empty() && requires_grad.count(i) > 0);
    }
    for (const auto& o : n.output()) outs.push_back(o.empty() ? o : renamed(o));
    detail::GradCtx ctx(w, n, ins, outs, douts, wants);
    if (Status st = rule->second(ctx); !st) {
      errors.push_back(st.error().what);
      continue;
    }
    for (int i = 0; i < n.input_size(); ++i)
      if (!ctx.grads()[static_cast<std::size_t>(i)].empty())
        contrib[n.input(i)].push_back(ctx.grads()[static_cast<std::size_t>(i)]);
  }
  return {};
}

}  // namespace detail

Expected<GradGraph> build_grad_graph(const model::Model& model, const GradSpec& spec) {
  auto opset_it = model.opsets.find("");
  const std::int64_t opset = opset_it == model.opsets.end() ? 0 : opset_it->second;
  if (opset < 13)
    return Error(Errc::bad_input,
                 fmt::format("training needs ai.onnx opset 13 or newer, the model has {}", opset),
                 model.path.string(), "export with torch.onnx.export(..., opset_version=14)");
  model::Model fwd = model;
  auto rewritten = std::make_shared<onnx::ModelProto>(*model.proto);
  std::map<std::string, std::vector<std::int64_t>> reduce_grad;
  int entries = 0;
  std::set<std::string> original;  // the partition's tensors (the rewrite below adds some)
  for (const auto& n : model.proto->graph().node())
    original.insert(n.output().begin(), n.output().end());
  detail::fold_weight_transposes(*rewritten->mutable_graph());
  HP_TRY(detail::scans_to_loops(*rewritten->mutable_graph(), opset));
  // After the fold: its Reshape -> Gemm -> Reshape reads the weight as stored, and the region's
  // entry is the reshaped input (so no Shape node reads an entry: libonnx's data propagation
  // crashes on Shape(Identity(LayerNormalization)) in the tiny GPT-2's partition).
  if (!spec.tp.group.empty()) {
    const std::set<std::string> varying(spec.tp.varying.begin(), spec.tp.varying.end());
    entries = detail::mark_parallel_entries(*rewritten->mutable_graph(), varying, original,
                                            spec.tp.group, reduce_grad);
  }
  fwd.proto = rewritten;
  HP_ASSIGN_OR_RETURN(model::Graph fg, model::build_graph(fwd, spec.dims));
  detail::Engine e(fwd, spec, std::move(fg));
  e.exported = &model.proto->graph();
  e.w.graph = e.proto->mutable_graph();
  e.w.fwd = &e.fg;
  e.w.fwd_proto = &fwd.proto->graph();
  e.w.opset = opset;
  e.w.reduce_grad = std::move(reduce_grad);
  e.w.tp_rank = spec.tp.rank;
  e.forward_nodes = fwd.proto->graph().node_size();
  // A training-mode Dropout's gradient needs its mask: give it one where the export left it out.
  for (auto& n : *e.w.graph->mutable_node())
    if (n.op_type() == "Dropout" && n.input_size() >= 3 && !n.input(2).empty() &&
        n.output_size() < 2)
      n.add_output(n.output(0) + "/mask");
  GradGraph out;
  HP_TRY(e.check_and_mark(out));
  e.gelu_tail = detail::find_gelu_chains(e.w, e.forward_nodes, e.reads);
  e.norm_tail = detail::find_layer_norm_chains(e.w, e.forward_nodes, e.reads);
  HP_TRY(e.recompute_setup());
  detail::LossNodes loss;
  if (!spec.logits.empty()) {
    HP_ASSIGN_OR_RETURN(loss, detail::emit_loss(e.w, spec));
    e.contrib[loss.dlogits_of].push_back(loss.dlogits);
    e.loss_reads = loss.dlogits_of;
  }
  out.output_grad_inputs = detail::declare_output_grads(e.w, spec);
  for (std::size_t k = 0; k < spec.output_grads.size(); ++k)
    e.contrib[spec.output_grads[k]].push_back(out.output_grad_inputs[k]);
  if (!spec.logits.empty() && !spec.loss_scale.empty()) {  // the last graph input
    auto* in = e.w.graph->add_input();
    in->set_name(spec.loss_scale);
    in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    in->mutable_type()->mutable_tensor_type()->mutable_shape();
    e.w.types[spec.loss_scale] = onnx::TensorProto::FLOAT;
    e.contrib[loss.dlogits_of].front() = e.w.emit("Mul", {loss.dlogits, spec.loss_scale}, 1)[0];
  }
  std::vector<Diagnostic> errors;
  HP_TRY(e.backward(errors));
  if (!errors.empty()) return collect_errors(Errc::bad_input, std::move(errors));
  HP_TRY(e.finish(out, loss.loss));
  bool has_domain = false;
  for (const auto& o : e.proto->opset_import()) has_domain = has_domain || o.domain() == "hp.train";
  if (!has_domain) {
    auto* o = e.proto->add_opset_import();
    o->set_domain(detail::kTrainDomain);
    o->set_version(1);
  }
  out.loss = loss.loss;
  for (int i : e.fg.inputs) out.inputs.push_back(e.fg.tensor(i).name);
  if (!spec.logits.empty()) {
    out.inputs.push_back(spec.labels);
    out.labels = spec.labels;
  }
  out.inputs.insert(out.inputs.end(), out.output_grad_inputs.begin(), out.output_grad_inputs.end());
  if (!spec.loss_scale.empty() && !spec.logits.empty()) out.inputs.push_back(spec.loss_scale);
  out.dims = spec.dims;
  out.recomputed_nodes = e.clones;
  out.parallel_entries = entries;
  out.notes = e.notes;
  out.model = fwd;
  out.model.proto = e.proto;
  out.model.opsets[detail::kTrainDomain] = 1;
  return out;
}

}  // namespace hp::train
