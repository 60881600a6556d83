// Layer norm exported as primitives (libs/exec/src/exec_fuse_norm.cpp): fused into one
// LayerNormalization node with the values the nine nodes compute, and left alone where fusing would
// change what is computed or drop a value someone reads.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>

#include "exec_test_util.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"

using namespace hp;
using namespace hp::exec;
using namespace hp::exec::test;

namespace {

struct Chain {
  std::vector<std::int64_t> axes = {-1};
  float exponent = 2.f;
  bool beta = true;
  bool var_is_output = false;  ///< the variance also a graph output
  std::vector<std::int64_t> gamma_dims = {4};
};

// nn.LayerNorm(4) as PyTorch exports it below opset 17, over x of dims [2, 3, 4].
onnx::ModelProto layer_norm_chain(const Chain& c) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(14);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {2, 3, 4});
  add_value(g->mutable_output(), "y", {2, 3, 4});
  if (c.var_is_output) add_value(g->mutable_output(), "var", {2, 3, 1});
  std::int64_t n = 1;
  for (auto d : c.gamma_dims) n *= d;
  std::vector<float> gamma, beta;
  for (std::int64_t i = 0; i < n; ++i) {
    gamma.push_back(0.5f + 0.25f * static_cast<float>(i));
    beta.push_back(-0.1f * static_cast<float>(i));
  }
  add_f32_init(g, "gamma", c.gamma_dims, gamma);
  add_f32_init(g, "beta", c.gamma_dims, beta);
  add_scalar_constant(g, "two", c.exponent);
  add_scalar_constant(g, "eps", 1e-5f);
  auto mean_of = [&](const std::string& in, const std::string& out) {
    auto* r = add_node(g, "ReduceMean", {in}, {out}, out);
    auto* a = r->add_attribute();
    a->set_name("axes");
    a->set_type(onnx::AttributeProto::INTS);
    for (auto x : c.axes) a->add_ints(x);
  };
  mean_of("x", "mean");
  add_node(g, "Sub", {"x", "mean"}, {"d"}, "sub");
  add_node(g, "Pow", {"d", "two"}, {"p"}, "pow");
  mean_of("p", "var");
  add_node(g, "Add", {"var", "eps"}, {"ve"}, "add_eps");
  add_node(g, "Sqrt", {"ve"}, {"s"}, "sqrt");
  add_node(g, "Div", {"d", "s"}, {"n"}, "div");
  add_node(g, "Mul", {"n", "gamma"}, {c.beta ? "scaled" : "y"}, "mul");
  if (c.beta) add_node(g, "Add", {"scaled", "beta"}, {"y"}, "add_beta");
  return m;
}

std::vector<float> input() {
  std::vector<float> x;
  for (int i = 0; i < 24; ++i) x.push_back(std::sin(0.7f * static_cast<float>(i)) * 3.f + 1.f);
  return x;
}

// What the nine nodes compute, over the last `k` dims (4 or 12 values per row).
std::vector<double> reference(const std::vector<float>& x, std::int64_t row, bool beta) {
  std::vector<double> y(x.size());
  for (std::size_t o = 0; o < x.size(); o += static_cast<std::size_t>(row)) {
    double mean = 0, var = 0;
    for (std::int64_t i = 0; i < row; ++i) mean += x[o + static_cast<std::size_t>(i)];
    mean /= static_cast<double>(row);
    for (std::int64_t i = 0; i < row; ++i)
      var += std::pow(x[o + static_cast<std::size_t>(i)] - mean, 2);
    var /= static_cast<double>(row);
    for (std::int64_t i = 0; i < row; ++i) {
      const double g = 0.5 + 0.25 * static_cast<double>(i), b = beta ? -0.1 * i : 0.0;
      y[o + static_cast<std::size_t>(i)] =
          (x[o + static_cast<std::size_t>(i)] - mean) / std::sqrt(var + 1e-5) * g + b;
    }
  }
  return y;
}

// Runs the chain; returns the executor's op counts' view of whether it fused.
bool run_and_check(const Chain& c, std::int64_t row) {
  fs::path d = temp_dir("ln_chain");
  auto mm = load(write_model(d, layer_norm_chain(c)));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  const auto x = input();
  auto out = (*ex)->run({f32({2, 3, 4}, x)});
  REQUIRE(out.ok());
  if (c.exponent == 2.f) {
    const auto want = reference(x, row, c.beta);
    for (std::size_t i = 0; i < want.size(); ++i)
      CHECK((*out)[0].as<float>()[i] == Approx(want[i]).margin(2e-6));
  }
  const bool fused = (*ex)->stats().by_op.count("LayerNormalization") == 1;
  if (fused) {
    CHECK((*ex)->stats().by_op.count("ReduceMean") == 0);
    CHECK((*ex)->stats().by_op.count("Pow") == 0);
  }
  fs::remove_all(d);
  return fused;
}

}  // namespace

TEST_CASE("nn.LayerNorm exported as primitives runs as one LayerNormalization", "[exec]") {
  CHECK(run_and_check(Chain{}, 4));
  Chain no_beta;
  no_beta.beta = false;
  CHECK(run_and_check(no_beta, 4));
  Chain two_axes;  // normalised over the last two dims: gamma of dims [3, 4]
  two_axes.axes = {-2, -1};
  two_axes.gamma_dims = {3, 4};
  CHECK(run_and_check(two_axes, 12));
}

TEST_CASE("layer-norm-like chains that compute something else are not fused", "[exec]") {
  Chain cube;  // not a variance
  cube.exponent = 3.f;
  CHECK_FALSE(run_and_check(cube, 4));
  Chain leading;  // a positive axis: the rank is not known at preparation
  leading.axes = {2};
  CHECK_FALSE(run_and_check(leading, 4));
  Chain seen;  // an intermediate is a graph output: it must still be computed
  seen.var_is_output = true;
  CHECK_FALSE(run_and_check(seen, 4));
  Chain broadcast;  // gamma of dims [1, 4] would be applied over other dims than the row's
  broadcast.gamma_dims = {1, 4};
  CHECK_FALSE(run_and_check(broadcast, 4));
}
