// Gradients through control flow (libs/train/src/control_grad.cpp): If on either branch, Loop with
// carried values, scan outputs, an early exit, no iteration at all, and an If nested in a Loop's
// body, each reading trainable tensors from the outer graph, and Scan in both directions along
// two axes (rewritten as a Loop); checked against float64 central
// differences of the loss (train::check_gradients). A random op inside a subgraph on the trainable
// path is refused before anything runs.
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include "train_differences.h"

using namespace hp;
using onnx::TensorProto;
using test::Builder;

namespace {

void check(Builder& b, const std::string& name) {
  test::check_float64(b, test::scratch_dir("hp_control_grad_test"), name);
}

void scalar(Builder& b, const std::string& name, int type, std::int64_t v) {
  auto* t = b.g().add_initializer();
  t->set_name(name);
  t->set_data_type(type);
  if (type == TensorProto::BOOL)
    t->add_int32_data(static_cast<std::int32_t>(v));
  else
    t->add_int64_data(v);
}

/// A subgraph under construction.
struct Sub {
  onnx::GraphProto g;
  explicit Sub(const std::string& name) { g.set_name(name); }
  void input(const std::string& name, int type, std::vector<std::int64_t> dims = {}) {
    Builder::value(g.add_input(), name, dims, type);
  }
  void output(const std::string& name, int type, std::vector<std::int64_t> dims = {}) {
    Builder::value(g.add_output(), name, dims, type);
  }
  onnx::NodeProto* node(const std::string& op, std::vector<std::string> ins,
                        std::vector<std::string> outs) {
    auto* n = g.add_node();
    n->set_op_type(op);
    n->set_name(outs[0] + "_node");
    for (auto& i : ins) n->add_input(i);
    for (auto& o : outs) n->add_output(o);
    return n;
  }
};

void attr_graph(onnx::NodeProto* n, const std::string& name, const onnx::GraphProto& g) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::GRAPH);
  *a->mutable_g() = g;
}

/// x [2,3] -> h = tanh(x W0) outside; If(cond): then y0 = h W1 * w2, else y0 = h W1 + h.
void write_if(Builder& b, bool cond) {
  b.input("x", {2, 3});
  b.output("y", {2, 3});
  b.weight("W0", {3, 3});
  b.weight("W1", {3, 3});
  b.weight("w2", {3});
  scalar(b, "cond", TensorProto::BOOL, cond ? 1 : 0);
  b.node("MatMul", {"x", "W0"}, {"xw"});
  b.node("Tanh", {"xw"}, {"h"});
  Sub then_b("then"), else_b("else");
  then_b.node("MatMul", {"h", "W1"}, {"t1"});
  then_b.node("Mul", {"t1", "w2"}, {"t2"});
  then_b.output("t2", TensorProto::FLOAT, {2, 3});
  else_b.node("MatMul", {"h", "W1"}, {"e1"});
  else_b.node("Add", {"e1", "h"}, {"e2"});
  else_b.output("e2", TensorProto::FLOAT, {2, 3});
  auto* n = b.node("If", {"cond"}, {"y0"});
  attr_graph(n, "then_branch", then_b.g);
  attr_graph(n, "else_branch", else_b.g);
  b.node("Sigmoid", {"y0"}, {"y"});
}

/// The Loop body: h' = tanh(h W1) + h carried, s = h' * w2 scanned; with `early_exit` the
/// condition turns false after iteration 1, with `nested` an If on the iteration's parity picks
/// tanh(h W1) or h W1 * w2.
Sub loop_body(bool early_exit, bool nested) {
  Sub body("body");
  body.input("iter", TensorProto::INT64);
  body.input("cond_in", TensorProto::BOOL);
  body.input("h_in", TensorProto::FLOAT, {2, 3});
  body.node("MatMul", {"h_in", "W1"}, {"hw"});
  if (nested) {
    Sub even("even"), odd("odd");
    even.node("Tanh", {"hw"}, {"ev"});
    even.output("ev", TensorProto::FLOAT, {2, 3});
    odd.node("Mul", {"hw", "w2"}, {"od"});
    odd.output("od", TensorProto::FLOAT, {2, 3});
    body.node("Mod", {"iter", "two"}, {"parity"});
    body.node("Equal", {"parity", "zero"}, {"is_even"});
    auto* n = body.node("If", {"is_even"}, {"act"});
    attr_graph(n, "then_branch", even.g);
    attr_graph(n, "else_branch", odd.g);
  } else {
    body.node("Tanh", {"hw"}, {"act"});
  }
  body.node("Add", {"act", "h_in"}, {"h_out"});
  body.node("Mul", {"h_out", "w2"}, {"s"});
  if (early_exit)
    body.node("Less", {"iter", "one"}, {"cond_out"});
  else
    body.node("Identity", {"cond_in"}, {"cond_out"});
  body.output("cond_out", TensorProto::BOOL);
  body.output("h_out", TensorProto::FLOAT, {2, 3});
  body.output("s", TensorProto::FLOAT, {2, 3});
  return body;
}

/// x [2,3] -> h0 = x W0; Loop(trips) carrying h with the scan of s; y = h_final + sum of s.
void write_loop(Builder& b, std::int64_t trips, bool early_exit = false, bool nested = false) {
  b.input("x", {2, 3});
  b.output("y", {2, 3});
  b.weight("W0", {3, 3});
  b.weight("W1", {3, 3}, 0.4);
  b.weight("w2", {3});
  scalar(b, "trips", TensorProto::INT64, trips);
  scalar(b, "true", TensorProto::BOOL, 1);
  scalar(b, "one", TensorProto::INT64, 1);
  scalar(b, "two", TensorProto::INT64, 2);
  scalar(b, "zero", TensorProto::INT64, 0);
  b.ints("axis0", {0});
  b.node("MatMul", {"x", "W0"}, {"h0"});
  auto* n = b.node("Loop", {early_exit ? "" : "trips", "true", "h0"}, {"h_final", "scan"});
  attr_graph(n, "body", loop_body(early_exit, nested).g);
  b.node("ReduceSum", {"scan", "axis0"}, {"scan_sum"});
  test::attr_i(b.g().mutable_node(b.g().node_size() - 1), "keepdims", 0);
  b.node("Add", {"h_final", "scan_sum"}, {"y0"});
  b.node("Tanh", {"y0"}, {"y"});
}

/// x [2,3] -> h0 = x W0; xs [4,2,3] (or [2,4,3] with `axis` 1); Scan carrying h with
/// h' = tanh(h W1 + x_t) and scanning s = h' * w2; y = h_final + sum of s.
/// `reverse_in`/`reverse_out` set the directions.
void write_scan(Builder& b, std::int64_t axis, bool reverse_in, bool reverse_out) {
  b.input("x", {2, 3});
  b.input("xs",
          axis == 0 ? std::vector<std::int64_t>{4, 2, 3} : std::vector<std::int64_t>{2, 4, 3});
  b.output("y", {2, 3});
  b.weight("W0", {3, 3});
  b.weight("W1", {3, 3}, 0.4);
  b.weight("w2", {3});
  b.ints("axis0", {0});
  b.node("MatMul", {"x", "W0"}, {"h0"});
  Sub body("scan_body");
  body.input("h_in", TensorProto::FLOAT, {2, 3});
  body.input("x_t", TensorProto::FLOAT, {2, 3});
  body.node("MatMul", {"h_in", "W1"}, {"hw"});
  body.node("Add", {"hw", "x_t"}, {"pre"});
  body.node("Tanh", {"pre"}, {"h_out"});
  body.node("Mul", {"h_out", "w2"}, {"s"});
  body.output("h_out", TensorProto::FLOAT, {2, 3});
  body.output("s", TensorProto::FLOAT, {2, 3});
  auto* n = b.node("Scan", {"h0", "xs"}, {"h_final", "scan"});
  attr_graph(n, "body", body.g);
  test::attr_i(n, "num_scan_inputs", 1);
  test::attr_ints(n, "scan_input_axes", {axis});
  test::attr_ints(n, "scan_input_directions", {reverse_in ? 1 : 0});
  test::attr_ints(n, "scan_output_directions", {reverse_out ? 1 : 0});
  b.node("ReduceSum", {"scan", "axis0"}, {"scan_sum"});
  test::attr_i(b.g().mutable_node(b.g().node_size() - 1), "keepdims", 0);
  // The first stacked slice counts twice: an output stacked in the wrong order would show.
  scalar(b, "first", TensorProto::INT64, 0);
  b.node("Gather", {"scan", "first"}, {"scan_first"});
  b.node("Add", {"h_final", "scan_sum"}, {"y0"});
  b.node("Add", {"y0", "scan_first"}, {"y1"});
  b.node("Tanh", {"y1"}, {"y"});
}

}  // namespace

TEST_CASE("Scan's gradient (as the Loop computing the same) matches float64 differences",
          "[train]") {
  for (std::int64_t axis : {0, 1})
    for (bool reverse_in : {false, true})
      for (bool reverse_out : {false, true}) {
        Builder b;
        write_scan(b, axis, reverse_in, reverse_out);
        check(b, "scan_a" + std::to_string(axis) + (reverse_in ? "_ri" : "") +
                     (reverse_out ? "_ro" : ""));
      }
}

TEST_CASE("the Loop a Scan becomes computes the Scan's loss", "[train]") {
  // The gradient check differentiates the rewritten graph, so the rewrite's forward is compared
  // with the executor's own Scan here.
  auto be = exec::open_backends("cpu", 1, {});
  REQUIRE(be);
  for (std::int64_t axis : {0, 1})
    for (bool reverse_in : {false, true})
      for (bool reverse_out : {false, true}) {
        INFO("axis " << axis << ", reversed input " << reverse_in << ", output " << reverse_out);
        Builder b;
        write_scan(b, axis, reverse_in, reverse_out);
        std::mt19937 rng(5);
        const std::vector<exec::HostTensor> data = {
            test::tensor({2, 3}, HP_F32, rng),
            test::tensor(
                axis == 0 ? std::vector<std::int64_t>{4, 2, 3} : std::vector<std::int64_t>{2, 4, 3},
                HP_F32, rng)};
        const exec::HostTensor target = test::tensor({2, 3}, HP_F32, rng);
        auto fwd = exec::Executor::create(b.model(), {be->primary, be->cpu, nullptr});
        REQUIRE(fwd);
        auto y = (*fwd)->run(data);
        REQUIRE(y);
        double want = 0;
        for (int k = 0; k < 6; ++k) {
          const double d = double((*y)[0].as<float>()[k]) - target.as<float>()[k];
          want += d * d / 6;
        }
        auto gg = train::build_grad_graph(b.model(), test::mse_on_y());
        REQUIRE(gg);
        auto ex = exec::Executor::create(gg->model, {be->primary, be->cpu, nullptr});
        REQUIRE(ex);
        std::vector<exec::HostTensor> in = data;
        in.push_back(target);
        auto got = (*ex)->run(in);
        REQUIRE(got);
        CHECK((*got)[0].as<float>()[0] == Approx(want).epsilon(1e-5));
      }
}

TEST_CASE("If's gradient matches float64 differences on either branch", "[train]") {
  for (bool cond : {true, false}) {
    Builder b;
    write_if(b, cond);
    check(b, cond ? "if_then" : "if_else");
  }
}

TEST_CASE("Loop's gradient matches float64 differences", "[train]") {
  SECTION("carried value, scan output and outer weights over three iterations") {
    Builder b;
    write_loop(b, 3);
    check(b, "loop3");
  }
  SECTION("a condition that ends the loop after two iterations") {
    Builder b;
    write_loop(b, 0, true);
    check(b, "loop_exit");
  }
  SECTION("an If nested in the body") {
    Builder b;
    write_loop(b, 4, false, true);
    check(b, "loop_nested");
  }
  SECTION("no iteration: the initial value passes through") {
    Builder b;
    write_loop(b, 0);
    check(b, "loop0");
  }
}

TEST_CASE("the gradient model of a Loop stacks its carried values once", "[train]") {
  Builder b;
  write_loop(b, 3);
  auto r = train::build_grad_graph(b.model(), test::mse_on_y());
  INFO((r ? "" : r.error().str()));
  REQUIRE(r);
  int loops = 0;
  for (const auto& n : r->model.proto->graph().node())
    if (n.op_type() == "Loop") {
      ++loops;
      if (loops == 1) CHECK(n.output_size() == 2 + 2);  // + the iterations and h's stack
    }
  CHECK(loops == 2);  // the forward and the backward
  CHECK(r->params == std::vector<std::string>{"W0", "W1", "w2"});
}

TEST_CASE("a random op inside a subgraph on the trainable path is refused", "[train]") {
  Builder b;
  write_if(b, true);
  for (auto& n : *b.g().mutable_node())
    if (n.op_type() == "If") {
      auto* g = n.mutable_attribute(0)->mutable_g();
      auto* d = g->add_node();
      d->set_op_type("Dropout");
      d->set_name("branch_dropout");
      d->add_input("t2");
      d->add_output("t3");
      g->mutable_output(0)->set_name("t3");
    }
  auto r = train::build_grad_graph(b.model(), test::mse_on_y());
  REQUIRE(!r);
  CHECK(r.error().code == Errc::bad_input);
  CHECK(r.error().where().find("If") != std::string::npos);
  CHECK(r.error().message().find("Dropout 'branch_dropout'") != std::string::npos);
}

TEST_CASE("a sequence on the trainable path is refused, not left untrained", "[train]") {
  // PyTorch exports a list appended to in a scripted loop as a sequence: the weights before it
  // must not pass for "no path to the loss".
  Builder b;
  b.input("x", {2, 3});
  b.output("y", {2, 3});
  b.weight("W0", {3, 3});
  b.node("MatMul", {"x", "W0"}, {"h"});
  b.node("SplitToSequence", {"h"}, {"seq"});
  test::attr_i(b.node("ConcatFromSequence", {"seq"}, {"y"}), "axis", 0);
  auto r = train::build_grad_graph(b.model(), test::mse_on_y());
  REQUIRE(!r);
  CHECK(r.error().where().find("ConcatFromSequence") != std::string::npos);
  CHECK(r.error().message().find("no gradient rule") != std::string::npos);
}

TEST_CASE("a Scan stacking an output along another axis is refused naming it", "[train]") {
  Builder b;
  write_scan(b, 0, false, false);
  for (auto& n : *b.g().mutable_node())
    if (n.op_type() == "Scan") test::attr_ints(&n, "scan_output_axes", {1});
  auto r = train::build_grad_graph(b.model(), test::mse_on_y());
  REQUIRE(!r);
  CHECK(r.error().code == Errc::bad_input);
  CHECK(r.error().where().find("Scan") != std::string::npos);
  CHECK(r.error().message().find("axis other than 0") != std::string::npos);
}
