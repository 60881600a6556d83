// Cost of the recurrent layers and of control flow (see cost.cpp for the FLOPs convention).
//
// Recurrent layers (LSTM, GRU, RNN) are matrix products in disguise: per direction and step, the
// gates are X_t W^T + H_{t-1} R^T, G*hidden rows of (input + hidden) multiply-accumulates per batch
// entry (G = 4 for LSTM, 3 for GRU, 1 for RNN). Those count as matmul FLOPs, 2 per MAC, as MatMul's
// do; the gate arithmetic after them (activations, products, sums) counts as other FLOPs per
// hidden unit and step: LSTM 3 sigmoids + 2 tanh + 3 products + 2 sums and the biases = 12, GRU 9,
// RNN 2.
//
// Control flow: the cost of a node with subgraphs is the cost of its bodies, each computed as a
// graph of its own (build_graph on a model whose graph is the body, with the body's inputs typed
// from the node's inputs and the outer values it reads added as inputs with their shapes here):
//   - If: the more expensive branch (which one runs depends on data),
//   - Loop: the body times the trip count when M is a constant; otherwise one iteration and the
//     cost is marked unknown (an undercount, like any cost that needs an unknown dim),
//   - Scan: the body times the scan length (a dim of the first scan input),
//   - SequenceMap: one iteration, marked unknown (the sequence length is data).
#include <fmt/core.h>

#include <cstring>
#include <functional>
#include <optional>
#include <set>

#include "cost.h"
#include "hp/model/model.h"

namespace hp::model {
namespace {

const Tensor* io_tensor(const Graph& g, const Node& n, std::size_t i, bool output = false) {
  const auto& v = output ? n.outputs : n.inputs;
  if (i >= v.size() || v[i] < 0) return nullptr;
  return &g.tensor(v[i]);
}

std::optional<std::int64_t> known_dim(const Tensor* t, std::size_t i) {
  if (!t || !t->has_shape || i >= t->dims.size() || !t->dims[i].known()) return std::nullopt;
  return t->dims[i].value;
}

/// Sets `v`'s type to a tensor of `t`'s element type and dims (symbolic where unknown), or, with
/// `drop_axis` >= 0, those dims without that axis (a Scan slice).
void set_type(onnx::ValueInfoProto& v, const Tensor& t, int drop_axis = -1) {
  auto* tt = v.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(t.elem_type);
  if (!t.has_shape) return;
  auto* shape = tt->mutable_shape();
  shape->clear_dim();
  for (std::size_t k = 0; k < t.dims.size(); ++k) {
    if (static_cast<int>(k) == drop_axis) continue;
    auto* d = shape->add_dim();
    if (t.dims[k].known())
      d->set_dim_value(t.dims[k].value);
    else if (!t.dims[k].symbol.empty())
      d->set_dim_param(t.dims[k].symbol);
  }
}

/// The value of a scalar integer that is an initializer or a Constant node's output, if it is one.
std::optional<std::int64_t> constant_int(const onnx::GraphProto& g, const std::string& name) {
  auto value_of = [](const onnx::TensorProto& t) -> std::optional<std::int64_t> {
    if (t.int64_data_size() == 1) return t.int64_data(0);
    if (t.int32_data_size() == 1) return t.int32_data(0);
    if (t.data_type() == onnx::TensorProto::INT64 && t.raw_data().size() == 8) {
      std::int64_t v = 0;
      std::memcpy(&v, t.raw_data().data(), 8);
      return v;
    }
    return std::nullopt;
  };
  for (const auto& t : g.initializer())
    if (t.name() == name) return value_of(t);
  for (const auto& n : g.node())
    if (n.op_type() == "Constant" && n.output_size() == 1 && n.output(0) == name)
      for (const auto& a : n.attribute())
        if (a.name() == "value" && a.has_t()) return value_of(a.t());
  return std::nullopt;
}

/// The summed cost of `body` run once, with its inputs typed by `input_types` (null: untyped) and
/// the outer values it reads typed from `outer`.
NodeCost body_cost(const Model& model, const onnx::GraphProto& body,
                   const std::vector<std::function<void(onnx::ValueInfoProto&)>>& input_types,
                   const Graph& outer) {
  auto proto = std::make_shared<onnx::ModelProto>();
  proto->set_ir_version(model.proto->ir_version());
  *proto->mutable_opset_import() = model.proto->opset_import();
  *proto->mutable_graph() = body;
  onnx::GraphProto& g = *proto->mutable_graph();
  for (int k = 0; k < g.input_size() && static_cast<std::size_t>(k) < input_types.size(); ++k)
    if (input_types[static_cast<std::size_t>(k)])
      input_types[static_cast<std::size_t>(k)](*g.mutable_input(k));
  for (const auto& name : outer_reads(body)) {
    auto* v = g.add_input();
    v->set_name(name);
    const int t = outer.find_tensor(name);
    if (t >= 0) set_type(*v, outer.tensor(t));
  }
  Model sub;
  sub.path = model.path;
  sub.proto = proto;
  sub.ir_version = model.ir_version;
  sub.opsets = model.opsets;
  NodeCost c;
  auto built = build_graph(sub, {});
  if (!built) {
    c.known = false;
    return c;
  }
  for (const Node& n : built->nodes) {
    c.matmul_flops += n.cost.matmul_flops;
    c.other_flops += n.cost.other_flops;
    c.bytes_read += n.cost.bytes_read;
    c.bytes_written += n.cost.bytes_written;
    c.known = c.known && n.cost.known;
  }
  return c;
}

const onnx::GraphProto* graph_attr(const onnx::NodeProto& p, const char* name) {
  for (const auto& a : p.attribute())
    if (a.name() == name && a.type() == onnx::AttributeProto::GRAPH) return &a.g();
  return nullptr;
}

void add_scaled(NodeCost& c, const NodeCost& body, double times) {
  c.matmul_flops += body.matmul_flops * times;
  c.other_flops += body.other_flops * times;
  c.known = c.known && body.known;
}

}  // namespace

bool add_recurrent_cost(const onnx::NodeProto& p, const Graph& g, const Node& n, NodeCost& c) {
  const std::string& op = n.op_type;
  const int gates = op == "LSTM" ? 4 : op == "GRU" ? 3 : op == "RNN" ? 1 : 0;
  if (gates == 0 || !n.domain.empty()) return false;
  const double per_unit = op == "LSTM" ? 12 : op == "GRU" ? 9 : 2;
  const Tensor* x = io_tensor(g, n, 0);
  const Tensor* w = io_tensor(g, n, 1);
  const bool batch_first = attr_int(p, "layout", 0) != 0;
  auto seq = known_dim(x, batch_first ? 1 : 0), batch = known_dim(x, batch_first ? 0 : 1);
  auto input = known_dim(x, 2), dirs = known_dim(w, 0), rows = known_dim(w, 1);
  if (!seq || !batch || !input || !dirs || !rows) {
    c.known = false;
    return true;
  }
  const double hidden = static_cast<double>(*rows) / gates;
  const double steps =
      static_cast<double>(*dirs) * static_cast<double>(*seq) * static_cast<double>(*batch);
  c.matmul_flops = 2 * steps * static_cast<double>(*rows) * (static_cast<double>(*input) + hidden);
  c.other_flops = steps * hidden * per_unit;
  return true;
}

void add_subgraph_cost(const Model& model, const onnx::NodeProto& p, const Graph& g, const Node& n,
                       NodeCost& c) {
  if (!n.domain.empty()) return;
  const std::string& op = n.op_type;
  auto typed = [&](std::size_t i,
                   int drop_axis = -1) -> std::function<void(onnx::ValueInfoProto&)> {
    const Tensor* t = io_tensor(g, n, i);
    if (!t || t->elem_type == 0) return nullptr;
    return [t, drop_axis](onnx::ValueInfoProto& v) { set_type(v, *t, drop_axis); };
  };
  if (op == "If") {
    NodeCost best;
    bool first = true;
    for (const char* branch : {"then_branch", "else_branch"}) {
      const onnx::GraphProto* b = graph_attr(p, branch);
      if (!b) continue;
      NodeCost bc = body_cost(model, *b, {}, g);
      if (first || bc.flops() > best.flops()) best = bc;
      best.known = best.known && bc.known;
      first = false;
    }
    add_scaled(c, best, 1);
  } else if (op == "Loop") {
    const onnx::GraphProto* b = graph_attr(p, "body");
    if (!b) return;
    // The iteration number and the condition are scalars (exporters often declare no shape).
    auto scalar = [](std::int32_t elem) {
      return [elem](onnx::ValueInfoProto& v) {
        v.mutable_type()->mutable_tensor_type()->set_elem_type(elem);
        v.mutable_type()->mutable_tensor_type()->mutable_shape()->clear_dim();
      };
    };
    std::vector<std::function<void(onnx::ValueInfoProto&)>> types = {
        scalar(onnx::TensorProto::INT64), scalar(onnx::TensorProto::BOOL)};
    for (std::size_t j = 2; j < n.inputs.size(); ++j) types.push_back(typed(j));
    const NodeCost bc = body_cost(model, *b, types, g);
    std::optional<std::int64_t> trips;
    if (p.input_size() > 0 && !p.input(0).empty())
      trips = constant_int(model.proto->graph(), p.input(0));
    add_scaled(c, bc, trips ? static_cast<double>(std::max<std::int64_t>(*trips, 0)) : 1.0);
    if (!trips) c.known = false;
  } else if (op == "Scan") {
    const onnx::GraphProto* b = graph_attr(p, "body");
    const std::int64_t m = attr_int(p, "num_scan_inputs", 0);
    const auto v8 = static_cast<std::size_t>(model.opsets.count("") && model.opsets.at("") < 9);
    if (!b || m < 1 || n.inputs.size() < v8 + static_cast<std::size_t>(m)) return;
    const std::size_t states = n.inputs.size() - v8 - static_cast<std::size_t>(m);
    const auto axes = attr_ints(p, "scan_input_axes");
    std::vector<std::function<void(onnx::ValueInfoProto&)>> types;
    for (std::size_t j = 0; j < states; ++j) types.push_back(v8 ? nullptr : typed(v8 + j));
    std::optional<std::int64_t> len;
    for (std::size_t k = 0; k < static_cast<std::size_t>(m); ++k) {
      const std::size_t i = v8 + states + k;
      int axis = v8 ? 1 : (k < axes.size() ? static_cast<int>(axes[k]) : 0);
      const Tensor* t = io_tensor(g, n, i);
      if (axis < 0 && t && t->has_shape) axis += static_cast<int>(t->dims.size());
      types.push_back(v8 ? nullptr : typed(i, axis));
      if (k == 0) len = known_dim(t, static_cast<std::size_t>(std::max(axis, 0)));
    }
    const NodeCost bc = body_cost(model, *b, types, g);
    add_scaled(c, bc, len ? static_cast<double>(*len) : 1.0);
    if (!len || v8) c.known = false;  // Scan-8's batch loop is not counted
  } else if (op == "SequenceMap") {
    if (const onnx::GraphProto* b = graph_attr(p, "body"))
      add_scaled(c, body_cost(model, *b, {}, g), 1);
    c.known = false;
  }
}

std::set<std::string> outer_reads(const onnx::GraphProto& g) {
  std::set<std::string> defined, read;
  for (const auto& v : g.input()) defined.insert(v.name());
  for (const auto& t : g.initializer()) defined.insert(t.name());
  for (const auto& n : g.node()) {
    for (const auto& o : n.output()) defined.insert(o);
    for (const auto& i : n.input()) read.insert(i);
    for (const auto& name : outer_reads(n)) read.insert(name);
  }
  for (const auto& v : g.output()) read.insert(v.name());
  std::set<std::string> out;
  for (const auto& name : read)
    if (!name.empty() && !defined.count(name)) out.insert(name);
  return out;
}

std::set<std::string> outer_reads(const onnx::NodeProto& n) {
  std::set<std::string> out;
  for (const auto& a : n.attribute()) {
    if (a.has_g()) out.merge(outer_reads(a.g()));
    for (const auto& sg : a.graphs()) out.merge(outer_reads(sg));
  }
  return out;
}

}  // namespace hp::model
