// Layer discovery on hand-built graphs (side inputs used by every layer, no repetition at all) and
// on where the exported models' embeddings, rotary tables and heads end up.
#include <onnx/onnx_pb.h>

#include <catch2/catch.hpp>

#include "hp/model/layers.h"
#include "hp/model/summary.h"
#include "model_test_util.h"

using namespace hp;
using namespace hp::model;
using namespace hp::model::test;

namespace {

struct Builder {
  onnx::ModelProto m;
  onnx::GraphProto* g;
  int serial = 0;
  Builder() : g(m.mutable_graph()) {
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
  }
  void input(const std::string& name, std::int64_t width) {
    auto* v = g->add_input();
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    tt->mutable_shape()->add_dim()->set_dim_param("batch");
    tt->mutable_shape()->add_dim()->set_dim_value(width);
  }
  std::string weight(std::int64_t rows, std::int64_t cols) {
    auto* t = g->add_initializer();
    t->set_name("");  // anonymous on purpose
    t->set_name("w" + std::to_string(serial++));
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_dims(rows);
    t->add_dims(cols);
    for (std::int64_t i = 0; i < rows * cols; ++i) t->add_float_data(0.1f);
    return t->name();
  }
  std::string node(const std::string& op, std::vector<std::string> ins,
                   const std::string& name = "") {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (auto& i : ins) n->add_input(i);
    std::string out = "t" + std::to_string(serial++);
    n->add_output(out);
    return out;
  }
  void output(const std::string& name) {
    auto* v = g->add_output();
    v->set_name(name);
    v->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  }
  ModelSummary summarize(const std::string& file) {
    auto dir = scratch_dir("model_layers");
    write_bytes(dir / file, m.SerializeAsString());
    auto s = summarize_model({dir / file, {{"batch", 4}}, false});
    INFO((s.ok() ? std::string() : s.error().str()));
    REQUIRE(s.ok());
    return std::move(*s);
  }
};

}  // namespace

TEST_CASE("layers: a mask derived from a side input and read by every layer does not hide the cuts",
          "[model]") {
  Builder b;
  b.input("x", 8);
  b.input("mask", 8);
  std::string x = b.node("Relu", {"x"});
  std::string bias = b.node("Mul", {"mask", "mask"});  // an activation every layer reads
  for (int i = 0; i < 4; ++i) {
    std::string y = b.node("MatMul", {x, b.weight(8, 8)});
    y = b.node("Add", {y, bias});
    x = b.node("Add", {x, b.node("Tanh", {y})});
  }
  b.output(b.node("MatMul", {x, b.weight(8, 2)}));
  ModelSummary s = b.summarize("side-input.onnx");
  REQUIRE(s.layering.blocks.size() == 4);
  for (const auto& blk : s.layering.blocks) CHECK(blk.parameters == 64);
  CHECK(s.layering.epilogue.parameters == 16);
  CHECK(s.layering.blocks[0].matmul_flops == 2 * 4 * 8 * 8);
}

TEST_CASE("layers: a graph without repetition is all prologue", "[model]") {
  Builder b;
  b.input("x", 8);
  std::string y = b.node("MatMul", {"x", b.weight(8, 16)});
  y = b.node("Relu", {y});
  b.output(b.node("MatMul", {y, b.weight(16, 2)}));
  ModelSummary s = b.summarize("plain.onnx");
  CHECK(s.layering.blocks.empty());
  CHECK(s.layering.method == "none");
  CHECK(s.layering.prologue.nodes.size() == 3);
  CHECK(s.layering.cuts.empty());
  CHECK(s.parameters == 8 * 16 + 16 * 2);
}

TEST_CASE("layers: layers of different shapes are grouped by their names", "[model]") {
  Builder b;
  b.input("x", 8);
  std::string x = "x";
  const std::int64_t widths[] = {8, 16, 32, 8};
  for (int i = 0; i < 3; ++i) {
    std::string p = "/layers." + std::to_string(i) + "/";
    x = b.node("MatMul", {x, b.weight(widths[i], widths[i + 1])}, p + "MatMul");
    x = b.node("Relu", {x}, p + "Relu");
  }
  b.output(b.node("MatMul", {x, b.weight(8, 2)}, "/head/MatMul"));
  ModelSummary s = b.summarize("named.onnx");
  CHECK(s.layering.method == "names");
  REQUIRE(s.layering.blocks.size() == 3);
  CHECK(s.layering.blocks[1].name == "layers.1");
  CHECK(s.layering.blocks[1].parameters == 16 * 32);
  CHECK(s.layering.epilogue.parameters == 16);
  CHECK(s.layering.cuts.size() ==
        3);  // no prologue: layers.0|layers.1, layers.1|layers.2, layers.2|epilogue
}

TEST_CASE("layers: embeddings, rotary tables and heads sit outside the blocks", "[model]") {
  auto j = sidecar("tiny-llama");
  auto s = summarize_model({model_path("tiny-llama"), sidecar_dims(j), false});
  REQUIRE(s.ok());
  auto has_op = [&](const Block& blk, const std::string& op) {
    for (int n : blk.nodes)
      if (s->graph.node(n).op_type == op) return true;
    return false;
  };
  const auto& l = s->layering;
  CHECK(has_op(l.prologue, "Gather"));  // token embedding
  CHECK(has_op(l.prologue, "Sin"));     // rotary table, shared by all layers
  CHECK(has_op(l.prologue, "Cos"));
  for (const auto& blk : l.blocks) {
    CHECK_FALSE(has_op(blk, "Sin"));
    CHECK(has_op(blk, "Softmax"));
  }
  CHECK(has_op(l.epilogue, "MatMul"));  // lm head
  const std::int64_t vocab = j["config"]["vocab"], hidden = j["config"]["hidden"];
  CHECK(l.prologue.parameters == vocab * hidden);
  CHECK(l.epilogue.parameters == vocab * hidden + hidden);  // head + final norm
}

TEST_CASE("layers: the ViT patch embedding is prologue, the classifier epilogue", "[model]") {
  auto s = summarize_model({model_path("tiny-vit"), sidecar_dims(sidecar("tiny-vit")), false});
  REQUIRE(s.ok());
  bool conv_in_prologue = false;
  for (int n : s->layering.prologue.nodes)
    conv_in_prologue = conv_in_prologue || s->graph.node(n).op_type == "Conv";
  CHECK(conv_in_prologue);
  CHECK(s->layering.prologue.matmul_flops > 0);
  CHECK(s->layering.epilogue.matmul_flops > 0);
}
