// Autodiff as a graph transformation (libs/train/src/autodiff.cpp) on graphs built here: what the
// transformation refuses (a logits name that is no output, an old opset, an op without a gradient
// rule on a trainable path, named with its node), what it reports (tied weights, frozen and
// unreachable initializers, recomputed clones), and gradients it computes against central finite
// differences of the loss it computes, run through the executor and the cpu backend's hp.train ops.
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/plugin/hp_plugin.h"
#include "hp/train/autodiff.h"
#include "train_differences.h"
#include "train_graph_builder.h"

using namespace hp;

using test::attr_i;
using test::Builder;
using test::check_against_differences;
using test::tensor;

TEST_CASE("autodiff refuses a logits name that is no output, and old opsets", "[train]") {
  Builder b;
  b.input("x", {2, 3});
  b.weight("w", {3, 4});
  b.node("MatMul", {"x", "w"}, {"y"});
  b.output("y", {2, 4});
  train::GradSpec spec;
  spec.logits = "logits";
  auto r = train::build_grad_graph(b.model(), spec);
  REQUIRE_FALSE(r);
  CHECK(r.error().message().find("names no graph output (the outputs: y)") != std::string::npos);
  Builder old(11);
  old.input("x", {2, 3});
  old.weight("w", {3, 4});
  old.node("MatMul", {"x", "w"}, {"y"});
  old.output("y", {2, 4});
  spec.logits = "y";
  auto o = train::build_grad_graph(old.model(), spec);
  REQUIRE_FALSE(o);
  CHECK(o.error().message().find("opset 13") != std::string::npos);
}

TEST_CASE("an op without a gradient rule on a trainable path is named before anything runs",
          "[train]") {
  Builder b;
  b.input("x", {2, 3});
  b.weight("w", {3, 4});
  b.weight("v", {4});
  b.node("MatMul", {"x", "w"}, {"h"});
  b.node("Hardmax", {"h"}, {"hm"}, "the_hardmax");
  b.node("Add", {"hm", "v"}, {"y"});
  b.output("y", {2, 4});
  train::GradSpec spec;
  spec.logits = "y";
  spec.loss = train::LossKind::mse;
  auto r = train::build_grad_graph(b.model(), spec);
  REQUIRE_FALSE(r);
  CHECK(r.error().where().find("the_hardmax") != std::string::npos);
  CHECK(r.error().message().find("no gradient rule") != std::string::npos);
  // Frozen, w no longer makes the Hardmax trainable: only v trains.
  spec.frozen = {"w"};
  auto ok = train::build_grad_graph(b.model(), spec);
  REQUIRE(ok);
  CHECK(ok->params == std::vector<std::string>{"v"});
  CHECK(ok->untrained.at("w") == "frozen by [train].frozen");
}

TEST_CASE("tied weights accumulate and are reported; unreachable ones are not trained", "[train]") {
  Builder b;
  b.input("x", {2, 3});
  b.weight("w", {3, 3});
  b.weight("unused", {3});
  b.node("MatMul", {"x", "w"}, {"h"});
  b.node("Identity", {"w"}, {"w_alias"});
  b.node("MatMul", {"h", "w_alias"}, {"y"});
  b.node("Neg", {"unused"}, {"side"});
  b.output("y", {2, 3});
  b.output("side", {3});
  train::GradSpec spec;
  spec.logits = "y";
  spec.loss = train::LossKind::mse;
  auto r = train::build_grad_graph(b.model(), spec);
  REQUIRE(r);
  CHECK(r->params == std::vector<std::string>{"w"});
  CHECK(r->tied.at("w") == 2);
  CHECK(r->aliased == std::vector<std::string>{"w"});
  CHECK(r->untrained.count("unused") == 1);
  CHECK(r->inputs == std::vector<std::string>{"x", "labels"});
  std::mt19937 rng(3);
  check_against_differences(b, spec, {tensor({2, 3}, HP_F32, rng), tensor({2, 3}, HP_F32, rng)});
}

TEST_CASE("an MLP classifier's gradients match finite differences", "[train]") {
  Builder b;
  b.input("x", {4, 5, 6});
  b.weight("w1", {8, 6});
  b.weight("b1", {8});
  b.weight("ln_s", {8}, 1.0);
  b.weight("ln_b", {8});
  b.weight("w2", {8, 7});
  b.node("Transpose", {"w1"}, {"w1t"});
  b.node("MatMul", {"x", "w1t"}, {"h0"});
  b.node("Add", {"h0", "b1"}, {"h1"});
  auto* ln = b.node("LayerNormalization", {"h1", "ln_s", "ln_b"}, {"h2"});
  attr_i(ln, "axis", -1);
  // The exact GELU as PyTorch exports it (differentiated as one hp.train.GeluGrad).
  for (auto [name, v] :
       {std::pair<const char*, float>{"sqrt2", 1.41421356f}, {"one", 1.f}, {"half", 0.5f}})
    b.constant(name, v);
  b.node("Div", {"h2", "sqrt2"}, {"g1"});
  b.node("Erf", {"g1"}, {"g2"});
  b.node("Add", {"g2", "one"}, {"g3"});
  b.node("Mul", {"h2", "g3"}, {"g4"});
  b.node("Mul", {"g4", "half"}, {"gelu"});
  b.node("Tanh", {"gelu"}, {"h3"});
  b.node("Softmax", {"h3"}, {"h4"});
  for (auto [name, e] : {std::pair<const char*, float>{"two", 2.f}, {"three", 3.f}})
    b.constant(name, e);  // exponents as exporters write them
  b.node("Pow", {"h3", "two"}, {"h3sq"});
  b.node("Pow", {"h3sq", "three"}, {"h3p"});
  b.node("Mul", {"h4", "h3p"}, {"h5"});
  b.node("MatMul", {"h5", "w2"}, {"logits"});
  b.output("logits", {4, 5, 7});
  train::GradSpec spec;
  spec.logits = "logits";
  auto gg = train::build_grad_graph(b.model(), spec);
  REQUIRE(gg);
  int gelu_grads = 0, erfs = 0;
  for (const auto& n : gg->model.proto->graph().node()) {
    gelu_grads += n.op_type() == "GeluGrad";
    erfs += n.op_type() == "Erf";
  }
  CHECK(gelu_grads == 1);
  CHECK(erfs == 1);  // the forward's only: the backward does not differentiate the chain
  // w1 is read once in the export (its Transpose): folding it into a Gemm is no tie.
  CHECK(gg->tied.empty());
  std::mt19937 rng(5);
  auto labels = tensor({4, 5}, HP_I64, rng, 7);
  labels.as<std::int64_t>()[3] = -100;  // ignored position
  check_against_differences(b, spec, {tensor({4, 5, 6}, HP_F32, rng), labels});
}

TEST_CASE("embeddings, slices, concat and reductions have gradients", "[train]") {
  Builder b;
  b.input("ids", {2, 5}, onnx::TensorProto::INT64);
  b.weight("emb", {11, 6});
  b.weight("scale", {1, 1, 3});
  b.ints("starts", {0});
  b.ints("ends", {3});
  b.ints("ax", {2});
  b.ints("red", {1});
  b.node("Gather", {"emb", "ids"}, {"e"});
  b.node("Slice", {"e", "starts", "ends", "ax"}, {"s"});
  b.node("Mul", {"s", "scale"}, {"sm"});
  auto* cat = b.node("Concat", {"sm", "e"}, {"c"});
  attr_i(cat, "axis", 2);
  auto* mean = b.node("ReduceMean", {"c", "red"}, {"m"});  // opset 18 form
  attr_i(mean, "keepdims", 0);
  b.node("Sigmoid", {"m"}, {"y"});
  b.output("y", {2, 9});
  b.m.mutable_opset_import(0)->set_version(18);
  train::GradSpec spec;
  spec.logits = "y";
  spec.loss = train::LossKind::mse;
  std::mt19937 rng(9);
  auto ids = tensor({2, 5}, HP_I64, rng, 11);
  ids.as<std::int64_t>()[1] = ids.as<std::int64_t>()[0];  // a repeated id adds up
  check_against_differences(b, spec, {ids, tensor({2, 9}, HP_F32, rng)});
}

TEST_CASE("recomputed blocks clone their forward and give the same gradients", "[train]") {
  // Two identical blocks (found by layer discovery) between an input and the loss.
  Builder b;
  b.input("x", {3, 4});
  std::string h = "x";
  for (int k = 0; k < 2; ++k) {
    const std::string p = "layers." + std::to_string(k) + ".";
    b.weight(p + "w", {4, 4});
    b.weight(p + "b", {4});
    b.node("MatMul", {h, p + "w"}, {p + "mm"}, p + "mm");
    b.node("Add", {p + "mm", p + "b"}, {p + "add"}, p + "add");
    b.node("Tanh", {p + "add"}, {p + "act"}, p + "tanh");
    // A seeded training-mode Dropout draws the same mask every run, so differences stay valid;
    // its recomputed clone must apply the forward's mask.
    auto* d = b.node("Dropout", {p + "act", "ratio", "training"}, {p + "out"}, p + "drop");
    attr_i(d, "seed", 5 + k);
    h = p + "out";
  }
  {
    auto* r = b.g().add_initializer();
    r->set_name("ratio");
    r->set_data_type(onnx::TensorProto::FLOAT);
    r->add_float_data(0.25f);
    auto* t = b.g().add_initializer();
    t->set_name("training");
    t->set_data_type(onnx::TensorProto::BOOL);
    t->add_int32_data(1);
  }
  b.node("Identity", {h}, {"y"});
  b.output("y", {3, 4});
  train::GradSpec spec;
  spec.logits = "y";
  spec.loss = train::LossKind::mse;
  spec.recompute_blocks = {0, 1};
  auto r = train::build_grad_graph(b.model(), spec);
  REQUIRE(r);
  CHECK(r->recomputed_nodes > 0);
  int dropouts = 0;  // recomputation never draws a mask again
  for (const auto& n : r->model.proto->graph().node()) dropouts += n.op_type() == "Dropout";
  CHECK(dropouts == 2);
  std::mt19937 rng(4);
  check_against_differences(b, spec, {tensor({3, 4}, HP_F32, rng), tensor({3, 4}, HP_F32, rng)});
}

TEST_CASE("two parameters sharing one gradient tensor each get their own output", "[train]") {
  Builder b;
  b.input("x", {2, 3});
  b.weight("p", {2, 3});
  b.weight("q", {2, 3});
  b.node("Add", {"p", "q"}, {"pq"});
  b.node("Mul", {"x", "pq"}, {"y"});
  b.output("y", {2, 3});
  train::GradSpec spec;
  spec.logits = "y";
  spec.loss = train::LossKind::mse;
  std::mt19937 rng(8);
  check_against_differences(b, spec, {tensor({2, 3}, HP_F32, rng), tensor({2, 3}, HP_F32, rng)});
}

TEST_CASE("shapes the backward needs are taken in the forward, so their tensors die there",
          "[train]") {
  // A Reshape's gradient reshapes back to its input's shape. Read at backward time, that Shape node
  // would keep the whole forward tensor alive until then; autodiff moves it into the forward, just
  // after the tensor's producer.
  Builder b;
  b.input("x", {4, 8});
  b.weight("w1", {8, 16});
  b.weight("w2", {16, 2});
  b.ints("to3", {4, 4, 4});
  b.ints("to2", {4, 16});
  b.node("MatMul", {"x", "w1"}, {"h"});
  b.node("Reshape", {"h", "to3"}, {"r"});
  b.node("Relu", {"r"}, {"a"});
  b.node("Reshape", {"a", "to2"}, {"f"});
  b.node("MatMul", {"f", "w2"}, {"y"});
  b.output("y", {4, 2});
  train::GradSpec spec;
  spec.logits = "y";
  spec.loss = train::LossKind::mse;
  auto gg = train::build_grad_graph(b.model(), spec);
  INFO((gg ? std::string() : gg.error().str()));
  REQUIRE(gg);
  const auto& g = gg->model.proto->graph();
  std::map<std::string, int> producer;
  for (int k = 0; k < g.node_size(); ++k)
    for (const auto& o : g.node(k).output()) producer[o] = k;
  int shapes = 0;
  for (int k = 0; k < g.node_size(); ++k) {
    const auto& n = g.node(k);
    if (n.op_type() != "Shape") continue;
    auto it = producer.find(n.input(0));
    if (it == producer.end() || it->second >= gg->forward_nodes) continue;
    ++shapes;
    INFO("Shape of '" << n.input(0) << "' at node " << k << ", its producer at " << it->second
                      << ", forward part ends at " << gg->forward_nodes);
    CHECK(k < gg->forward_nodes);
    CHECK(k == it->second + 1);
  }
  CHECK(shapes >= 2);  // h and a: the two Reshapes' inputs
  std::mt19937 rng(5);
  check_against_differences(b, spec, {tensor({4, 8}, HP_F32, rng), tensor({4, 2}, HP_F32, rng)});
}

namespace {

// x -> MatMul(w) -> nn.LayerNorm(6) as PyTorch exports it below opset 17 -> y; with `var_read`
// the variance also feeds a second output, so the chain is not one op any more.
Builder primitive_layer_norm(bool var_read) {
  Builder b;
  b.input("x", {3, 4, 5});
  b.weight("w", {5, 6});
  b.weight("gamma", {6}, 1.0);
  b.weight("beta", {6});
  for (auto [name, v] : {std::pair<const char*, float>{"two", 2.f}, {"eps", 1e-5f}})
    b.constant(name, v);
  b.node("MatMul", {"x", "w"}, {"h"});
  auto axes = [](onnx::NodeProto* n) {
    auto* a = n->add_attribute();
    a->set_name("axes");
    a->set_type(onnx::AttributeProto::INTS);
    a->add_ints(-1);
  };
  axes(b.node("ReduceMean", {"h"}, {"mean"}));
  b.node("Sub", {"h", "mean"}, {"d"});
  b.node("Pow", {"d", "two"}, {"p"});
  axes(b.node("ReduceMean", {"p"}, {"var"}));
  b.node("Add", {"var", "eps"}, {"ve"});
  b.node("Sqrt", {"ve"}, {"s"});
  b.node("Div", {"d", "s"}, {"n"});
  b.node("Mul", {"n", "gamma"}, {"scaled"});
  b.node("Add", {"scaled", "beta"}, {var_read ? "ln" : "y"});
  if (var_read) b.node("Mul", {"ln", "var"}, {"y"});
  b.output("y", {3, 4, 6});
  return b;
}

int count_op(const train::GradGraph& gg, const std::string& op) {
  int n = 0;
  for (const auto& node : gg.model.proto->graph().node()) n += node.op_type() == op;
  return n;
}

}  // namespace

TEST_CASE("a layer norm exported as primitives is differentiated as one LayerNormGrad", "[train]") {
  Builder b = primitive_layer_norm(false);
  auto gg = train::build_grad_graph(b.model(), test::mse_on_y());
  REQUIRE(gg);
  CHECK(count_op(*gg, "LayerNormGrad") == 1);
  CHECK(count_op(*gg, "Sqrt") == 1);  // the forward's: the chain is not differentiated node by node
  CHECK(gg->params == std::vector<std::string>{"w", "gamma", "beta"});
  test::check_float64(b, test::scratch_dir("hp_autodiff_test"), "primitive_layer_norm");
  // A chain whose variance someone else reads is differentiated node by node, as exported.
  Builder seen = primitive_layer_norm(true);
  auto sg = train::build_grad_graph(seen.model(), test::mse_on_y());
  REQUIRE(sg);
  CHECK(count_op(*sg, "LayerNormGrad") == 0);
  test::check_float64(seen, test::scratch_dir("hp_autodiff_test"), "primitive_layer_norm_seen");
}
