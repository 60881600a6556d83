// The gradient checks of the training tests: the float64 one (hp/train/gradcheck.h, as hp verify
// --grad runs it) on a model saved to a file, and a float32 one, a gradient model run through the
// executor and the cpu backend against central differences of its own loss, for ops the float64
// check cannot run (train_autodiff_test.cpp, train_rules_test.cpp, train_control_grad_test.cpp).
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/train/autodiff.h"
#include "hp/train/gradcheck.h"
#include "train_graph_builder.h"

namespace hp::test {

/// Mean squared error on output "y".
inline train::GradSpec mse_on_y() {
  train::GradSpec spec;
  spec.logits = "y";
  spec.loss = train::LossKind::mse;
  return spec;
}

/// Gradients of `b` (output "y", mean squared error against generated targets), saved as
/// `dir`/`name`.onnx, against float64 central differences along four random directions.
inline void check_float64(Builder& b, const std::filesystem::path& dir, const std::string& name) {
  std::filesystem::create_directories(dir);
  train::GradCheckOptions o;
  o.model = dir / (name + ".onnx");
  {
    std::ofstream out(o.model, std::ios::binary);
    b.m.SerializeToOstream(&out);
  }
  o.grad = mse_on_y();
  o.threads = 1;
  o.directions = 4;
  auto r = train::check_gradients(o);
  INFO(name << ": " << (r ? r->text() : r.error().str()));
  REQUIRE(r);
  CHECK(r->ok());
  CHECK(r->worst() < 1e-6);
}

/// Checks the gradient model of `b` against central differences of its own loss along random
/// directions, one trainable tensor at a time.
inline void check_against_differences(Builder& b, const train::GradSpec& spec,
                                      std::vector<exec::HostTensor> inputs) {
  auto gg = train::build_grad_graph(b.model(), spec);
  INFO((gg ? std::string() : gg.error().str()));
  REQUIRE(gg);
  auto be = exec::open_backends("cpu", 1, {});
  REQUIRE(be);
  auto ex = exec::Executor::create(gg->model, {be->primary, be->cpu, nullptr});
  INFO((ex ? std::string() : ex.error().str()));
  REQUIRE(ex);
  auto base = (*ex)->run(inputs);
  INFO((base ? std::string() : base.error().str()));
  REQUIRE(base);
  std::mt19937 rng(11);
  for (std::size_t p = 0; p < gg->params.size(); ++p) {
    auto w = (*ex)->weight(gg->params[p]);
    REQUIRE(w);
    const exec::HostTensor& g = (*base)[p + 1];
    REQUIRE(g.numel() == w->numel());
    exec::HostTensor d = tensor(w->dims, HP_F32, rng);
    double analytic = 0, norm = 0;
    for (std::int64_t k = 0; k < d.numel(); ++k)
      norm += double(d.as<float>()[k]) * d.as<float>()[k];
    for (std::int64_t k = 0; k < d.numel(); ++k) {
      d.as<float>()[k] = static_cast<float>(d.as<float>()[k] / std::sqrt(norm));
      analytic += double(g.as<float>()[k]) * d.as<float>()[k];
    }
    const double eps = 1e-2;
    auto loss_at = [&](double s) {
      exec::HostTensor moved = *w;
      for (std::int64_t k = 0; k < d.numel(); ++k)
        moved.as<float>()[k] = static_cast<float>(w->as<float>()[k] + s * d.as<float>()[k]);
      REQUIRE((*ex)->set_weight(gg->params[p], moved));
      auto r = (*ex)->run(inputs);
      REQUIRE(r);
      return double((*r)[0].as<float>()[0]);
    };
    const double numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    REQUIRE((*ex)->set_weight(gg->params[p], *w));
    INFO(gg->params[p] << ": analytic " << analytic << " numeric " << numeric);
    CHECK(std::abs(analytic - numeric) <= 2e-3 + 2e-2 * std::abs(numeric));
  }
}

}  // namespace hp::test
