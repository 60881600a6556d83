// Small models and initializers shared by the fusion tests (exec_fusion_test.cpp,
// exec_fusion_matmul_test.cpp).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <vector>

#include "exec_test_util.h"

namespace hp::exec::test {

/// Values of an initializer stored as float_data or double_data.
inline std::vector<double> init_values(const onnx::ModelProto& m, const std::string& name) {
  for (const auto& t : m.graph().initializer())
    if (t.name() == name)
      return t.float_data_size()
                 ? std::vector<double>(t.float_data().begin(), t.float_data().end())
                 : std::vector<double>(t.double_data().begin(), t.double_data().end());
  return {};
}

/// A C x C x 3 x 3 weight (or bias) of small multiples of 1/8, stored as float or double.
inline void add_conv_init(onnx::GraphProto* g, const std::string& name,
                          std::vector<std::int64_t> dims, int seed, bool f64) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(f64 ? onnx::TensorProto::DOUBLE : onnx::TensorProto::FLOAT);
  std::int64_t n = 1;
  for (auto d : dims) {
    t->add_dims(d);
    n *= d;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(static_cast<int>((i * seed) % 13) - 6) / 8;
    if (f64)
      t->add_double_data(v);
    else
      t->add_float_data(static_cast<float>(v));
  }
}

/// y = act(x @ W + Z) as exported for a linear layer: MatMul, Add, then the five-node exact GELU
/// (act "Gelu"), a Relu ("Relu") or nothing (""). Z is a bias [5] or, with `full_z`, a [2, 3, 5]
/// tensor (no bias: the kernel's general path). `expose_mm` also outputs the MatMul's result.
inline onnx::ModelProto linear_model(const std::string& act, bool full_z, bool expose_mm) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {2, 3, 4});
  add_value(g->mutable_output(), "y", {2, 3, 5});
  if (expose_mm) add_value(g->mutable_output(), "mm", {2, 3, 5});
  add_conv_init(g, "W", {4, 5}, 7, false);
  add_conv_init(g, "Z", full_z ? std::vector<std::int64_t>{2, 3, 5} : std::vector<std::int64_t>{5},
                5, false);
  add_node(g, "MatMul", {"x", "W"}, {"mm"}, "matmul");
  const std::string pre = act.empty() ? "y" : "a";
  add_node(g, "Add", {"Z", "mm"}, {pre}, "add");  // bias first, as torch.onnx writes it
  if (act == "Relu") add_node(g, "Relu", {"a"}, {"y"}, "relu");
  if (act == "Gelu") {
    add_scalar_constant(g, "sqrt2", 1.4142135381698608f);
    add_scalar_constant(g, "one", 1.0f);
    add_scalar_constant(g, "half", 0.5f);
    add_node(g, "Div", {"a", "sqrt2"}, {"d"}, "div");
    add_node(g, "Erf", {"d"}, {"e"}, "erf");
    add_node(g, "Add", {"e", "one"}, {"e1"}, "add1");
    add_node(g, "Mul", {"a", "e1"}, {"am"}, "mul");
    add_node(g, "Mul", {"am", "half"}, {"y"}, "mul_half");
  }
  return m;
}

}  // namespace hp::exec::test
