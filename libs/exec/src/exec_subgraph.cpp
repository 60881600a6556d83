// Subgraphs of control-flow nodes (If's branches, the body of Loop, Scan and SequenceMap), prepared
// once with the main graph.
//
// A subgraph is not a separate executor: its tensors get ids in the executor's one tensor table,
// its nodes are PreparedNodes in a Body, and they run through the same run_node (placement, kernel
// dispatch, the buffer pool) as the main graph's. Names resolve in the subgraph first and then in
// the enclosing scopes, so a body reads an outer value (a weight, an activation of the main graph,
// a value of an enclosing body) directly by its id, without a copy. Those outer ids are the node's
// `captured` values: they count as its inputs for ordering and lifetimes, so an outer value lives
// until the last node whose subgraph reads it has run. Within a body, release_after frees the
// body's own tensors after their last reader, as in the main graph; whatever is left (the body's
// outputs, once the control-flow node has taken them) is cleared after each run of the body.
// docs/executor.md, "Control flow", has the whole design.
#include <fmt/core.h>

#include <algorithm>

#include "exec_internal.h"
#include "proto_tensor.h"

namespace hp::exec {

Builtin builtin_of(const std::string& domain, const std::string& op) {
  if (!domain.empty() && domain != "ai.onnx") return Builtin::none;
  static const std::map<std::string, Builtin> table = {
      {"If", Builtin::If},
      {"Loop", Builtin::Loop},
      {"Scan", Builtin::Scan},
      {"SequenceEmpty", Builtin::SequenceEmpty},
      {"SequenceConstruct", Builtin::SequenceConstruct},
      {"SequenceInsert", Builtin::SequenceInsert},
      {"SequenceAt", Builtin::SequenceAt},
      {"SequenceErase", Builtin::SequenceErase},
      {"SequenceLength", Builtin::SequenceLength},
      {"SplitToSequence", Builtin::SplitToSequence},
      {"ConcatFromSequence", Builtin::ConcatFromSequence},
      {"SequenceMap", Builtin::SequenceMap},
  };
  auto it = table.find(op);
  return it == table.end() ? Builtin::none : it->second;
}

bool is_executor_op(std::string_view domain, std::string_view op_type) {
  return builtin_of(std::string(domain), std::string(op_type)) != Builtin::none;
}

std::vector<std::string> node_reads(const onnx::NodeProto& np) {
  std::vector<std::string> r(np.input().begin(), np.input().end());
  for (const auto& a : np.attribute()) {
    if (a.type() == onnx::AttributeProto::GRAPH)
      for (const auto& name : free_names(a.g())) r.push_back(name);
    if (a.type() == onnx::AttributeProto::GRAPHS)
      for (const auto& g : a.graphs())
        for (const auto& name : free_names(g)) r.push_back(name);
  }
  return r;
}

std::set<std::string> free_names(const onnx::GraphProto& g) {
  std::set<std::string> defined, read;
  for (const auto& v : g.input()) defined.insert(v.name());
  for (const auto& t : g.initializer()) defined.insert(t.name());
  for (const auto& n : g.node())
    for (const auto& o : n.output()) defined.insert(o);
  for (const auto& n : g.node())
    for (const auto& name : node_reads(n)) read.insert(name);
  for (const auto& v : g.output()) read.insert(v.name());
  std::set<std::string> out;
  for (const auto& name : read)
    if (!name.empty() && !defined.count(name)) out.insert(name);
  return out;
}

namespace {

/// The subgraph attributes an op has, in the order PreparedNode::bodies keeps them.
std::vector<const char*> body_attrs(Builtin b) {
  switch (b) {
    case Builtin::If: return {"then_branch", "else_branch"};
    case Builtin::Loop:
    case Builtin::Scan:
    case Builtin::SequenceMap: return {"body"};
    default: return {};
  }
}

Expected<std::shared_ptr<Body>> prepare_body(Executor::Impl& im, const onnx::GraphProto& g,
                                             const Scope& outer, const model::Model& model,
                                             std::vector<Diagnostic>& unsupported) {
  auto b = std::make_shared<Body>();
  b->name = g.name();
  Scope scope;
  scope.parent = &outer;
  auto define = [&](const std::string& name) {
    auto [it, added] = scope.names.emplace(name, static_cast<int>(im.tensor_names.size()));
    if (added) {
      im.tensor_names.push_back(name);
      b->locals.push_back(it->second);
    }
    return it->second;
  };
  // Initializers of a subgraph are weights like the main graph's: loaded once, never released.
  for (const auto& t : g.initializer()) {
    const int id = static_cast<int>(im.tensor_names.size());
    scope.names.emplace(t.name(), id);
    im.tensor_names.push_back(t.name());
    HP_ASSIGN_OR_RETURN(auto h, tensor_from_proto(t, model.path.parent_path(), g.name()));
    im.stats.weight_bytes += static_cast<std::int64_t>(h.data.size());
    im.weights.emplace_back(id, std::move(h));
  }
  for (const auto& v : g.input()) {
    b->input_io.push_back(graph_io_of(v));
    b->inputs.push_back(define(v.name()));
  }
  auto resolve = [&](const std::string& name) { return scope.lookup(im, name); };
  HP_TRY(prepare_nodes(im, g, model, scope, b->nodes, unsupported, resolve, define));
  for (const auto& v : g.output()) {
    const int id = scope.lookup(im, v.name());
    if (id < 0)
      return Error(Errc::bad_input,
                   fmt::format("subgraph output '{}' is not defined in it or around it", v.name()),
                   g.name());
    b->output_io.push_back(graph_io_of(v));
    b->outputs.push_back(id);
  }
  b->is_local.assign(im.tensor_names.size(), 0);
  for (int id : b->locals) b->is_local[static_cast<std::size_t>(id)] = 1;

  // Lifetimes of the body's own tensors: released after their last reader unless they are outputs
  // (those are taken by the control-flow node, then cleared).
  std::vector<int> last(im.tensor_names.size(), -1);
  for (std::size_t k = 0; k < b->nodes.size(); ++k)
    for (const auto* list : {&b->nodes[k].inputs, &b->nodes[k].captured})
      for (int t : *list)
        if (t >= 0) last[static_cast<std::size_t>(t)] = static_cast<int>(k);
  for (int t : b->locals) {
    if (std::count(b->outputs.begin(), b->outputs.end(), t)) continue;
    const int at = last[static_cast<std::size_t>(t)];
    if (at >= 0) b->nodes[static_cast<std::size_t>(at)].release_after.push_back(t);
  }
  return b;
}

}  // namespace

Status prepare_bodies(Executor::Impl& im, const onnx::NodeProto& np, PreparedNode& n,
                      const Scope& scope, const model::Model& model,
                      std::vector<Diagnostic>& unsupported) {
  const std::string where = n.name.empty() ? n.op_type : n.name;
  for (const char* attr : body_attrs(n.builtin)) {
    const onnx::GraphProto* g = nullptr;
    for (const auto& a : np.attribute())
      if (a.name() == attr && a.type() == onnx::AttributeProto::GRAPH) g = &a.g();
    if (!g)
      return Error(Errc::bad_input,
                   fmt::format("op {} needs the graph attribute '{}'", n.op_type, attr), where);
    HP_ASSIGN_OR_RETURN(auto body, prepare_body(im, *g, scope, model, unsupported));
    n.bodies.push_back(std::move(body));
  }
  std::set<int> captured;
  for (const auto& name : node_reads(np)) {
    if (std::find(np.input().begin(), np.input().end(), name) != np.input().end()) continue;
    const int id = scope.lookup(im, name);
    if (id < 0)
      return Error(Errc::bad_input,
                   fmt::format("a subgraph reads '{}', which no enclosing graph defines", name),
                   where);
    captured.insert(id);
  }
  n.captured.assign(captured.begin(), captured.end());
  // Shape checks that hold for every run: the body's inputs and outputs match the node's.
  const std::size_t ins = n.inputs.size(), outs = n.outputs.size();
  auto mismatch = [&](const std::string& what) {
    return Error(Errc::bad_input, fmt::format("{}: {}", n.op_type, what), where);
  };
  switch (n.builtin) {
    case Builtin::If:
      for (const auto& b : n.bodies)
        if (b->outputs.size() != outs)
          return mismatch(fmt::format("branch '{}' has {} outputs, the node {}", b->name,
                                      b->outputs.size(), outs));
      break;
    case Builtin::Loop: {
      const Body& b = *n.bodies[0];
      if (ins < 2 || b.inputs.size() != ins || b.outputs.size() < ins - 1 ||
          outs != b.outputs.size() - 1)
        return mismatch(fmt::format(
            "the body takes {} inputs and gives {} outputs; the node has {} inputs and {} outputs "
            "(the body needs iteration number, condition and each carried value, and gives the "
            "condition, each carried value and the scan outputs)",
            b.inputs.size(), b.outputs.size(), ins, outs));
      break;
    }
    case Builtin::Scan: {
      const Body& b = *n.bodies[0];
      const std::size_t extra = n.opset < 9 ? 1 : 0;  // Scan-8's sequence_lens
      if (ins < extra || b.inputs.size() != ins - extra || b.outputs.size() != outs)
        return mismatch(
            fmt::format("the body takes {} inputs and gives {} outputs; the node has "
                        "{} inputs and {} outputs",
                        b.inputs.size(), b.outputs.size(), ins, outs));
      break;
    }
    case Builtin::SequenceMap: {
      const Body& b = *n.bodies[0];
      if (b.inputs.size() != ins || b.outputs.size() != outs)
        return mismatch(
            fmt::format("the body takes {} inputs and gives {} outputs; the node has "
                        "{} inputs and {} outputs",
                        b.inputs.size(), b.outputs.size(), ins, outs));
      break;
    }
    default: break;
  }
  return {};
}

}  // namespace hp::exec
