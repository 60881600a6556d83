// The linear-layer rewrites at preparation (libs/exec/src/exec_fuse.cpp) and the backend's
// packed weights: MatMul + Add [+ activation] [+ residual Add] as hp.nn.MatMulAdd with the values
// of the original nodes, chains someone else reads left alone, and packed weights that follow
// set_weight and the packing budget.
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

TEST_CASE("MatMul + Add [+ Gelu | Relu] runs as one hp.nn.MatMulAdd with the same values",
          "[exec]") {
  std::vector<float> xs(24);
  for (std::size_t i = 0; i < xs.size(); ++i)
    xs[i] = static_cast<float>(static_cast<int>(i * 5 % 19) - 9) / 4;
  for (const std::string act : {"", "Relu", "Gelu"})
    for (bool full_z : {false, true})
      for (bool expose : {false, true}) {
        INFO("activation '" << act << "', Z a full tensor: " << full_z
                            << ", MatMul's output a graph output: " << expose);
        fs::path d = temp_dir("matmul_add");
        const onnx::ModelProto m = linear_model(act, full_z, expose);
        auto mm = load(write_model(d, m));
        Backends b = cpu();
        auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
        REQUIRE(ex.ok());
        auto out = (*ex)->run({f32({2, 3, 4}, xs)});
        REQUIRE(out.ok());
        const std::vector<double> w = init_values(m, "W"), z = init_values(m, "Z");
        REQUIRE((*out)[0].dims == std::vector<std::int64_t>{2, 3, 5});
        for (std::size_t r = 0; r < 6; ++r)
          for (std::size_t j = 0; j < 5; ++j) {
            double v = full_z ? z[r * 5 + j] : z[j];
            for (std::size_t k = 0; k < 4; ++k) v += double(xs[r * 4 + k]) * w[k * 5 + j];
            if (act == "Relu") v = std::max(v, 0.0);
            if (act == "Gelu") v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
            CHECK((*out)[0].as<float>()[r * 5 + j] == Approx(v).margin(1e-5));
          }
        const auto& by_op = (*ex)->stats().by_op;
        CHECK(by_op.count("hp.nn.MatMulAdd") == (expose ? 0u : 1u));
        CHECK(by_op.count("MatMul") == (expose ? 1u : 0u));
        // Unfused, the GELU chain is still one Gelu node (its own fusion).
        CHECK(by_op.count("Gelu") == (act == "Gelu" && expose ? 1u : 0u));
        CHECK(by_op.count("Relu") == (act == "Relu" && expose ? 1u : 0u));
        fs::remove_all(d);
      }
}

TEST_CASE("a weight packed by the backend is repacked after set_weight changes it",
          "[exec][bf16]") {
  // The linear layer's W is a constant B (hp_weight_b): in bfloat16 the cpu backend keeps it
  // converted (plugins/cpu/cpu_gemm.cpp). After set_weight the next run must use the new W.
  auto bf = open_backends("cpu", 1, {}, {"compute=bf16"});
  const bool bf16 = bf.ok();
  if (!bf16) WARN("bfloat16 unavailable (" << bf.error().message() << "): checked in float32");
  const Backends b = bf16 ? *bf : cpu();
  fs::path d = temp_dir("repack");
  const onnx::ModelProto m = linear_model("", false, false);
  auto mm = load(write_model(d, m));
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  std::vector<float> xs(24);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(static_cast<float>(i));
  const std::vector<double> z = init_values(m, "Z");
  auto check = [&](const std::vector<double>& w) {
    auto out = (*ex)->run({f32({2, 3, 4}, xs)});
    REQUIRE(out.ok());
    for (std::size_t r = 0; r < 6; ++r)
      for (std::size_t j = 0; j < 5; ++j) {
        double v = z[j];
        for (std::size_t k = 0; k < 4; ++k) v += double(xs[r * 4 + k]) * w[k * 5 + j];
        CHECK((*out)[0].as<float>()[r * 5 + j] == Approx(v).margin(bf16 ? 3e-2 : 1e-5));
      }
  };
  std::vector<double> w = init_values(m, "W");
  check(w);
  check(w);  // the packed copy reused
  std::vector<float> w2(20);
  for (std::size_t i = 0; i < w2.size(); ++i) {
    w2[i] = static_cast<float>(i % 7) - 3.0f;  // far from the first W
    w[i] = w2[i];
  }
  REQUIRE((*ex)->set_weight("W", f32({4, 5}, w2)).ok());
  check(w);
  fs::remove_all(d);
}

TEST_CASE("past the packing budget a weight is used as given, with the same values", "[exec]") {
  auto none = open_backends("cpu", 1, {}, {"packed_weights_limit=0"});
  REQUIRE(none.ok());
  Backends packed = cpu();
  fs::path d = temp_dir("pack_budget");
  const onnx::ModelProto m = linear_model("Gelu", false, false);
  auto mm = load(write_model(d, m));
  std::vector<float> xs(24);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(static_cast<float>(i) * 0.7f);
  std::vector<std::vector<float>> got;
  for (const Backends* b : {&packed, &*none}) {
    auto ex = Executor::create(mm, {b->primary, b->cpu, nullptr});
    REQUIRE(ex.ok());
    auto out = (*ex)->run({f32({2, 3, 4}, xs)});
    REQUIRE(out.ok());
    got.emplace_back((*out)[0].as<float>(), (*out)[0].as<float>() + (*out)[0].numel());
  }
  REQUIRE(got[0].size() == got[1].size());
  for (std::size_t i = 0; i < got[0].size(); ++i)
    CHECK(got[1][i] == Approx(got[0][i]).margin(1e-5));
  CHECK(!open_backends("cpu", 1, {}, {"packed_weights_limit=lots"}).ok());
  fs::remove_all(d);
}

TEST_CASE("a square weight read as itself and transposed is packed once for each reading",
          "[exec]") {
  // y = x @ W + x @ W^T (MatMul, then Gemm with transB): both B operands are the constant W, and
  // their packed layouts are equal descriptors; a copy packed for one must not serve the other.
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {3, 64});
  add_value(g->mutable_output(), "y", {3, 64});
  add_conv_init(g, "W", {64, 64}, 5, false);
  add_node(g, "MatMul", {"x", "W"}, {"a"}, "matmul");
  auto* gemm = add_node(g, "Gemm", {"x", "W"}, {"b"}, "gemm");
  auto* tb = gemm->add_attribute();
  tb->set_name("transB");
  tb->set_type(onnx::AttributeProto::INT);
  tb->set_i(1);
  add_node(g, "Add", {"a", "b"}, {"y"}, "sum");
  fs::path d = temp_dir("square");
  auto mm = load(write_model(d, m));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  std::vector<float> xs(3 * 64);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i % 5) - 2.0f;
  const std::vector<double> w = init_values(m, "W");
  for (int run = 0; run < 2; ++run) {
    auto out = (*ex)->run({f32({3, 64}, xs)});
    REQUIRE(out.ok());
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 64; ++j) {
        double v = 0;
        for (std::size_t k = 0; k < 64; ++k) v += xs[i * 64 + k] * (w[k * 64 + j] + w[j * 64 + k]);
        CHECK((*out)[0].as<float>()[i * 64 + j] == Approx(v).margin(1e-4));
      }
  }
  fs::remove_all(d);
}

namespace {

/// y = Add(act(x @ W + b), res) (or the residual first), a transformer block's projection and
/// residual connection: x [2, 3, 4], W [4, 5], b [5], act "" or "Relu", res an input of `r_dims`.
/// `expose_h` also outputs the activation's result, which then has two readers.
onnx::ModelProto residual_model(const std::string& act, const std::vector<std::int64_t>& r_dims,
                                const std::vector<std::int64_t>& y_dims, bool r_first,
                                bool expose_h) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {2, 3, 4});
  add_value(g->mutable_input(), "res", r_dims);
  add_value(g->mutable_output(), "y", y_dims);
  if (expose_h) add_value(g->mutable_output(), "h", {2, 3, 5});
  add_conv_init(g, "W", {4, 5}, 7, false);
  add_conv_init(g, "Z", {5}, 5, false);
  add_node(g, "MatMul", {"x", "W"}, {"mm"}, "matmul");
  add_node(g, "Add", {"Z", "mm"}, {act.empty() ? "h" : "a"}, "bias");
  if (act == "Relu") add_node(g, "Relu", {"a"}, {"h"}, "relu");
  add_node(g, "Add",
           r_first ? std::vector<std::string>{"res", "h"} : std::vector<std::string>{"h", "res"},
           {"y"}, "residual");
  return m;
}

}  // namespace

TEST_CASE("a residual Add after a MatMulAdd joins it as a fourth input, with the same values",
          "[exec]") {
  std::vector<float> xs(24);
  for (std::size_t i = 0; i < xs.size(); ++i)
    xs[i] = static_cast<float>(static_cast<int>(i * 5 % 19) - 9) / 4;
  struct Shape {
    std::vector<std::int64_t> r, y;  ///< the residual's dims and the output's
  };
  // Shaped as the product (oneDNN's binary post-op), one value per column, and one that widens
  // the output (both the kernel's general path).
  const std::vector<Shape> shapes{
      {{2, 3, 5}, {2, 3, 5}}, {{5}, {2, 3, 5}}, {{2, 2, 3, 5}, {2, 2, 3, 5}}};
  for (const std::string act : {"", "Relu"})
    for (const Shape& sh : shapes)
      for (bool r_first : {false, true})
        for (bool expose : {false, true}) {
          INFO("activation '" << act << "', residual rank " << sh.r.size() << ", first " << r_first
                              << ", h a graph output: " << expose);
          fs::path d = temp_dir("matmul_residual");
          const onnx::ModelProto m = residual_model(act, sh.r, sh.y, r_first, expose);
          auto mm = load(write_model(d, m));
          Backends b = cpu();
          auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
          REQUIRE(ex.ok());
          std::int64_t rn = 1;
          for (auto v : sh.r) rn *= v;
          std::vector<float> rs(static_cast<std::size_t>(rn));
          for (std::size_t i = 0; i < rs.size(); ++i)
            rs[i] = static_cast<float>(static_cast<int>(i * 7 % 23) - 11) / 8;
          auto out = (*ex)->run({f32({2, 3, 4}, xs), f32(sh.r, rs, "res")});
          REQUIRE(out.ok());
          const std::vector<double> w = init_values(m, "W"), z = init_values(m, "Z");
          REQUIRE((*out)[0].dims == sh.y);
          const std::size_t outer = sh.y.size() == 4 ? 2 : 1;
          for (std::size_t o = 0; o < outer; ++o)
            for (std::size_t r = 0; r < 6; ++r)
              for (std::size_t j = 0; j < 5; ++j) {
                double v = z[j];
                for (std::size_t k = 0; k < 4; ++k) v += double(xs[r * 4 + k]) * w[k * 5 + j];
                if (act == "Relu") v = std::max(v, 0.0);
                v += rs.size() == 5 ? rs[j] : rs[(o * 6 + r) * 5 + j];
                CHECK((*out)[0].as<float>()[(o * 6 + r) * 5 + j] == Approx(v).margin(1e-5));
              }
          const auto& by_op = (*ex)->stats().by_op;
          CHECK(by_op.at("hp.nn.MatMulAdd").nodes == 1);
          // The residual Add is gone unless the activation's result is read elsewhere too.
          CHECK(by_op.count("Add") == (expose ? 1u : 0u));
          fs::remove_all(d);
        }
}

TEST_CASE("a MatMulAdd whose Z holds one value per row, not per column, adds it per row",
          "[exec]") {
  // x [2, 5, 4] @ W [4, 5] + Z [5, 1]: Z has as many values as the product has columns, but they
  // broadcast along the rows; the kernel's bias path (one value per column) must not take it.
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {2, 5, 4});
  add_value(g->mutable_output(), "y", {2, 5, 5});
  add_conv_init(g, "W", {4, 5}, 7, false);
  add_conv_init(g, "Z", {5, 1}, 5, false);
  add_node(g, "MatMul", {"x", "W"}, {"mm"}, "matmul");
  add_node(g, "Add", {"mm", "Z"}, {"y"}, "add");
  fs::path d = temp_dir("matmul_row_z");
  auto mm = load(write_model(d, m));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  std::vector<float> xs(40);
  for (std::size_t i = 0; i < xs.size(); ++i)
    xs[i] = static_cast<float>(static_cast<int>(i * 5 % 19) - 9) / 4;
  auto out = (*ex)->run({f32({2, 5, 4}, xs)});
  REQUIRE(out.ok());
  REQUIRE((*out)[0].dims == std::vector<std::int64_t>{2, 5, 5});
  const std::vector<double> w = init_values(m, "W"), z = init_values(m, "Z");
  for (std::size_t r = 0; r < 10; ++r)
    for (std::size_t j = 0; j < 5; ++j) {
      double v = z[r % 5];  // Z[row][0]
      for (std::size_t k = 0; k < 4; ++k) v += double(xs[r * 4 + k]) * w[k * 5 + j];
      CHECK((*out)[0].as<float>()[r * 5 + j] == Approx(v).margin(1e-5));
    }
  CHECK((*ex)->stats().by_op.at("hp.nn.MatMulAdd").nodes == 1);
  fs::remove_all(d);
}
