// The training loop (libs/train/src/trainer.cpp) on the bundled tiny MLP with an mse loss: metrics
// lines, a divergence that stops the run with the step named while the last checkpoint stays, and
// resume equality (4 steps == 2 + 2, bit for bit).
#include <catch2/catch.hpp>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "hp/exec/tensor.h"
#include "hp/plugin/hp_plugin.h"
#include "hp/train/checkpoint.h"
#include "hp/train/trainer.h"

namespace fs = std::filesystem;
using namespace hp;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("hp_train_loop_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

exec::HostTensor randn(std::vector<std::int64_t> dims, const std::string& name, unsigned seed) {
  exec::HostTensor t;
  t.name = name;
  t.dtype = HP_F32;
  t.dims = std::move(dims);
  t.data.resize(static_cast<std::size_t>(t.numel()) * 4);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  for (std::int64_t k = 0; k < t.numel(); ++k) t.as<float>()[k] = nd(rng);
  return t;
}

train::TrainOptions mlp_options(const fs::path& dir) {
  fs::path inputs = dir / "inputs";
  REQUIRE(exec::write_tensor_dir(inputs, {randn({4, 32}, "x", 1), randn({4, 10}, "labels", 2)},
                                 "input"));
  train::TrainOptions o;
  o.model = fs::path(HP_SOURCE_DIR) / "tests/data/models/tiny-mlp.onnx";
  o.grad.loss = train::LossKind::mse;
  o.grad.logits = "output";
  o.inputs_dir = inputs;
  o.optimizer.kind = train::OptimizerKind::adamw;
  o.optimizer.lr = 1e-2;
  o.threads = 1;
  return o;
}

std::vector<std::string> lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE("training writes a metrics line per step and lowers the loss", "[train]") {
  fs::path d = fresh_dir("metrics");
  auto o = mlp_options(d);
  o.steps = 6;
  o.metrics = d / "m.jsonl";
  o.save_model = d / "trained.onnx";
  auto r = train::train(o);
  INFO((r ? std::string() : r.error().str()));
  REQUIRE(r);
  REQUIRE(r->steps.size() == 6);
  CHECK(r->steps.back().loss < r->steps.front().loss);
  CHECK(r->peak_bytes > 0);
  auto ls = lines(o.metrics);
  REQUIRE(ls.size() == 6);
  CHECK(ls[0].find("\"step\":1") != std::string::npos);
  CHECK(ls[5].find("\"tokens_per_second\"") != std::string::npos);
  CHECK(ls[5].find("\"peak_bytes\"") != std::string::npos);
  CHECK(fs::exists(o.save_model));
  CHECK_FALSE(fs::exists(d / "m.jsonl.tmp"));
}

TEST_CASE("a diverging run stops at the step it diverged and keeps the last checkpoint",
          "[train]") {
  fs::path d = fresh_dir("diverge");
  auto o = mlp_options(d);
  o.optimizer.kind = train::OptimizerKind::sgd;
  o.optimizer.lr = 1e30;  // the first update throws the weights far enough to overflow
  o.optimizer.weight_decay = 0;
  o.steps = 5;
  o.checkpoint_dir = d / "ckpt";
  o.checkpoint_every = 1;
  o.metrics = d / "m.jsonl";
  auto r = train::train(o);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::runtime);
  INFO(r.error().str());
  CHECK(r.error().message().find("step ") != std::string::npos);
  auto c = train::load_checkpoint(o.checkpoint_dir);
  REQUIRE(c);
  const auto done = static_cast<std::int64_t>(lines(o.metrics).size());
  CHECK(done >= 1);
  CHECK(c->step == done);  // the checkpoint of the last finite step, nothing after it
  CHECK(r.error().message().find("step " + std::to_string(done + 1)) != std::string::npos);
}

TEST_CASE("2 + 2 steps with a resume equal 4 steps bit for bit", "[train]") {
  fs::path d = fresh_dir("resume");
  auto o = mlp_options(d);
  o.steps = 4;
  o.save_model = d / "four.onnx";
  auto four = train::train(o);
  REQUIRE(four);
  o.steps = 2;
  o.save_model.clear();
  o.checkpoint_dir = d / "ckpt";
  REQUIRE(train::train(o));
  o.resume_dir = o.checkpoint_dir;
  o.checkpoint_dir.clear();
  o.save_model = d / "resumed.onnx";
  auto rest = train::train(o);
  REQUIRE(rest);
  REQUIRE(rest->steps.size() == 2);
  CHECK(rest->first_step == 3);
  CHECK(rest->steps[0].loss == four->steps[2].loss);
  CHECK(rest->steps[1].loss == four->steps[3].loss);
  std::ifstream a(d / "four.onnx", std::ios::binary), b(d / "resumed.onnx", std::ios::binary);
  std::string sa((std::istreambuf_iterator<char>(a)), {}),
      sb((std::istreambuf_iterator<char>(b)), {});
  CHECK(sa == sb);
}
