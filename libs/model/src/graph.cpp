// Building the graph view: one Tensor per named value with its inferred shape, one Node per ONNX
// node with its cost, and a classification of every tensor by what its value depends on.
//
// The classification (TensorKind) is what lets layer discovery see through exporter clutter: a
// PyTorch export computes reshape targets, masks and position ids from Shape(x), so the dataflow
// graph has edges from every layer's input to nodes deep inside it that carry no data at all. Only
// `activation` tensors — those depending on the data of a graph input — form the real dataflow;
// `shape` tensors (from Shape/Size and arithmetic on shapes and constants) and `constant` tensors
// (from initializers and Constant nodes only) are side computations attached to their consumers.
#include <fmt/core.h>
#include <fmt/format.h>

#include "cost.h"
#include "hp/core/checked.h"
#include "shape_infer.h"

namespace hp::model {

void mark_tied_initializers(const onnx::GraphProto& pg, Graph& g);  // tied.cpp

std::optional<std::int64_t> Tensor::numel() const {
  if (!has_shape) return std::nullopt;
  std::vector<std::int64_t> values;
  for (const auto& d : dims) {
    if (!d.known()) return std::nullopt;
    values.push_back(d.value);
  }
  // build_graph refuses tensors beyond the limits, so this is nullopt only for a Graph built by
  // hand; never a wrapped product.
  return bounded_numel(values);
}

std::optional<std::int64_t> Tensor::bytes() const {
  auto n = numel();
  int es = elem_size(elem_type);
  if (!n || es == 0) return std::nullopt;
  return checked_mul(*n, es);
}

bool Tensor::is_float() const { return is_float_type(elem_type); }

int Graph::find_tensor(const std::string& name) const {
  auto it = index.find(name);
  return it == index.end() ? -1 : it->second;
}

namespace {

int add_tensor(Graph& g, const std::string& name, TensorKind kind, const ShapeMap& shapes) {
  auto [it, inserted] = g.index.emplace(name, static_cast<int>(g.tensors.size()));
  if (!inserted) return it->second;
  Tensor t;
  t.name = name;
  t.kind = kind;
  if (auto s = shapes.find(name); s != shapes.end()) {
    t.elem_type = s->second.elem_type;
    t.has_shape = s->second.has_shape;
    t.dims = s->second.dims;
  }
  g.tensors.push_back(std::move(t));
  return it->second;
}

// What a node's outputs depend on, from its inputs' kinds.
TensorKind classify(const Graph& g, const onnx::NodeProto& n, const std::vector<int>& inputs) {
  const std::string& op = n.op_type();
  if (op == "Shape" || op == "Size") return TensorKind::shape;
  bool any_activation = false, any_shape = false;
  for (int i : inputs) {
    if (i < 0) continue;
    TensorKind k = g.tensor(i).kind;
    any_activation = any_activation || k == TensorKind::activation || k == TensorKind::input;
    any_shape = any_shape || k == TensorKind::shape;
  }
  if (any_activation) return TensorKind::activation;
  if (any_shape) return TensorKind::shape;
  return TensorKind::constant;
}

std::string dims_text(const Tensor& t) {
  std::string s;
  for (const auto& d : t.dims)
    s += (s.empty() ? "" : "x") + (d.known() ? std::to_string(d.value) : "?");
  return s.empty() ? "scalar" : s;
}

// Every size later multiplied into bytes and FLOPs must be within hp/core/checked.h's limits; a
// tensor beyond them (a bound dim of 10^15 times a hidden size) is refused by name here, so no
// cost, summary or plan downstream ever sees a wrapped or negative size.
Status check_tensor_sizes(const ShapeMap& shapes, const std::string& where) {
  for (const auto& [name, s] : shapes) {
    if (!s.has_shape) continue;
    std::vector<std::int64_t> known;
    for (const auto& d : s.dims)
      if (d.known()) known.push_back(d.value);
    if (!bounded_numel(known)) {
      std::vector<std::string> text;
      for (const auto& d : s.dims) text.push_back(d.known() ? std::to_string(d.value) : d.symbol);
      return Error(Errc::bad_input,
                   fmt::format("tensor '{}' has shape [{}], beyond hp's limits (each dim at most "
                               "2^40, at most 2^56 elements)",
                               name, fmt::join(text, ", ")),
                   where, "bind smaller dims (--dim NAME=N, or the recipe's dims)");
    }
  }
  return Status::success();
}

}  // namespace

Status check_dim_bindings(const DimBindings& dims) {
  for (const auto& [name, value] : dims)
    if (value < 0 || value > kMaxDim)
      return Error(Errc::bad_input,
                   fmt::format("dim '{}' = {} is outside [0, 2^40] (1099511627776)", name, value),
                   "", "bind a realistic size");
  return Status::success();
}

Expected<Graph> build_graph(const Model& model, const DimBindings& dims) {
  HP_TRY(check_dim_bindings(dims));
  HP_ASSIGN_OR_RETURN(auto inferred, infer_shapes(model, dims));
  HP_TRY(check_tensor_sizes(inferred.shapes, model.path.string()));
  const ShapeMap& shapes = inferred.shapes;
  const onnx::GraphProto& pg = model.proto->graph();

  Graph g;
  g.unknown_dims = std::move(inferred.unknown_dims);
  g.unresolved = std::move(inferred.unresolved);
  g.warnings = std::move(inferred.warnings);
  for (const auto& t : pg.initializer()) add_tensor(g, t.name(), TensorKind::initializer, shapes);
  for (const auto& v : pg.input()) {
    if (g.index.count(v.name())) continue;  // old-style models list initializers as inputs too
    g.inputs.push_back(add_tensor(g, v.name(), TensorKind::input, shapes));
  }
  g.nodes.reserve(static_cast<std::size_t>(pg.node_size()));
  for (const auto& pn : pg.node()) {
    Node n;
    n.name = pn.name();
    n.op_type = pn.op_type();
    n.domain = pn.domain() == "ai.onnx" ? "" : pn.domain();
    int self = static_cast<int>(g.nodes.size());
    for (const auto& in : pn.input()) {
      int i = in.empty() ? -1 : g.find_tensor(in);
      n.inputs.push_back(i);
      if (i < 0) {
        n.weight_shapes.emplace_back();  // kept aligned with `inputs` (layers.cpp indexes both)
        continue;
      }
      auto& cons = g.tensors[static_cast<std::size_t>(i)].consumers;
      if (cons.empty() || cons.back() != self) cons.push_back(self);
      const Tensor& t = g.tensor(i);
      bool weight = t.kind == TensorKind::initializer || t.kind == TensorKind::constant;
      n.weight_shapes.push_back(weight ? dims_text(t) : std::string());
    }
    TensorKind kind = classify(g, pn, n.inputs);
    for (const auto& out : pn.output()) {
      if (out.empty()) {
        n.outputs.push_back(-1);
        continue;
      }
      int o = add_tensor(g, out, kind, shapes);
      g.tensors[static_cast<std::size_t>(o)].producer = self;
      n.outputs.push_back(o);
    }
    g.nodes.push_back(std::move(n));
  }
  for (const auto& v : pg.output()) g.outputs.push_back(g.find_tensor(v.name()));
  for (auto& t : g.tensors) t.sequence = inferred.sequences.count(t.name) > 0;
  mark_tied_initializers(pg, g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const onnx::NodeProto& pn = pg.node(static_cast<int>(i));
    g.nodes[i].cost = compute_cost(pn, g, g.nodes[i]);
    add_subgraph_cost(model, pn, g, g.nodes[i], g.nodes[i].cost);
  }
  return g;
}

}  // namespace hp::model
