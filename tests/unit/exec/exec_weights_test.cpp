// Writing a weight in place (Executor::host_weight / weight_written,
// libs/exec/src/exec_weights.cpp): what a training step's optimizer does instead of set_weight. The
// next run must see the new values through a node cached from the weight (a Transpose) and through
// a MatMul whose B the backend may keep packed.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <filesystem>

#include "exec_test_util.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"

using namespace hp;
using namespace hp::exec;
using namespace hp::exec::test;

namespace {

// y = x @ Transpose(W) + x @ V, x [2, 3], W [4, 3], V [3, 4].
onnx::ModelProto two_weights() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {2, 3});
  add_value(g->mutable_output(), "y", {2, 4});
  add_f32_init(g, "W", {4, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1});
  add_f32_init(g, "V", {3, 4}, std::vector<float>(12, 0.5f));
  add_node(g, "Transpose", {"W"}, {"wt"}, "t");
  add_node(g, "MatMul", {"x", "wt"}, {"a"}, "mm_w");
  add_node(g, "MatMul", {"x", "V"}, {"b"}, "mm_v");
  add_node(g, "Add", {"a", "b"}, {"y"}, "add");
  return m;
}

// x @ W^T + x @ V for the given W and V.
std::vector<float> expected(const std::vector<float>& x, const std::vector<float>& w,
                            const std::vector<float>& v) {
  std::vector<float> y(8, 0.f);
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 3; ++k) y[r * 4 + j] += x[r * 3 + k] * (w[j * 3 + k] + v[k * 4 + j]);
  return y;
}

}  // namespace

TEST_CASE("a weight written in place is what the next run reads", "[exec]") {
  fs::path d = temp_dir("weights_in_place");
  auto mm = load(write_model(d, two_weights()));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  Executor& e = **ex;
  CHECK(e.host_weight("W") == nullptr);  // not in the executor's memory before the first run
  const std::vector<float> x = {1, 2, 3, -1, 0.5f, 2};
  std::vector<float> w = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}, v(12, 0.5f);
  auto run = [&] {
    auto out = e.run({f32({2, 3}, x)});
    REQUIRE(out.ok());
    const auto want = expected(x, w, v);
    for (std::size_t i = 0; i < want.size(); ++i)
      CHECK((*out)[0].as<float>()[i] == Approx(want[i]).margin(1e-5));
  };
  run();
  run();  // the Transpose cached, V possibly packed
  float* pw = e.host_weight("W");
  float* pv = e.host_weight("V");
  REQUIRE(pw);
  REQUIRE(pv);
  CHECK(std::vector<float>(pw, pw + 12) == w);
  for (std::size_t i = 0; i < 12; ++i) {
    w[i] = pw[i] = static_cast<float>(i) - 5.f;
    v[i] = pv[i] = 0.25f * static_cast<float>(i % 5);
  }
  REQUIRE(e.weight_written("W").ok());
  REQUIRE(e.weight_written("V").ok());
  run();
  CHECK(e.weight("W")->as<float>()[11] == 6.f);
  CHECK(e.host_weight("x") == nullptr);
  CHECK(e.host_weight("nope") == nullptr);
  auto bad = e.weight_written("nope");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == Errc::bad_input);
  fs::remove_all(d);
}
