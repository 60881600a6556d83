// The optimizers against torch.optim: tests/data/train/optim_reference.json holds torch 1.13's
// AdamW and SGD (momentum, weight decay, clip_grad_norm_, a warm-up + cosine learning rate) over 5
// steps on fixed tensors (make_optim_reference.py), and every weight and state value after every
// step must agree to float rounding. Also the schedules' values, the gradient norm, and the errors
// that must leave everything untouched.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "hp/plugin/hp_plugin.h"
#include "hp/train/optimizer.h"

using namespace hp;
using namespace hp::train;
using exec::HostTensor;
using nlohmann::json;

namespace {

HostTensor f32(std::vector<std::int64_t> dims, const std::vector<float>& v, std::string name = "") {
  HostTensor t;
  t.name = std::move(name);
  t.dtype = HP_F32;
  t.dims = std::move(dims);
  t.data.resize(v.size() * 4);
  if (!v.empty()) std::memcpy(t.data.data(), v.data(), t.data.size());  // empty: data() may be null
  return t;
}

std::vector<float> values(const HostTensor& t) {
  std::vector<float> v(t.data.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

json reference() {
  std::ifstream in(std::string(HP_SOURCE_DIR) + "/tests/data/train/optim_reference.json");
  REQUIRE(in);
  return json::parse(in);
}

OptimizerConfig config_of(const json& c) {
  OptimizerConfig o;
  o.kind = *parse_optimizer_kind(c.at("kind").get<std::string>());
  o.lr = c.at("lr");
  o.beta1 = c.at("beta1");
  o.beta2 = c.at("beta2");
  o.eps = c.at("eps");
  o.weight_decay = c.at("weight_decay");
  o.momentum = c.at("momentum");
  o.clip_norm = c.at("clip_norm");
  o.schedule = *parse_lr_schedule(c.at("schedule").get<std::string>());
  o.warmup_steps = c.at("warmup_steps");
  o.total_steps = c.at("total_steps");
  o.min_lr = c.at("min_lr");
  return o;
}

std::vector<HostTensor> tensors(const json& shapes, const json& lists) {
  std::vector<HostTensor> out;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    out.push_back(f32(shapes[i].get<std::vector<std::int64_t>>(),
                      lists[i].get<std::vector<float>>(), "p" + std::to_string(i)));
  return out;
}

/// Largest |a - b| / max(|b|, 1) over the tensors: relative, with a floor at the scale of the
/// inputs (all O(1) here). The floor matters where a value is a difference of O(1) terms (a
/// momentum buffer whose decayed part and gradient cancel): torch's CPU kernels are built with FMA
/// contraction, hp's loops are not, so such a value differs by an ulp of the terms, not of itself.
double max_rel_diff(const std::vector<HostTensor>& got, const json& want) {
  double worst = 0;
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    auto g = values(got[i]);
    auto w = want[i].get<std::vector<double>>();
    REQUIRE(g.size() == w.size());
    for (std::size_t k = 0; k < g.size(); ++k)
      worst = std::max(worst, std::abs(g[k] - w[k]) / std::max(std::abs(w[k]), 1.0));
  }
  return worst;
}

}  // namespace

TEST_CASE("optimizer steps match torch.optim over 5 steps", "[train][optimizer]") {
  const json ref = reference();
  REQUIRE(ref.at("cases").size() == 4);
  for (const json& c : ref.at("cases")) {
    const std::string name = c.at("name");
    INFO("case " << name);
    const OptimizerConfig cfg = config_of(c.at("config"));
    std::vector<HostTensor> params = tensors(c.at("shapes"), c.at("params0"));
    OptimizerState state;
    for (std::size_t k = 0; k < c.at("steps").size(); ++k) {
      INFO("step " << k + 1);
      const json& want = c.at("steps")[k];
      std::vector<HostTensor> grads = tensors(c.at("shapes"), c.at("grads")[k]);
      auto info = optimizer_step(cfg, params, grads, state);
      REQUIRE(info.ok());
      CHECK(state.step == static_cast<std::int64_t>(k + 1));
      CHECK(info->lr == Approx(want.at("lr").get<double>()).epsilon(1e-12));
      CHECK(info->grad_norm == Approx(want.at("grad_norm").get<double>()).epsilon(1e-6));
      if (cfg.clip_norm > 0) {
        // Every reference case with clipping has gradients well above the threshold.
        CHECK(info->clip_scale < 1);
        CHECK(global_norm(grads) == Approx(cfg.clip_norm).epsilon(1e-5));
      } else {
        CHECK(info->clip_scale == 1);
      }
      CHECK(max_rel_diff(params, want.at("params")) < 1e-6);
      if (want.contains("exp_avg")) CHECK(max_rel_diff(state.exp_avg, want.at("exp_avg")) < 1e-6);
      if (want.contains("exp_avg_sq"))
        CHECK(max_rel_diff(state.exp_avg_sq, want.at("exp_avg_sq")) < 1e-6);
      if (!want.contains("exp_avg")) CHECK(state.exp_avg.empty());
    }
  }
}

TEST_CASE("learning-rate schedules", "[train][optimizer]") {
  OptimizerConfig c;
  c.lr = 6e-4;
  CHECK(learning_rate(c, 1) == 6e-4);
  CHECK(learning_rate(c, 1000000) == 6e-4);
  c.schedule = LrSchedule::cosine;
  c.warmup_steps = 10;
  c.total_steps = 110;
  c.min_lr = 6e-5;
  CHECK(learning_rate(c, 1) == Approx(6e-5));  // lr / warmup
  CHECK(learning_rate(c, 5) == Approx(3e-4));
  CHECK(learning_rate(c, 10) == Approx(6e-4));  // the peak at the last warm-up step
  CHECK(learning_rate(c, 11) == Approx(6e-5 + 0.5 * 5.4e-4 * (1 + std::cos(M_PI * 0.01))));
  CHECK(learning_rate(c, 60) == Approx(6e-5 + 0.5 * 5.4e-4));  // half way: the mean
  CHECK(learning_rate(c, 110) == Approx(6e-5));
  CHECK(learning_rate(c, 500) == Approx(6e-5));  // floor after total_steps
  // Monotone decay after the warm-up.
  for (std::int64_t s = 11; s < 110; ++s) CHECK(learning_rate(c, s + 1) < learning_rate(c, s));
  c.warmup_steps = 0;
  CHECK(learning_rate(c, 1) == Approx(6e-5 + 0.5 * 5.4e-4 * (1 + std::cos(M_PI / 110))));
  c.warmup_steps = 4;
  c.total_steps = 0;  // no decay phase
  CHECK(learning_rate(c, 2) == Approx(3e-4));
  CHECK(learning_rate(c, 50) == 6e-4);

  CHECK(parse_lr_schedule("cosine").ok());
  auto bad = parse_lr_schedule("linear");
  REQUIRE(!bad.ok());
  CHECK(bad.error().code == Errc::bad_input);
  CHECK(bad.error().message().find("'linear'") != std::string::npos);
  CHECK(!parse_optimizer_kind("adam").ok());
  CHECK(*parse_optimizer_kind("sgd") == OptimizerKind::sgd);
}

TEST_CASE("global_norm is the norm of all gradients as one vector", "[train][optimizer]") {
  std::vector<HostTensor> g = {f32({2}, {3, 0}), f32({1, 1}, {4}), f32({0}, {})};
  CHECK(global_norm(g) == 5.0);
  // Seventeen values exercise the unrolled loop and its tail.
  std::vector<float> many(17, 2.0f);
  CHECK(global_norm({f32({17}, many)}) == Approx(std::sqrt(17.0 * 4)));
}

TEST_CASE("a non-finite gradient norm fails the step and changes nothing", "[train][optimizer]") {
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    OptimizerConfig c;
    c.clip_norm = 1.0;
    std::vector<HostTensor> params = {f32({2}, {1, 2}, "w"), f32({1}, {3}, "b")};
    std::vector<HostTensor> grads = {f32({2}, {0.5f, 0.5f}), f32({1}, {1})};
    OptimizerState state;
    REQUIRE(optimizer_step(c, params, grads, state).ok());
    const auto p_before = params;
    const auto g2 = std::vector<HostTensor>{f32({2}, {100, 100}), f32({1}, {bad})};
    auto grads2 = g2;
    const auto m_before = state.exp_avg;
    auto r = optimizer_step(c, params, grads2, state);
    REQUIRE(!r.ok());
    CHECK(r.error().code == Errc::runtime);
    CHECK(r.error().message().find("step 2") != std::string::npos);
    CHECK(state.step == 1);
    for (std::size_t i = 0; i < 2; ++i) {
      CHECK(params[i].data == p_before[i].data);
      CHECK(state.exp_avg[i].data == m_before[i].data);
      CHECK(std::memcmp(grads2[i].data.data(), g2[i].data.data(), g2[i].data.size()) == 0);
    }
  }
}

TEST_CASE("mismatched parameters, gradients and states are bad input", "[train][optimizer]") {
  OptimizerConfig c;
  std::vector<HostTensor> params = {f32({2}, {1, 2}, "w")};
  OptimizerState state;
  auto expect_bad = [&](std::vector<HostTensor> p, std::vector<HostTensor> g, OptimizerState s,
                        const std::string& needle) {
    auto r = optimizer_step(c, p, g, s);
    REQUIRE(!r.ok());
    CHECK(r.error().code == Errc::bad_input);
    INFO(r.error().str());
    CHECK(r.error().message().find(needle) != std::string::npos);
  };
  expect_bad(params, {}, state, "0 gradients for 1 parameters");
  expect_bad(params, {f32({3}, {1, 2, 3})}, state, "gradient of 'w' has dims [3]");
  HostTensor f64 = f32({1}, {0, 0});  // 8 bytes: one f64
  f64.dtype = HP_F64;
  expect_bad({f64}, {f64}, state, "f32 only");
  HostTensor short_data = f32({2}, {1});
  expect_bad(params, {short_data}, state, "has 4 bytes");
  OptimizerState wrong;
  wrong.exp_avg = {f32({2}, {0, 0})};
  expect_bad(params, {f32({2}, {1, 1})}, wrong, "exp_avg or exp_avg_sq but not both");
  wrong.exp_avg_sq = {f32({1}, {0})};
  expect_bad(params, {f32({2}, {1, 1})}, wrong, "exp_avg_sq of 'w' has dims [1]");
  wrong.exp_avg_sq = {f32({2}, {0, 0}), f32({2}, {0, 0})};
  expect_bad(params, {f32({2}, {1, 1})}, wrong, "2 exp_avg_sq tensors for 1 parameters");
}

TEST_CASE("plain SGD keeps no state; momentum SGD starts its buffer from the gradient",
          "[train][optimizer]") {
  OptimizerConfig c;
  c.kind = OptimizerKind::sgd;
  c.lr = 0.5;
  c.weight_decay = 0;
  std::vector<HostTensor> params = {f32({2}, {1, 2})};
  std::vector<HostTensor> grads = {f32({2}, {2, -4})};
  OptimizerState state;
  REQUIRE(optimizer_step(c, params, grads, state).ok());
  CHECK(values(params[0]) == std::vector<float>{0, 4});
  CHECK(state.exp_avg.empty());
  c.momentum = 0.5;
  grads = {f32({2}, {2, -4})};
  REQUIRE(optimizer_step(c, params, grads, state).ok());
  CHECK(values(state.exp_avg[0]) == std::vector<float>{2, -4});  // buf = g on its first step
  CHECK(values(params[0]) == std::vector<float>{-1, 6});
  grads = {f32({2}, {2, -4})};
  REQUIRE(optimizer_step(c, params, grads, state).ok());
  CHECK(values(state.exp_avg[0]) == std::vector<float>{3, -6});  // 0.5 * buf + g
  CHECK(values(params[0]) == std::vector<float>{-2.5f, 9});
}

TEST_CASE("threads and a mirror give the same bits as one thread", "[train][optimizer]") {
  // Tensors of uneven sizes (past the 64K elements below which one thread runs), so the threads'
  // shares split tensors in the middle; clipping on, so the norm, the clipping and the update all
  // run threaded.
  const std::vector<std::int64_t> sizes = {70001, 3, 40000, 1};
  auto fill = [&](float a, float b, float scale) {
    std::vector<HostTensor> ts;
    for (std::int64_t n : sizes) {
      std::vector<float> v;
      for (std::int64_t i = 0; i < n; ++i)
        v.push_back(std::sin(a * static_cast<float>(i) + b) * scale);
      ts.push_back(f32({n}, v));
    }
    return ts;
  };
  for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::sgd}) {
    OptimizerConfig c;
    c.kind = kind;
    c.momentum = 0.9;
    c.clip_norm = 1.0;
    std::vector<HostTensor> p1 = fill(0.37f, 0.f, 1.f), p3 = p1;
    OptimizerState s1, s3;
    for (int step = 0; step < 2; ++step) {  // the second step reads the first's state
      std::vector<HostTensor> g1 = fill(0.11f, static_cast<float>(step), 3.f), g3 = g1;
      c.threads = 1;
      auto one = optimizer_step(c, p1, g1, s1);
      REQUIRE(one);
      c.threads = 3;
      std::vector<std::vector<float>> copies(sizes.size());
      Mirror m;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        copies[k].assign(static_cast<std::size_t>(sizes[k]), -7.f);
        m.to.push_back(k == 1 ? nullptr : copies[k].data());  // a parameter without a mirror
      }
      auto three = optimizer_step(c, p3, g3, s3, global_norm(g3, 3), m);
      REQUIRE(three);
      CHECK(one->grad_norm == three->grad_norm);
      CHECK(one->clip_scale == three->clip_scale);
      CHECK(one->clip_scale < 1);
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        CHECK(values(p1[k]) == values(p3[k]));
        CHECK(values(s1.exp_avg[k]) == values(s3.exp_avg[k]));
        if (kind == OptimizerKind::adamw)
          CHECK(values(s1.exp_avg_sq[k]) == values(s3.exp_avg_sq[k]));
        if (k != 1) CHECK(copies[k] == values(p3[k]));
      }
      CHECK(copies[1] == std::vector<float>(3, -7.f));
    }
  }
}
