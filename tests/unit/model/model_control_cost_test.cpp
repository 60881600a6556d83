// FLOPs of recurrent layers and of control flow (libs/model/src/cost_control.cpp): the GRU and LSTM
// of the PyTorch-exported test models against the closed form, and hand-built Loop / If / Scan
// graphs whose bodies hold a MatMul reading an outer weight: a constant trip count multiplies the
// body, an unknown one counts one iteration and marks the cost unknown, If takes the dearer branch.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include "hp/model/graph.h"
#include "hp/model/model.h"
#include "model_test_util.h"

using namespace hp;
using namespace hp::model;
using namespace hp::model::test;

namespace {

void add_value(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list,
               const std::string& name, std::vector<std::int64_t> dims,
               int type = onnx::TensorProto::FLOAT) {
  auto* v = list->Add();
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(type);
  for (auto d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, std::vector<std::string> in,
                          std::vector<std::string> out) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(op + std::to_string(g->node_size()));
  for (auto& s : in) n->add_input(s);
  for (auto& s : out) n->add_output(s);
  return n;
}

onnx::GraphProto* add_graph(onnx::NodeProto* n, const std::string& attr) {
  auto* a = n->add_attribute();
  a->set_name(attr);
  a->set_type(onnx::AttributeProto::GRAPH);
  a->mutable_g()->set_name(attr);
  return a->mutable_g();
}

void add_weight(onnx::GraphProto* g, const std::string& name, std::vector<std::int64_t> dims) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  std::int64_t n = 1;
  for (auto d : dims) {
    t->add_dims(d);
    n *= d;
  }
  for (std::int64_t k = 0; k < n; ++k) t->add_float_data(0.5f);
}

onnx::ModelProto new_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  m.mutable_graph()->set_name("main");
  return m;
}

Graph graph_of(const onnx::ModelProto& m, const std::string& name) {
  auto dir = scratch_dir("control_cost_" + name);
  std::ofstream(dir / "m.onnx", std::ios::binary) << m.SerializeAsString();
  auto loaded = load_model(dir / "m.onnx");
  REQUIRE(loaded.ok());
  auto g = build_graph(*loaded, {});
  REQUIRE(g.ok());
  return *g;
}

const Node& node_of(const Graph& g, const std::string& op) {
  for (const Node& n : g.nodes)
    if (n.op_type == op) return n;
  FAIL("no " << op << " node");
  return g.nodes.front();
}

/// Loop over h = MatMul(h, W) with h [2, 4], W [4, 4] (64 MACs = 128 FLOPs an iteration), the trip
/// count a constant 3 or a graph input.
onnx::ModelProto loop_model(bool constant_trips) {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "h0", {2, 4});
  add_value(g->mutable_output(), "h", {2, 4});
  add_weight(g, "W", {4, 4});
  if (constant_trips) {
    auto* t = g->add_initializer();
    t->set_name("M");
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_int64_data(3);
  } else {
    add_value(g->mutable_input(), "M", {}, onnx::TensorProto::INT64);
  }
  auto* loop = add_node(g, "Loop", {"M", "", "h0"}, {"h"});
  auto* b = add_graph(loop, "body");
  add_value(b->mutable_input(), "i", {}, onnx::TensorProto::INT64);
  add_value(b->mutable_input(), "c", {}, onnx::TensorProto::BOOL);
  add_value(b->mutable_input(), "h_in", {2, 4});
  add_node(b, "MatMul", {"h_in", "W"}, {"h_out"});
  add_node(b, "Identity", {"c"}, {"c_out"});
  add_value(b->mutable_output(), "c_out", {}, onnx::TensorProto::BOOL);
  add_value(b->mutable_output(), "h_out", {2, 4});
  return m;
}

}  // namespace

TEST_CASE("model cost: recurrent layers count their gate products as matmul FLOPs", "[model]") {
  auto gru = load_model(model_path("tiny-gru"));
  REQUIRE(gru.ok());
  auto g = build_graph(*gru, {});
  REQUIRE(g.ok());
  const Node& n = node_of(*g, "GRU");
  // seq 4, batch 3, hidden 7, input 5: 4*3 steps of 21 rows x (5 + 7) MACs; 9 per unit and step.
  CHECK(n.cost.matmul_flops == Approx(2.0 * 4 * 3 * 21 * (5 + 7)));
  CHECK(n.cost.other_flops == Approx(4.0 * 3 * 7 * 9));
  CHECK(n.cost.known);

  auto lstm = load_model(model_path("tiny-lstm"));
  REQUIRE(lstm.ok());
  auto gl = build_graph(*lstm, {});
  REQUIRE(gl.ok());
  double macs = 0;
  for (const Node& x : gl->nodes)
    if (x.op_type == "LSTM") macs += x.cost.matmul_flops / 2;
  // Two bidirectional layers, seq 5, batch 2, hidden 8: inputs 6 then 16.
  CHECK(macs == Approx(2.0 * 5 * 2 * 32 * (6 + 8) + 2.0 * 5 * 2 * 32 * (16 + 8)));
}

TEST_CASE("model cost: a Loop costs its body times a constant trip count", "[model]") {
  const Graph known = graph_of(loop_model(true), "loop_const");
  const Node& l = node_of(known, "Loop");
  CHECK(l.cost.matmul_flops == Approx(3 * 2.0 * 2 * 4 * 4));
  CHECK(l.cost.known);

  const Graph unknown = graph_of(loop_model(false), "loop_input");
  const Node& u = node_of(unknown, "Loop");
  CHECK(u.cost.matmul_flops == Approx(2.0 * 2 * 4 * 4));  // one iteration counted
  CHECK_FALSE(u.cost.known);
}

TEST_CASE("model cost: If takes its dearer branch, Scan its body times the scan length",
          "[model]") {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "c", {}, onnx::TensorProto::BOOL);
  add_value(g->mutable_input(), "x", {2, 4});
  add_value(g->mutable_input(), "xs", {5, 1, 4});
  add_value(g->mutable_output(), "y", {2, 4});
  add_value(g->mutable_output(), "ys", {5, 1, 4});
  add_weight(g, "W", {4, 4});
  auto* n = add_node(g, "If", {"c"}, {"y"});
  auto* t = add_graph(n, "then_branch");
  add_node(t, "MatMul", {"x", "W"}, {"t_out"});
  add_value(t->mutable_output(), "t_out", {2, 4});
  auto* e = add_graph(n, "else_branch");
  add_node(e, "Add", {"x", "x"}, {"e_out"});
  add_value(e->mutable_output(), "e_out", {2, 4});
  auto* scan = add_node(g, "Scan", {"xs"}, {"ys"});
  auto* a = scan->add_attribute();
  a->set_name("num_scan_inputs");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(1);
  auto* b = add_graph(scan, "body");
  add_value(b->mutable_input(), "x_t", {1, 4});
  add_node(b, "MatMul", {"x_t", "W"}, {"y_t"});
  add_value(b->mutable_output(), "y_t", {1, 4});
  const Graph graph = graph_of(m, "if_scan");
  CHECK(node_of(graph, "If").cost.matmul_flops == Approx(2.0 * 2 * 4 * 4));
  CHECK(node_of(graph, "Scan").cost.matmul_flops == Approx(5 * 2.0 * 1 * 4 * 4));
  CHECK(node_of(graph, "Scan").cost.known);
}

TEST_CASE("model shapes: a Loop-carried value that keeps its shape keeps it past the Loop",
          "[model]") {
  // tiny-loop (gen_control_models.py): PyTorch declares the body's output as [Ify_dim_0,
  // Ify_dim_1] and ONNX drops carried shapes; the body keeps x's [2, 4], and the If after the Loop
  // then infers from its branches.
  auto m = load_model(model_path("tiny-loop"));
  REQUIRE(m.ok());
  auto g = build_graph(*m, {});
  REQUIRE(g.ok());
  const Node& loop = node_of(*g, "Loop");
  const Tensor& carried = g->tensor(loop.outputs[0]);
  REQUIRE(carried.has_shape);
  REQUIRE(carried.dims.size() == 2);
  CHECK(carried.dims[0].value == 2);
  CHECK(carried.dims[1].value == 4);
  const Tensor& y = g->tensor(node_of(*g, "If").outputs[0]);
  REQUIRE(y.has_shape);
  CHECK(y.numel() == 8);
  CHECK(g->unknown_dims.empty());
}
