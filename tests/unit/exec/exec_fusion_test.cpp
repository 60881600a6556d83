// The executor's rewrites at preparation (libs/exec/src/exec_fuse.cpp, exec_layout.cpp) on graphs
// built here: each fused or re-laid-out graph computes what the original nodes compute (against
// element-by-element references), and a chain whose intermediate someone else reads is left alone.
// The linear layers' rewrites and packed weights are in exec_fusion_matmul_test.cpp.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "exec_fusion_models.h"
#include "exec_test_util.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"

using namespace hp;
using namespace hp::exec;
using namespace hp::exec::test;

namespace {

// PyTorch's export of the exact GELU: y = x * (erf(x / sqrt 2) + 1) * 0.5, five nodes over a
// length-n input; `erf_is_output` also exposes the Erf result as a second graph output.
onnx::ModelProto gelu_chain_model(std::int64_t n, bool erf_is_output) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {n});
  add_value(g->mutable_output(), "y", {n});
  if (erf_is_output) add_value(g->mutable_output(), "e", {n});
  add_scalar_constant(g, "sqrt2", 1.4142135381698608f);
  add_scalar_constant(g, "one", 1.0f);
  add_scalar_constant(g, "half", 0.5f);
  add_node(g, "Div", {"x", "sqrt2"}, {"d"}, "div");
  add_node(g, "Erf", {"d"}, {"e"}, "erf");
  add_node(g, "Add", {"e", "one"}, {"a"}, "add");
  add_node(g, "Mul", {"x", "a"}, {"xm"}, "mul");
  add_node(g, "Mul", {"xm", "half"}, {"y"}, "mul_half");
  return m;
}

}  // namespace

TEST_CASE("the exported exact GELU chain runs as one Gelu node with the same values", "[exec]") {
  fs::path d = temp_dir("gelu");
  auto mm = load(write_model(d, gelu_chain_model(4, false)));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  const std::vector<float> xs = {-3.f, -0.5f, 0.25f, 2.f};
  auto out = (*ex)->run({f32({4}, xs)});
  REQUIRE(out.ok());
  for (std::size_t i = 0; i < xs.size(); ++i)
    CHECK((*out)[0].as<float>()[i] ==
          Approx(0.5 * xs[i] * (1 + std::erf(xs[i] / std::sqrt(2.0)))).margin(1e-6));
  const auto& by_op = (*ex)->stats().by_op;
  CHECK(by_op.count("Gelu") == 1);
  CHECK(by_op.count("Erf") == 0);
  CHECK(by_op.count("Div") == 0);
  fs::remove_all(d);
}

TEST_CASE("a GELU-like chain whose intermediate is also a graph output is not fused", "[exec]") {
  fs::path d = temp_dir("gelu_nofuse");
  auto mm = load(write_model(d, gelu_chain_model(2, true)));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  auto out = (*ex)->run({f32({2}, {1.f, -1.f})});
  REQUIRE(out.ok());
  REQUIRE(out->size() == 2);
  CHECK((*out)[1].as<float>()[0] == Approx(std::erf(1 / std::sqrt(2.0))).margin(1e-6));
  CHECK((*ex)->stats().by_op.count("Erf") == 1);
  CHECK((*ex)->stats().by_op.count("Gelu") == 0);
  fs::remove_all(d);
}

namespace {

/// 3x3 convolution, pads 1, of an N x C x H x W input with C x C x 3 x 3 weights (and a bias).
std::vector<double> conv3x3_ref(const std::vector<double>& in, const std::vector<double>& w,
                                const std::vector<double>& b, int N, int C, int H, int W) {
  std::vector<double> out(in.size());
  auto at = [](int a, int b2, int c, int d, int B, int Cc, int D) {
    return static_cast<std::size_t>(((a * B + b2) * Cc + c) * D + d);
  };
  for (int n = 0; n < N; ++n)
    for (int mo = 0; mo < C; ++mo)
      for (int i = 0; i < H; ++i)
        for (int j = 0; j < W; ++j) {
          double acc = b.empty() ? 0 : b[static_cast<std::size_t>(mo)];
          for (int c = 0; c < C; ++c)
            for (int a = 0; a < 3; ++a)
              for (int e = 0; e < 3; ++e) {
                const int ii = i + a - 1, jj = j + e - 1;
                if (ii < 0 || ii >= H || jj < 0 || jj >= W) continue;
                acc += in[at(n, c, ii, jj, C, H, W)] * w[at(mo, c, a, e, C, 3, 3)];
              }
          out[at(n, mo, i, j, C, H, W)] = acc;
        }
  return out;
}

std::vector<double> relu(std::vector<double> v) {
  for (double& x : v) x = std::max(x, 0.0);
  return v;
}

void add_conv(onnx::GraphProto* g, const std::string& in, const std::string& w,
              const std::string& bias, const std::string& out) {
  auto* n = add_node(g, "Conv", {in, w}, {out}, "conv_" + out);
  if (!bias.empty()) n->add_input(bias);
  auto* p = n->add_attribute();
  p->set_name("pads");
  p->set_type(onnx::AttributeProto::INTS);
  for (int k = 0; k < 4; ++k) p->add_ints(1);
}

/// A residual block as PyTorch exports a ResNet's (BatchNorm folded into the convs):
/// y = Relu(Conv2(Relu(Conv1(x) + b1)) + x), 2 channels, 3x3 kernels, pads 1, on 1 x 2 x 4 x 4.
/// `expose_c2` also makes Conv2's output a graph output; `z_first` writes the Add as Add(x, c2).
onnx::ModelProto residual_block_model(bool expose_c2, bool z_first) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {1, 2, 4, 4});
  add_value(g->mutable_output(), "y", {1, 2, 4, 4});
  if (expose_c2) add_value(g->mutable_output(), "c2", {1, 2, 4, 4});
  add_conv_init(g, "w1", {2, 2, 3, 3}, 7, false);
  add_conv_init(g, "b1", {2}, 3, false);
  add_conv_init(g, "w2", {2, 2, 3, 3}, 5, false);
  add_conv(g, "x", "w1", "b1", "c1");
  add_node(g, "Relu", {"c1"}, {"r1"}, "relu1");
  add_conv(g, "r1", "w2", "", "c2");
  add_node(g, "Add",
           z_first ? std::vector<std::string>{"x", "c2"} : std::vector<std::string>{"c2", "x"},
           {"a"}, "add");
  add_node(g, "Relu", {"a"}, {"y"}, "relu2");
  return m;
}

/// The block's output computed here, element by element.
std::vector<double> residual_block_ref(const onnx::ModelProto& m, const std::vector<float>& x) {
  const std::vector<double> xv(x.begin(), x.end());
  const std::vector<double> r1 =
      relu(conv3x3_ref(xv, init_values(m, "w1"), init_values(m, "b1"), 1, 2, 4, 4));
  std::vector<double> y = conv3x3_ref(r1, init_values(m, "w2"), {}, 1, 2, 4, 4);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::max(y[i] + xv[i], 0.0);
  return y;
}

}  // namespace

TEST_CASE("Conv + Relu and Conv + Add + Relu run as FusedConv nodes with the same values",
          "[exec]") {
  std::vector<float> xs(32);
  for (std::size_t i = 0; i < xs.size(); ++i)
    xs[i] = static_cast<float>(static_cast<int>(i * 3 % 17) - 8) / 4;
  for (bool expose : {false, true})
    for (bool z_first : {false, true}) {
      INFO("Conv2's output a graph output: " << expose << ", Add(x, c2): " << z_first);
      fs::path d = temp_dir("conv_fuse");
      const onnx::ModelProto m = residual_block_model(expose, z_first);
      auto mm = load(write_model(d, m));
      Backends b = cpu();
      auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
      REQUIRE(ex.ok());
      auto out = (*ex)->run({f32({1, 2, 4, 4}, xs)});
      REQUIRE(out.ok());
      const std::vector<double> want = residual_block_ref(m, xs);
      for (std::size_t i = 0; i < want.size(); ++i)
        CHECK((*out)[0].as<float>()[i] == Approx(want[i]).margin(1e-5));
      const auto& by_op = (*ex)->stats().by_op;
      // Conv1 + Relu always fuse; Conv2 + Add + Relu only while Conv2's output is internal. Both
      // convolutions then keep r1 between them channels-last (hp.nn.FusedConv).
      CHECK(by_op.at("hp.nn.FusedConv").nodes == 2);
      CHECK(by_op.count("Conv") == 0);
      CHECK(by_op.count("Add") == (expose ? 1u : 0u));
      CHECK(by_op.count("Relu") == (expose ? 1u : 0u));
      fs::remove_all(d);
    }
}

namespace {

/// Three convolutions on 2 x 3 x 4 x 5 (non-square, so a swapped H and W shows):
///   r1 = Relu(Conv1(x) + b1), r2 = Relu(Conv2(r1)), y = Relu(Conv3(r2) + r1)
/// r1 is read by Conv2 as X and by Conv3's fused residual as Z; `expose_r2` makes r2 a graph
/// output too, which keeps it in ONNX's layout.
onnx::ModelProto conv_chain_model(bool f64, bool expose_r2) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  const int type = f64 ? onnx::TensorProto::DOUBLE : onnx::TensorProto::FLOAT;
  add_value(g->mutable_input(), "x", {2, 3, 4, 5}, type);
  add_value(g->mutable_output(), "y", {2, 3, 4, 5}, type);
  if (expose_r2) add_value(g->mutable_output(), "r2", {2, 3, 4, 5}, type);
  add_conv_init(g, "w1", {3, 3, 3, 3}, 7, f64);
  add_conv_init(g, "b1", {3}, 5, f64);
  add_conv_init(g, "w2", {3, 3, 3, 3}, 11, f64);
  add_conv_init(g, "w3", {3, 3, 3, 3}, 4, f64);
  add_conv(g, "x", "w1", "b1", "c1");
  add_node(g, "Relu", {"c1"}, {"r1"}, "relu1");
  add_conv(g, "r1", "w2", "", "c2");
  add_node(g, "Relu", {"c2"}, {"r2"}, "relu2");
  add_conv(g, "r2", "w3", "", "c3");
  add_node(g, "Add", {"c3", "r1"}, {"a"}, "add");
  add_node(g, "Relu", {"a"}, {"y"}, "relu3");
  return m;
}

}  // namespace

TEST_CASE("tensors between convolutions stay channels-last and the outputs are unchanged",
          "[exec]") {
  std::vector<double> xs(120);
  for (std::size_t i = 0; i < xs.size(); ++i)
    xs[i] = static_cast<double>(static_cast<int>(i * 7 % 23) - 11) / 4;
  for (bool f64 : {false, true})
    for (bool expose : {false, true}) {
      INFO("float64 (the direct loop's path): " << f64 << ", r2 a graph output: " << expose);
      fs::path d = temp_dir("conv_layout");
      const onnx::ModelProto m = conv_chain_model(f64, expose);
      auto mm = load(write_model(d, m));
      Backends b = cpu();
      auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
      REQUIRE(ex.ok());
      HostTensor x;
      x.dtype = f64 ? HP_F64 : HP_F32;
      x.dims = {2, 3, 4, 5};
      x.data.resize(xs.size() * (f64 ? 8 : 4));
      for (std::size_t i = 0; i < xs.size(); ++i)
        if (f64)
          reinterpret_cast<double*>(x.data.data())[i] = xs[i];
        else
          reinterpret_cast<float*>(x.data.data())[i] = static_cast<float>(xs[i]);
      auto out = (*ex)->run({x});
      REQUIRE(out.ok());
      const std::vector<double> r1 =
          relu(conv3x3_ref(xs, init_values(m, "w1"), init_values(m, "b1"), 2, 3, 4, 5));
      const std::vector<double> r2 = relu(conv3x3_ref(r1, init_values(m, "w2"), {}, 2, 3, 4, 5));
      std::vector<double> y = conv3x3_ref(r2, init_values(m, "w3"), {}, 2, 3, 4, 5);
      for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::max(y[i] + r1[i], 0.0);
      auto value = [&](const HostTensor& t, std::size_t i) {
        return f64 ? t.as<double>()[i] : static_cast<double>(t.as<float>()[i]);
      };
      REQUIRE((*out)[0].dims == std::vector<std::int64_t>{2, 3, 4, 5});
      for (std::size_t i = 0; i < y.size(); ++i)
        CHECK(value((*out)[0], i) == Approx(y[i]).margin(f64 ? 1e-12 : 1e-4));
      if (expose) {
        REQUIRE((*out)[1].dims == std::vector<std::int64_t>{2, 3, 4, 5});
        for (std::size_t i = 0; i < r2.size(); ++i)
          CHECK(value((*out)[1], i) == Approx(r2[i]).margin(f64 ? 1e-12 : 1e-4));
      }
      const auto& by_op = (*ex)->stats().by_op;
      CHECK(by_op.at("hp.nn.FusedConv").nodes == 3);
      CHECK(by_op.count("com.microsoft.FusedConv") == 0);
      fs::remove_all(d);
    }
}

TEST_CASE("compute=bf16 runs MatMul and Conv in bfloat16 within its rounding of float32",
          "[exec][bf16]") {
  auto bf = open_backends("cpu", 1, {}, {"compute=bf16"});
  if (!bf) {
    WARN("skipped: " << bf.error().message());  // no AVX512-BF16 or AMX on this CPU
    return;
  }
  Backends f32b = cpu();
  // Values bfloat16 cannot hold exactly (sines), so a float32 run and a bfloat16 run differ.
  auto run = [&](const onnx::ModelProto& m, const Backends& b, const HostTensor& x) {
    fs::path d = temp_dir("bf16");
    auto mm = load(write_model(d, m));
    auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
    REQUIRE(ex.ok());
    auto out = (*ex)->run({x});
    REQUIRE(out.ok());
    fs::remove_all(d);
    return (*out)[0];
  };
  auto sines = [](std::vector<std::int64_t> dims) {
    std::int64_t n = 1;
    for (auto v : dims) n *= v;
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i) * 0.37f);
    return f32(dims, v);
  };
  for (bool conv : {false, true}) {
    INFO((conv ? "the convolution chain" : "the linear layer with GELU"));
    const onnx::ModelProto m =
        conv ? conv_chain_model(false, false) : linear_model("Gelu", false, false);
    const HostTensor x = conv ? sines({2, 3, 4, 5}) : sines({2, 3, 4});
    const HostTensor a = run(m, f32b, x), b = run(m, *bf, x);
    REQUIRE(a.dims == b.dims);
    double worst = 0, scale = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      worst = std::max(worst, double(std::fabs(a.as<float>()[i] - b.as<float>()[i])));
      scale = std::max(scale, double(std::fabs(a.as<float>()[i])));
    }
    CHECK(worst > 0);             // really computed in bfloat16
    CHECK(worst < 2e-2 * scale);  // and within its 8-bit mantissa of float32
  }
}
