// Saying where shape inference stopped, and why.
//
// When a shape stays unknown, ONNX invents a symbol (unk__N) for each unknown dim and carries it to
// every tensor downstream, so a list of symbols names dozens of dims nobody can bind, and the one
// place that matters, where shapes stop being known, is lost. So the report is by node: a node is
// listed when its outputs lack a concrete shape although every input's shape is concrete (the nodes
// downstream of it, whose inputs are already unknown, are not), with the reason in words. Nodes
// downstream of an unbound input dim are never listed: that dim is reported as such.
#include <fmt/core.h>

#include "shape_infer.h"

namespace hp::model {
namespace {

bool concrete(const ShapeMap& shapes, const std::string& name) {
  auto it = shapes.find(name);
  if (it == shapes.end() || !it->second.has_shape) return false;
  for (const auto& d : it->second.dims)
    if (!d.known()) return false;
  return true;
}

// Ops whose output sizes are decided by input data, not by shapes.
bool data_dependent(const std::string& op) {
  return op == "NonZero" || op == "Unique" || op == "NonMaxSuppression" || op == "Compress" ||
         op == "StringSplit" || op == "RegexFullMatch";
}

std::string reason_for(const onnx::NodeProto& n, const InferResult& r,
                       const std::set<std::string>& values_known) {
  const std::string& op = n.op_type();
  if (!n.domain().empty() && n.domain() != "ai.onnx")
    return fmt::format("ONNX shape inference does not know op '{}.{}'", n.domain(), op);
  if (data_dependent(op)) return "its output size depends on the input data";
  if (const auto* positions = shape_inputs(op))
    for (int pos : *positions)
      if (pos < n.input_size() && !n.input(pos).empty() && !values_known.count(n.input(pos)))
        return fmt::format(
            "the value of its input '{}', which sets the output shape, is not known before "
            "running (it is computed from data, or by an op hp does not evaluate)",
            n.input(pos));
  for (const auto& in : n.input())
    if (r.sequences.count(in))
      return fmt::format("it reads sequence '{}', whose length is not known", in);
  std::string shapes;
  for (const auto& in : n.input()) {
    if (in.empty()) continue;
    std::string dims;
    for (const auto& d : r.shapes.at(in).dims)
      dims += (dims.empty() ? "" : "x") + std::to_string(d.value);
    shapes += (shapes.empty() ? "" : ", ") + (dims.empty() ? std::string("scalar") : dims);
  }
  return fmt::format(
      "ONNX shape inference gives {} no output shape for inputs of shapes {} (they may be "
      "incompatible: the export may be wrong for these dims)",
      op, shapes);
}

}  // namespace

std::vector<UnresolvedShape> find_unresolved(const onnx::GraphProto& g, const InferResult& r) {
  // Values that are known before running: initializers and Constant outputs, plus every tensor
  // shape arithmetic computed (values.cpp).
  std::set<std::string> values_known = r.valued;
  for (const auto& t : g.initializer()) values_known.insert(t.name());
  for (const auto& n : g.node())
    if (n.op_type() == "Constant")
      for (const auto& o : n.output()) values_known.insert(o);
  // Tensors unknown for a reason upstream (an unbound input dim, an earlier node listed here),
  // shapes or values alike: Shape of a tensor without a concrete shape has a concrete shape itself,
  // but its value is unknown.
  std::set<std::string> unknown;
  std::set<std::string> data;  // tensors computed from the graph inputs' data
  for (const auto& in : g.input()) data.insert(in.name());
  std::vector<UnresolvedShape> out;
  for (const auto& n : g.node()) {
    bool inputs_known = true;
    for (const auto& in : n.input())
      inputs_known =
          inputs_known &&
          (in.empty() || (!unknown.count(in) && (r.sequences.count(in) || concrete(r.shapes, in))));
    std::string missing;
    for (const auto& o : n.output())
      if (missing.empty() && !o.empty() && !r.sequences.count(o) && !concrete(r.shapes, o))
        missing = o;
    // Below an unknown, an output computed from input data whose shape is concrete anyway (a
    // ScatterElements into a known buffer) is known: its value never decides a shape. Outputs of
    // shape arithmetic (not from data) are unknown whenever an input is, as their values are.
    bool from_data = false;
    if (n.op_type() != "Shape" && n.op_type() != "Size")
      for (const auto& in : n.input()) from_data = from_data || data.count(in) > 0;
    for (const auto& o : n.output()) {
      if (from_data) data.insert(o);
      if (!missing.empty() || (!inputs_known && !(from_data && concrete(r.shapes, o))))
        unknown.insert(o);
    }
    if (!inputs_known || missing.empty()) continue;
    std::string op = n.domain().empty() || n.domain() == "ai.onnx" ? n.op_type()
                                                                   : n.domain() + "." + n.op_type();
    out.push_back({n.name(), op, missing, reason_for(n, r, values_known)});
  }
  return out;
}

}  // namespace hp::model
