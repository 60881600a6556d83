// Shapes through control flow, where ONNX 1.12's inference stops short.
//
// Exporters declare a subgraph's outputs with invented symbols (PyTorch writes "Ify_dim_0" on a
// Loop body's outputs), and ONNX merges a declared shape with the one it infers, so those symbols
// win over the real dims. The weight-less copy therefore drops the declared shapes of subgraph
// outputs (keeping their element types): inference then writes the inferred ones back.
//
// ONNX also leaves a Loop's carried outputs without a shape, since a carried value may change shape
// from one iteration to the next. When the body's inferred output has exactly the carried input's
// (fully known) shape, it cannot change, and the output gets that shape (an If then infers from its
// branches as usual). A body declares its carried inputs with the exporter's symbols, which the
// outer graph's bindings do not reach; bind_loop_body_inputs gives them the initial value's static
// shape (the first iteration's), so the body's shapes, and then the output's, come out bound.
#include "shape_infer.h"

namespace hp::model {
namespace {

/// The dims of a tensor type whose every dim is a number, or false.
bool static_dims(const onnx::TypeProto& t, std::vector<std::int64_t>& out) {
  if (!t.has_tensor_type() || !t.tensor_type().has_shape()) return false;
  out.clear();
  for (const auto& d : t.tensor_type().shape().dim()) {
    if (!d.has_dim_value()) return false;
    out.push_back(d.dim_value());
  }
  return true;
}

}  // namespace

void strip_subgraph_output_shapes(onnx::GraphProto& g) {
  for (auto& n : *g.mutable_node())
    for (auto& a : *n.mutable_attribute()) {
      if (a.type() != onnx::AttributeProto::GRAPH) continue;
      for (auto& o : *a.mutable_g()->mutable_output())
        if (o.type().has_tensor_type()) o.mutable_type()->mutable_tensor_type()->clear_shape();
      strip_subgraph_output_shapes(*a.mutable_g());
    }
}

int fix_loop_shapes(const onnx::GraphProto& g, const ShapeMap& shapes, ShapeMap& fixed) {
  int added = 0;
  for (const auto& n : g.node()) {
    if (n.op_type() != "Loop" || n.input_size() < 2) continue;
    const onnx::GraphProto* body = nullptr;
    for (const auto& a : n.attribute())
      if (a.name() == "body" && a.type() == onnx::AttributeProto::GRAPH) body = &a.g();
    if (!body) continue;
    const int carried = n.input_size() - 2;
    for (int k = 0; k < carried && k < n.output_size() && 1 + k < body->output_size(); ++k) {
      const std::string& out = n.output(k);
      if (out.empty() || fixed.count(out)) continue;
      if (auto it = shapes.find(out); it != shapes.end() && it->second.has_shape) continue;
      auto in = shapes.find(n.input(2 + k));
      if (in == shapes.end() || !in->second.has_shape) continue;
      std::vector<std::int64_t> dims;
      if (!static_dims(body->output(1 + k).type(), dims) || dims.size() != in->second.dims.size())
        continue;
      bool same = true;
      for (std::size_t d = 0; d < dims.size(); ++d)
        same = same && in->second.dims[d].known() && in->second.dims[d].value == dims[d];
      if (!same) continue;
      fixed[out] = in->second;
      ++added;
    }
  }
  return added;
}

int bind_loop_body_inputs(onnx::GraphProto& g, const ShapeMap& shapes) {
  int changed = 0;
  for (auto& n : *g.mutable_node()) {
    if (n.op_type() != "Loop") continue;
    onnx::GraphProto* body = nullptr;
    for (auto& a : *n.mutable_attribute())
      if (a.name() == "body" && a.type() == onnx::AttributeProto::GRAPH) body = a.mutable_g();
    if (!body) continue;
    for (int k = 2; k < n.input_size() && k < body->input_size(); ++k) {
      auto in = shapes.find(n.input(k));
      if (in == shapes.end() || !in->second.has_shape) continue;
      bool known = true;
      for (const auto& d : in->second.dims) known = known && d.known();
      auto* tt = body->mutable_input(k)->mutable_type();
      if (!known || !tt->has_tensor_type()) continue;
      const bool declared = tt->tensor_type().has_shape();
      const auto& shape = tt->tensor_type().shape();
      // Only symbols are replaced (the exporter's invented ones, or the graph's own dim names,
      // which the outer graph has bound): a declared number must be the initial value's, and a
      // declaration of numbers only is the static shape already.
      const auto& dims = in->second.dims;
      bool agrees = !declared || shape.dim_size() == static_cast<int>(dims.size());
      bool symbols = !declared;
      for (int d = 0; agrees && declared && d < shape.dim_size(); ++d) {
        const auto& dim = shape.dim(d);
        agrees = !dim.has_dim_value() || dim.dim_value() == dims[static_cast<std::size_t>(d)].value;
        symbols = symbols || !dim.has_dim_value();
      }
      if (!agrees || !symbols) continue;
      auto* out = tt->mutable_tensor_type()->mutable_shape();
      out->clear_dim();
      for (const auto& d : dims) out->add_dim()->set_dim_value(d.value);
      ++changed;
    }
  }
  return changed;
}

}  // namespace hp::model
