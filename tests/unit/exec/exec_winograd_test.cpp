// The cpu backend's Winograd F(2x2, 3x3) convolution (plugins/cpu/cpu_winograd.cpp) through the
// executor, on shapes it takes (channels in multiples of 16, 3x3, stride 1): against a
// double-precision direct convolution, with odd image sizes (tiles past the edge), pads 0, 1 and
// 2, a batch whose tiles span images, each of its GEMM kernels (output channels 48, 32 and 64),
// the fused bias, residual and Relu, and channels-first and channels-last operands; and constant
// filters kept in a kernel's layout across runs until set_weight replaces them. On a CPU
// without AVX-512 the same graphs run on oneDNN and must give the same values.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>

#include "exec_test_util.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"

using namespace hp;
using namespace hp::exec;
using namespace hp::exec::test;

namespace {

struct Tensor4 {
  std::vector<std::int64_t> dims;  // N x C x H x W
  std::vector<double> v;
};

/// Deterministic values in [-1, 1) (a multiplicative hash), `scale` times that.
std::vector<float> values(std::size_t n, std::uint32_t seed, float scale) {
  std::vector<float> out(n);
  std::uint32_t s = seed * 2654435761u + 1;
  for (auto& x : out) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / static_cast<float>(1u << 23) - 1.f);
  }
  return out;
}

/// conv(x, w) + b, 3x3, stride 1, the same pad on every side, in double.
Tensor4 conv_ref(const Tensor4& x, const std::vector<float>& w, const std::vector<float>& b,
                 std::int64_t M, std::int64_t pad) {
  const std::int64_t N = x.dims[0], C = x.dims[1], H = x.dims[2], W = x.dims[3];
  const std::int64_t OH = H + 2 * pad - 2, OW = W + 2 * pad - 2;
  Tensor4 y{{N, M, OH, OW}, std::vector<double>(static_cast<std::size_t>(N * M * OH * OW))};
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t i = 0; i < OH; ++i)
        for (std::int64_t j = 0; j < OW; ++j) {
          double acc = b.empty() ? 0.0 : b[static_cast<std::size_t>(m)];
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t a = 0; a < 3; ++a)
              for (std::int64_t e = 0; e < 3; ++e) {
                const std::int64_t ii = i + a - pad, jj = j + e - pad;
                if (ii < 0 || ii >= H || jj < 0 || jj >= W) continue;
                acc += x.v[static_cast<std::size_t>(((n * C + c) * H + ii) * W + jj)] *
                       w[static_cast<std::size_t>(((m * C + c) * 3 + a) * 3 + e)];
              }
          y.v[static_cast<std::size_t>(((n * M + m) * OH + i) * OW + j)] = acc;
        }
  return y;
}

void add_conv(onnx::GraphProto* g, const std::string& in, const std::string& w,
              const std::string& bias, const std::string& out, std::int64_t pad) {
  auto* n = add_node(g, "Conv", {in, w}, {out}, "conv_" + out);
  if (!bias.empty()) n->add_input(bias);
  auto* p = n->add_attribute();
  p->set_name("pads");
  p->set_type(onnx::AttributeProto::INTS);
  for (int k = 0; k < 4; ++k) p->add_ints(pad);
}

/// y = Conv(x [N, C, H, W], w [M, C, 3, 3], b [M] when given, the same pad on every side): one
/// node, its filter (and bias) initializers.
onnx::ModelProto one_conv_model(std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W,
                                std::int64_t pad, const std::vector<float>& w,
                                const std::vector<float>& bias) {
  const std::int64_t M = static_cast<std::int64_t>(w.size()) / (C * 9);
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {N, C, H, W});
  add_value(g->mutable_output(), "y", {N, M, H + 2 * pad - 2, W + 2 * pad - 2});
  add_f32_init(g, "w", {M, C, 3, 3}, w);
  if (!bias.empty()) add_f32_init(g, "b", {M}, bias);
  add_conv(g, "x", "w", bias.empty() ? "" : "b", "y", pad);
  return m;
}

/// The largest |got - want| over the largest |want|.
double rel_error(const HostTensor& got, const Tensor4& want) {
  REQUIRE(got.dims == want.dims);
  double err = 0, mag = 0;
  for (std::size_t i = 0; i < want.v.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(got.as<float>()[i]) - want.v[i]));
    mag = std::max(mag, std::abs(want.v[i]));
  }
  REQUIRE(mag > 0);
  return err / mag;
}

}  // namespace

TEST_CASE("3x3 convolutions with channels in multiples of 16 give the direct sum's values",
          "[exec]") {
  // x [3, 16, 7, 9] -> r1 = Relu(Conv(x, w1 [48, 16], b1, pads 1))          (48 outputs)
  //                 -> c2 = Conv(r1, w2 [32, 48], pads 0) [3, 32, 5, 7]      (32 outputs)
  //                 -> y  = Relu(Conv(c2, w3 [32, 32], b3, pads 1) + c2)     (a fused residual)
  // r1 and c2 stay channels-last between the convolutions; x and y are channels-first.
  const std::int64_t N = 3, C = 16, H = 7, W = 9;
  const auto w1 = values(48 * 16 * 9, 1, 0.3f), b1 = values(48, 2, 0.5f),
             w2 = values(32 * 48 * 9, 3, 0.2f), w3 = values(32 * 32 * 9, 4, 0.2f),
             b3 = values(32, 5, 0.5f);
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {N, C, H, W});
  add_value(g->mutable_output(), "y", {N, 32, H - 2, W - 2});
  add_f32_init(g, "w1", {48, 16, 3, 3}, w1);
  add_f32_init(g, "b1", {48}, b1);
  add_f32_init(g, "w2", {32, 48, 3, 3}, w2);
  add_f32_init(g, "w3", {32, 32, 3, 3}, w3);
  add_f32_init(g, "b3", {32}, b3);
  add_conv(g, "x", "w1", "b1", "c1", 1);
  add_node(g, "Relu", {"c1"}, {"r1"}, "relu1");
  add_conv(g, "r1", "w2", "", "c2", 0);
  add_conv(g, "c2", "w3", "b3", "c3", 1);
  add_node(g, "Add", {"c3", "c2"}, {"a"}, "add");
  add_node(g, "Relu", {"a"}, {"y"}, "relu2");
  fs::path d = temp_dir("winograd_chain");
  auto mm = load(write_model(d, m));
  const auto xs = values(static_cast<std::size_t>(N * C * H * W), 6, 1.f);
  Tensor4 x{{N, C, H, W}, std::vector<double>(xs.begin(), xs.end())};
  auto expected = [&](const std::vector<float>& w3v) {
    Tensor4 r1 = conv_ref(x, w1, b1, 48, 1);
    for (double& v : r1.v) v = std::max(v, 0.0);
    const Tensor4 c2 = conv_ref(r1, w2, {}, 32, 0);
    Tensor4 y = conv_ref(c2, w3v, b3, 32, 1);
    for (std::size_t i = 0; i < y.v.size(); ++i) y.v[i] = std::max(y.v[i] + c2.v[i], 0.0);
    return y;
  };
  // With constant weights packed (the filters' transforms kept across runs) and without (made on
  // every call, as in training).
  for (bool pack : {true, false}) {
    INFO("pack_weights " << pack);
    Backends b = cpu();
    ExecOptions eo{b.primary, b.cpu, nullptr};
    eo.pack_weights = pack;
    auto ex = Executor::create(mm, eo);
    REQUIRE(ex.ok());
    for (int run = 0; run < 2; ++run) {  // the second run reads the kept transforms
      auto out = (*ex)->run({f32({N, C, H, W}, xs)});
      REQUIRE(out.ok());
      // A direct float sum is off by ~1e-7 of the largest value; F(2x2, 3x3) by a few times that.
      CHECK(rel_error((*out)[0], expected(w3)) < 2e-6);
    }
    CHECK((*ex)->stats().by_op.at("hp.nn.FusedConv").nodes == 3);
    // A filter replaced after runs: the next run uses the new values, not a kept transform.
    const auto w3b = values(32 * 32 * 9, 11, 0.2f);
    HostTensor t = f32({32, 32, 3, 3}, w3b, "w3");
    REQUIRE((*ex)->set_weight("w3", t).ok());
    auto out = (*ex)->run({f32({N, C, H, W}, xs)});
    REQUIRE(out.ok());
    CHECK(rel_error((*out)[0], expected(w3b)) < 2e-6);
  }
  fs::remove_all(d);
}

TEST_CASE("a lone 3x3 convolution with pads 2 and 64 outputs gives the direct sum's values",
          "[exec]") {
  // Channels-first in and out (the operands are reordered around the Winograd loop); the output
  // is larger than the input, so whole tiles read only padding.
  const std::int64_t N = 4, C = 16, H = 5, W = 6, M = 64;
  const auto w = values(M * C * 9, 7, 0.3f), bias = values(M, 8, 0.5f);
  fs::path d = temp_dir("winograd_lone");
  auto mm = load(write_model(d, one_conv_model(N, C, H, W, 2, w, bias)));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  const auto xs = values(static_cast<std::size_t>(N * C * H * W), 9, 2.f);
  auto out = (*ex)->run({f32({N, C, H, W}, xs)});
  REQUIRE(out.ok());
  const Tensor4 want =
      conv_ref({{N, C, H, W}, std::vector<double>(xs.begin(), xs.end())}, w, bias, M, 2);
  CHECK(rel_error((*out)[0], want) < 2e-6);
  fs::remove_all(d);
}

TEST_CASE("a constant filter oneDNN reorders is kept, and a replaced one is not", "[exec]") {
  // 3 input channels: not a Winograd shape, so oneDNN's direct kernel runs it, on a filter
  // reordered into its blocked layout once (the executor tags it hp_weight_b) until set_weight.
  const std::int64_t N = 2, C = 3, H = 6, W = 5, M = 16;
  const auto w = values(M * C * 9, 12, 0.3f), w2 = values(M * C * 9, 13, 0.3f);
  fs::path d = temp_dir("conv_kept_filter");
  auto mm = load(write_model(d, one_conv_model(N, C, H, W, 1, w, {})));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  const auto xs = values(static_cast<std::size_t>(N * C * H * W), 14, 1.f);
  const Tensor4 x{{N, C, H, W}, std::vector<double>(xs.begin(), xs.end())};
  for (int run = 0; run < 2; ++run) {
    auto out = (*ex)->run({f32({N, C, H, W}, xs)});
    REQUIRE(out.ok());
    CHECK(rel_error((*out)[0], conv_ref(x, w, {}, M, 1)) < 2e-6);
  }
  REQUIRE((*ex)->set_weight("w", f32({M, C, 3, 3}, w2, "w")).ok());
  auto out = (*ex)->run({f32({N, C, H, W}, xs)});
  REQUIRE(out.ok());
  CHECK(rel_error((*out)[0], conv_ref(x, w2, {}, M, 1)) < 2e-6);
  fs::remove_all(d);
}
