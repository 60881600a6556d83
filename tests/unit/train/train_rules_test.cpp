// Gradient rules beyond the transformer core (libs/train/src/rules_activation.cpp,
// rules_reduce.cpp, rules_nn.cpp): each op PyTorch exports for activations, trigonometric and
// hyperbolic functions, reductions, global pooling, instance normalization, depth/space
// rearrangement and transposed convolution, differentiated inside a small graph with trainable
// tensors before it, and checked against central differences of the loss in float64
// (train::check_gradients) or, for ConvTranspose (float32 only on the cpu backend) and Mish, in
// float32.
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <functional>
#include <random>

#include "train_differences.h"

using namespace hp;
using test::attr_f;
using test::attr_i;
using test::attr_ints;
using test::attr_s;
using test::Builder;

namespace {

/// A rank-0 int64 initializer (CumSum's axis, Trilu's k).
void scalar_i64(Builder& b, const std::string& name, std::int64_t v) {
  auto* t = b.g().add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_int64_data(v);
}

void check(Builder& b, const std::string& name) {
  test::check_float64(b, test::scratch_dir("hp_rules_test"), name);
}

/// `b`'s gradients against float32 central differences, on random inputs x and targets.
void check_f32(Builder& b, std::vector<std::int64_t> x, std::vector<std::int64_t> y, int seed) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  test::check_against_differences(
      b, test::mse_on_y(),
      {test::tensor(std::move(x), HP_F32, rng), test::tensor(std::move(y), HP_F32, rng)});
}

struct Pointwise {
  std::string op;
  /// Maps h (any real) into the op's domain: "" none, "unit" into (-0.9, 0.9), "above1" into
  /// [1.5, inf).
  std::string domain;
  std::function<void(Builder&, onnx::NodeProto*)> setup = [](Builder&, onnx::NodeProto*) {};
};

}  // namespace

TEST_CASE("pointwise ops' gradients match float64 differences", "[train]") {
  const std::vector<Pointwise> cases = {
      {"Tan", "unit"},
      {"Asin", "unit"},
      {"Acos", "unit"},
      {"Atan", ""},
      {"Sinh", ""},
      {"Cosh", ""},
      {"Asinh", ""},
      {"Acosh", "above1"},
      {"Atanh", "unit"},
      {"Elu", "", [](Builder&, onnx::NodeProto* n) { attr_f(n, "alpha", 0.7f); }},
      {"Celu", "", [](Builder&, onnx::NodeProto* n) { attr_f(n, "alpha", 1.3f); }},
      {"Selu", ""},
      // PyTorch's nn.Hardsigmoid as exported: alpha 1/6.
      {"HardSigmoid", "", [](Builder&, onnx::NodeProto* n) { attr_f(n, "alpha", 1.f / 6); }},
      {"HardSigmoid", ""},  // ONNX's default slope 0.2: some inputs on each flat part
      {"HardSwish", ""},
      {"Softsign", ""},
      {"ThresholdedRelu", "", [](Builder&, onnx::NodeProto* n) { attr_f(n, "alpha", 0.2f); }},
      {"Shrink", "",
       [](Builder&, onnx::NodeProto* n) {
         attr_f(n, "lambd", 0.3f);
         attr_f(n, "bias", 0.1f);
       }},
      {"PRelu", "",
       [](Builder& b, onnx::NodeProto* n) {
         b.weight("slope", {5}, 0.3);
         n->add_input("slope");
       }},
      {"Mean", "",
       [](Builder& b, onnx::NodeProto* n) {
         b.weight("other", {5});
         n->add_input("other");
       }},
      {"CastLike", "", [](Builder&, onnx::NodeProto* n) { n->add_input("p"); }},
      {"CumSum", "",
       [](Builder& b, onnx::NodeProto* n) {
         scalar_i64(b, "axis", 1);
         n->add_input("axis");
       }},
      {"CumSum", "",
       [](Builder& b, onnx::NodeProto* n) {
         scalar_i64(b, "axis", -1);
         n->add_input("axis");
         attr_i(n, "reverse", 1);
         attr_i(n, "exclusive", 1);
       }},
      {"Trilu", "",
       [](Builder& b, onnx::NodeProto* n) {
         scalar_i64(b, "k", 1);
         n->add_input("k");
         attr_i(n, "upper", 0);
       }},
  };
  int index = 0;
  for (const auto& pc : cases) {
    Builder b;
    b.input("x", {3, 4});
    b.weight("W", {4, 5});
    b.weight("V", {5, 2});
    b.node("MatMul", {"x", "W"}, {"h"});
    if (pc.domain == "unit") {
      b.node("Tanh", {"h"}, {"t"});
      b.weight("shrink", {1});
      b.g().mutable_initializer(b.g().initializer_size() - 1)->set_float_data(0, 0.9f);
      b.node("Mul", {"t", "shrink"}, {"p"});
    } else if (pc.domain == "above1") {
      b.node("Mul", {"h", "h"}, {"h2"});
      b.weight("lift", {1});
      b.g().mutable_initializer(b.g().initializer_size() - 1)->set_float_data(0, 1.5f);
      b.node("Add", {"h2", "lift"}, {"p"});
    } else {
      b.node("Identity", {"h"}, {"p"});
    }
    auto* n = b.node(pc.op, {"p"}, {"q"});
    pc.setup(b, n);
    b.node("MatMul", {"q", "V"}, {"y"});
    b.output("y", {3, 2});
    check(b, pc.op + "_" + std::to_string(index++));
  }
}

TEST_CASE("reductions' gradients match float64 differences, axes as attribute and input",
          "[train]") {
  const char* const ops[] = {"ReduceSum",       "ReduceMean", "ReduceSumSquare",
                             "ReduceL1",        "ReduceL2",   "ReduceLogSum",
                             "ReduceLogSumExp", "ReduceMax",  "ReduceMin"};
  for (const char* op : ops)
    for (int opset : {17, 18})
      for (int keep : {0, 1})
        for (std::int64_t axis : {1, -1}) {
          Builder b(opset);
          b.input("x", {2, 3, 4});
          b.weight("W", {4, 4});
          b.weight("V", {axis == 1 ? 4 : 3, 2});
          b.node("MatMul", {"x", "W"}, {"h"});
          // ReduceLogSum needs positive inputs; ReduceMax over ReLU outputs meets ties at zero.
          const std::string pre = std::string(op) == "ReduceLogSum" ? "Softplus"
                                  : std::string(op) == "ReduceMax"  ? "Relu"
                                                                    : "Identity";
          b.node(pre, {"h"}, {"p"});
          onnx::NodeProto* n = nullptr;
          const bool as_input = std::string(op) == "ReduceSum" ? opset >= 13 : opset >= 18;
          if (as_input) {
            b.ints("axes", {axis});
            n = b.node(op, {"p", "axes"}, {"r"});
          } else {
            n = b.node(op, {"p"}, {"r"});
            attr_ints(n, "axes", {axis});
          }
          attr_i(n, "keepdims", keep);
          attr_i(b.node("Flatten", {"r"}, {"f"}), "axis", 1);
          b.node("MatMul", {"f", "V"}, {"y"});
          b.output("y", {2, 2});
          INFO(op << " opset " << opset << " keepdims " << keep << " axis " << axis);
          check(b, std::string(op) + std::to_string(opset) + std::to_string(keep) +
                       std::to_string(axis + 1));
        }
}

TEST_CASE("spatial ops' gradients match float64 differences", "[train]") {
  struct Spatial {
    std::string op;
    std::int64_t flat;  // elements per sample of the op's output
    std::function<void(Builder&, onnx::NodeProto*)> setup = [](Builder&, onnx::NodeProto*) {};
    std::string pre = "Identity";
  };
  const std::vector<Spatial> cases = {
      {"GlobalMaxPool", 4},
      {"GlobalMaxPool", 4, [](Builder&, onnx::NodeProto*) {}, "Relu"},
      {"InstanceNormalization", 64,
       [](Builder& b, onnx::NodeProto* n) {
         b.weight("gamma", {4}, 0.5);
         b.weight("beta", {4}, 0.5);
         n->add_input("gamma");
         n->add_input("beta");
         attr_f(n, "epsilon", 1e-3f);
       }},
      {"DepthToSpace", 64, [](Builder&, onnx::NodeProto* n) { attr_i(n, "blocksize", 2); }},
      {"DepthToSpace", 64,
       [](Builder&, onnx::NodeProto* n) {
         attr_i(n, "blocksize", 2);
         attr_s(n, "mode", "CRD");  // PyTorch's PixelShuffle
       }},
      {"SpaceToDepth", 64, [](Builder&, onnx::NodeProto* n) { attr_i(n, "blocksize", 2); }},
  };
  int index = 0;
  for (const auto& sc : cases) {
    Builder b;
    b.input("x", {2, 4, 4, 4});
    b.weight("s", {1, 4, 1, 1});
    b.weight("V", {sc.flat, 2}, 0.2);
    b.node("Mul", {"x", "s"}, {"h"});
    b.node(sc.pre, {"h"}, {"p"});
    auto* n = b.node(sc.op, {"p"}, {"q"});
    sc.setup(b, n);
    attr_i(b.node("Flatten", {"q"}, {"f"}), "axis", 1);
    b.node("MatMul", {"f", "V"}, {"y"});
    b.output("y", {2, 2});
    check(b, sc.op + "_" + std::to_string(index++));
  }
}

TEST_CASE("Mish's gradient matches float32 differences", "[train]") {
  // An opset 18 op that ONNX 1.12's shape inference, which the float64 check runs, does not know.
  Builder b(18);
  b.input("x", {3, 4});
  b.weight("W", {4, 5});
  b.weight("V", {5});
  b.node("MatMul", {"x", "W"}, {"h"});
  b.node("Mish", {"h"}, {"q"});
  b.node("Mul", {"q", "V"}, {"y"});  // q's shape is not inferred: no rule after it may need it
  b.output("y", {3, 5});
  check_f32(b, {3, 4}, {3, 5}, 4);
}

TEST_CASE("ConvTranspose's gradients match float32 differences", "[train]") {
  for (int group : {1, 2}) {
    INFO("group " << group);
    Builder b;
    b.input("x", {2, 4, 5, 5});
    b.weight("s", {1, 4, 1, 1});
    b.weight("W", {4, 4 / group, 3, 3}, 0.3);
    b.weight("B", {4}, 0.3);
    b.weight("V", {4 * 10 * 10, 2}, 0.05);
    b.node("Mul", {"x", "s"}, {"h"});
    auto* n = b.node("ConvTranspose", {"h", "W", "B"}, {"c"});
    attr_ints(n, "strides", {2, 2});
    attr_ints(n, "pads", {1, 1, 1, 1});
    attr_ints(n, "output_padding", {1, 1});
    attr_i(n, "group", group);
    attr_i(b.node("Flatten", {"c"}, {"f"}), "axis", 1);
    b.node("MatMul", {"f", "V"}, {"y"});
    b.output("y", {2, 2});
    check_f32(b, {2, 4, 5, 5}, {2, 2}, 3);
  }
  SECTION("auto_pad is refused with the node named") {
    Builder b;
    b.input("x", {1, 2, 3, 3});
    b.weight("W", {2, 2, 3, 3});
    auto* n = b.node("ConvTranspose", {"x", "W"}, {"y"}, "the_deconv");
    attr_s(n, "auto_pad", "SAME_UPPER");
    b.output("y", {1, 2, 3, 3});
    auto r = train::build_grad_graph(b.model(), test::mse_on_y());
    REQUIRE_FALSE(r);
    CHECK(r.error().where().find("the_deconv") != std::string::npos);
    CHECK(r.error().message().find("explicit pads") != std::string::npos);
  }
}

TEST_CASE("recurrent layers' gradients match float64 differences", "[train]") {
  struct Rnn {
    std::string op;
    std::string direction;
    int layout;
    bool states;  // initial states (and LSTM peepholes) as trainable initializers
    std::function<void(onnx::NodeProto*)> setup = [](onnx::NodeProto*) {};
  };
  const std::vector<Rnn> cases = {
      {"LSTM", "forward", 0, false},
      {"LSTM", "bidirectional", 1, true},
      {"LSTM", "reverse", 0, true,
       [](onnx::NodeProto* n) {
         auto* a = n->add_attribute();
         a->set_name("activations");
         a->set_type(onnx::AttributeProto::STRINGS);
         for (const char* f : {"Sigmoid", "Relu", "Tanh"}) a->add_strings(f);
       }},
      {"GRU", "forward", 0, true, [](onnx::NodeProto* n) { attr_i(n, "linear_before_reset", 1); }},
      {"GRU", "bidirectional", 1, false},  // linear_before_reset = 0
      {"RNN", "bidirectional", 0, true},
      {"RNN", "forward", 1, false},
      {"RNN", "forward", 0, false,
       [](onnx::NodeProto* n) {
         auto* a = n->add_attribute();
         a->set_name("activations");
         a->set_type(onnx::AttributeProto::STRINGS);
         a->add_strings("Relu");
       }},
  };
  const std::int64_t T = 3, N = 2, I = 4, H = 3;
  int index = 0;
  for (const auto& rc : cases) {
    INFO(rc.op << " " << rc.direction << " layout " << rc.layout);
    const std::int64_t dirs = rc.direction == "bidirectional" ? 2 : 1;
    const std::int64_t G = rc.op == "LSTM" ? 4 : rc.op == "GRU" ? 3 : 1;
    const bool lstm = rc.op == "LSTM";
    Builder b;
    b.input("x",
            rc.layout ? std::vector<std::int64_t>{N, T, I} : std::vector<std::int64_t>{T, N, I});
    b.weight("s", {I});
    b.weight("W", {dirs, G * H, I});
    b.weight("R", {dirs, G * H, H});
    b.weight("B", {dirs, 2 * G * H}, 0.2);
    b.node("Mul", {"x", "s"}, {"xs"});  // a trainable tensor before the layer: dX is checked
    const std::vector<std::int64_t> state =
        rc.layout ? std::vector<std::int64_t>{N, dirs, H} : std::vector<std::int64_t>{dirs, N, H};
    std::vector<std::string> ins = {"xs", "W", "R", "B", "", "", ""};
    if (rc.states) {
      b.weight("h0", state);
      ins[5] = "h0";
      if (lstm) {
        b.weight("c0", state);
        b.weight("P", {dirs, 3 * H});
        ins[6] = "c0";
        ins.push_back("P");
      }
    }
    while (ins.back().empty()) ins.pop_back();
    std::vector<std::string> outs = {"Y", "Y_h"};
    if (lstm) outs.push_back("Y_c");
    auto* n = b.node(rc.op, ins, outs);
    attr_i(n, "hidden_size", H);
    attr_s(n, "direction", rc.direction);
    if (rc.layout) attr_i(n, "layout", 1);
    rc.setup(n);
    // Every output reaches the loss: Y and the final states, stacked along the sequence axis.
    const std::int64_t seq_axis = rc.layout ? 1 : 0;
    b.ints("seq_axis", {seq_axis});
    std::vector<std::string> parts = {"Y"};
    for (std::size_t k = 1; k < outs.size(); ++k) {
      const std::string u = outs[k] + "_u";
      b.node("Unsqueeze", {outs[k], "seq_axis"}, {u});
      parts.push_back(u);
    }
    attr_i(b.node("Concat", parts, {"y"}), "axis", seq_axis);
    const std::int64_t len = T + static_cast<std::int64_t>(outs.size()) - 1;
    b.output("y", rc.layout ? std::vector<std::int64_t>{N, len, dirs, H}
                            : std::vector<std::int64_t>{len, dirs, N, H});
    check(b, rc.op + "_" + std::to_string(index++));
  }
}
