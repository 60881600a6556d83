// Weights lent by a WeightSource (Executor::set_weight_source, libs/exec/src/exec_gather.cpp), what
// ZeRO-3 runs on: the executor holds a group only during its uses, asks for the next use's group
// when one begins, and computes what it computes with its own copies.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <cstring>
#include <string>
#include <vector>

#include "exec_test_util.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"

using namespace hp;
using namespace hp::exec;
using namespace hp::exec::test;

namespace {

constexpr int kN = 64;        // weights are kN x kN
constexpr int kFillers = 60;  // nodes between the "forward" and the "backward" reads

std::vector<float> weight_values(int seed) {
  std::vector<float> v(kN * kN);
  for (int i = 0; i < kN * kN; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<float>((i * 7 + seed * 13) % 17 - 8) / 64.f;
  return v;
}

// A forward and a backward in miniature: x @ W1 @ W2 @ W3, a long chain of element-wise nodes, then
// the result through Transpose(W3), Transpose(W2), Transpose(W1). Each weight is read twice, far
// apart: two uses.
onnx::ModelProto forward_backward() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {2, kN});
  add_value(g->mutable_output(), "y", {2, kN});
  for (int w = 1; w <= 3; ++w) add_f32_init(g, "W" + std::to_string(w), {kN, kN}, weight_values(w));
  add_node(g, "MatMul", {"x", "W1"}, {"a1"}, "mm1");
  add_node(g, "MatMul", {"a1", "W2"}, {"a2"}, "mm2");
  add_node(g, "MatMul", {"a2", "W3"}, {"f0"}, "mm3");
  for (int i = 0; i < kFillers; ++i)  // Neg twice is the identity
    add_node(g, "Neg", {"f" + std::to_string(i)}, {"f" + std::to_string(i + 1)},
             "neg" + std::to_string(i));
  std::string h = "f" + std::to_string(kFillers);
  for (int w = 3; w >= 1; --w) {
    const std::string W = "W" + std::to_string(w);
    add_node(g, "Transpose", {W}, {W + "t"}, "t" + std::to_string(w));
    const std::string out = w == 1 ? "y" : "b" + std::to_string(w);
    add_node(g, "MatMul", {h, W + "t"}, {out}, "bm" + std::to_string(w));
    h = out;
  }
  return m;
}

/// Hands out its copies of the weights and records the calls: "P<g>" prefetch, "F<g>" fetch.
struct FakeSource : WeightSource {
  std::vector<std::vector<std::vector<float>>> groups;
  std::vector<std::string> calls;
  bool fail = false;
  void prefetch(std::size_t g) override { calls.push_back("P" + std::to_string(g)); }
  Status fetch(std::size_t g, std::span<float* const> dst) override {
    calls.push_back("F" + std::to_string(g));
    if (fail) return Error(Errc::runtime, "the gather failed");
    REQUIRE(dst.size() == groups.at(g).size());
    for (std::size_t i = 0; i < dst.size(); ++i)
      std::memcpy(dst[i], groups[g][i].data(), groups[g][i].size() * sizeof(float));
    return {};
  }
};

std::vector<float> input() {
  std::vector<float> x(2 * kN);
  for (int i = 0; i < 2 * kN; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(i % 9) - 4.f;
  return x;
}

/// Equal up to rounding: the executor's own weights may be read through packed copies.
void check_close(const HostTensor& got, const HostTensor& want) {
  REQUIRE(got.numel() == want.numel());
  for (std::int64_t i = 0; i < got.numel(); ++i)
    CHECK(got.as<float>()[i] == Approx(want.as<float>()[i]).epsilon(1e-5).margin(1e-6));
}

}  // namespace

TEST_CASE("weights from a source: each use fetched, the next asked for, the result unchanged",
          "[exec]") {
  fs::path d = temp_dir("gather");
  auto mm = load(write_model(d, forward_backward()));
  Backends b = cpu();
  auto own = Executor::create(mm, {b.primary, b.cpu, nullptr});
  auto lent = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(own.ok());
  REQUIRE(lent.ok());
  FakeSource src;
  for (int w = 1; w <= 3; ++w) src.groups.push_back({weight_values(w)});
  REQUIRE((*lent)->set_weight_source(&src, {{"W1"}, {"W2"}, {"W3"}}).ok());
  // The order a run asks in, known before it runs (what ranks compare before their gathers).
  CHECK((*lent)->weight_source_order() == std::vector<std::size_t>{0, 1, 2, 2, 1, 0});
  CHECK((*own)->weight_source_order().empty());
  const HostTensor x = f32({2, kN}, input());
  auto want = (*own)->run({x});
  REQUIRE(want.ok());
  for (int run = 0; run < 2; ++run) {
    src.calls.clear();
    auto got = (*lent)->run({x});
    REQUIRE(got.ok());
    check_close((*got)[0], (*want)[0]);
    // Uses in node order: W1, W2, W3 forward, W3, W2, W1 backward. The next use's group is asked
    // for before the current one is waited for.
    CHECK(src.calls == std::vector<std::string>{"P0", "P1", "F0", "P2", "F1", "P2", "F2", "P1",
                                                "F2", "P0", "F1", "F0"});
    CHECK((*lent)->stats().gathers == 6);
  }
  // The whole point: the weights (and a cached transpose of each) are not held throughout.
  (void)(*own)->run({x});
  CHECK((*lent)->stats().peak_bytes < (*own)->stats().peak_bytes);
  CHECK((*own)->stats().gathers == 0);
  // A lent weight is the source's to hold.
  CHECK((*lent)->host_weight("W1") == nullptr);
  CHECK(!(*lent)->weight("W2").ok());
  CHECK(!(*lent)->set_weight("W3", f32({kN, kN}, weight_values(3))).ok());
}

TEST_CASE("a failed fetch fails the run; the next run starts clean", "[exec]") {
  fs::path d = temp_dir("gather_fail");
  auto mm = load(write_model(d, forward_backward()));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  FakeSource src;
  for (int w = 1; w <= 3; ++w) src.groups.push_back({weight_values(w)});
  REQUIRE((*ex)->set_weight_source(&src, {{"W1", "W2"}, {"W3"}}).ok());
  const HostTensor x = f32({2, kN}, input());
  src.fail = true;
  auto bad = (*ex)->run({x});
  REQUIRE(!bad.ok());
  CHECK(bad.error().message().find("the gather failed") != std::string::npos);
  src.fail = false;
  src.groups = {{weight_values(1), weight_values(2)}, {weight_values(3)}};
  auto own = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(own.ok());
  auto want = (*own)->run({x});
  auto got = (*ex)->run({x});
  REQUIRE(want.ok());
  REQUIRE(got.ok());
  check_close((*got)[0], (*want)[0]);
}

TEST_CASE("set_weight_source refuses what it cannot lend", "[exec]") {
  fs::path d = temp_dir("gather_errors");
  auto mm = load(write_model(d, forward_backward()));
  Backends b = cpu();
  FakeSource src;
  auto fresh = [&] {
    auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
    REQUIRE(ex.ok());
    return std::move(*ex);
  };
  CHECK(fresh()->set_weight_source(&src, {{"W1"}, {"nope"}}).error().code == Errc::bad_input);
  CHECK(fresh()->set_weight_source(&src, {{"W1"}, {"W1"}}).error().code == Errc::bad_input);
  CHECK(fresh()->set_weight_source(nullptr, {{"W1"}}).error().code == Errc::bad_input);
  auto ran = fresh();
  REQUIRE(ran->run({f32({2, kN}, input())}).ok());
  CHECK(ran->set_weight_source(&src, {{"W1"}}).error().code == Errc::bad_input);
  auto twice = fresh();
  REQUIRE(twice->set_weight_source(&src, {{"W1"}}).ok());
  CHECK(twice->set_weight_source(&src, {{"W2"}}).error().code == Errc::bad_input);
}
