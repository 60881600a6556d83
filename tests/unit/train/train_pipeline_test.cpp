// Pipeline-parallel training (libs/train/src/pipeline_run.cpp, pipeline_stage.cpp) on two
// (and three) in-process ranks against one rank: the transformer of train_stage_models.h (an
// embedding tied to the head, so one weight lives on both stages) cut at the residual after
// attention, with a batch whose two micro-batches hold different numbers of ignored (-100) labels,
// so each micro-batch's loss gradient must be weighted by its share of the labels. GPipe and the
// split backward (B and W apart, ZB-H1's order) must train what one rank trains, and a checkpoint
// written by the pipeline must resume at one rank; the pipeline's refusals are checked too.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "hp/comm/comm.h"
#include "hp/train/checkpoint.h"
#include "hp/train/trainer.h"
#include "train_stage_models.h"

namespace fs = std::filesystem;
using namespace hp;
using Kind = train::PipelineAction::Kind;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("hp_train_pp_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The transformer with a symbolic batch (micro-batches are one row), written to `dir`.
train::TrainOptions options(const fs::path& dir) {
  test::Builder b = test::transformer();
  b.g()
      .mutable_input(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_param("batch");
  b.g()
      .mutable_output(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_param("batch");
  const fs::path model = dir / "model.onnx";
  std::ofstream(model, std::ios::binary) << b.m.SerializeAsString();
  exec::HostTensor ids, labels;
  ids.name = "ids", labels.name = "labels";
  ids.dtype = labels.dtype = HP_I64;
  ids.dims = labels.dims = {2, 5};
  ids.data.resize(80), labels.data.resize(80);
  for (int k = 0; k < 10; ++k) {
    ids.as<std::int64_t>()[k] = (k * 7 + 3) % 13;
    // Row 0 keeps 4 labels, row 1 keeps 1: the micro-batches weigh 4/5 and 1/5.
    labels.as<std::int64_t>()[k] = (k == 2 || k >= 6) ? -100 : (k * 5 + 1) % 13;
  }
  REQUIRE(exec::write_tensor_dir(dir / "inputs", {ids, labels}, "input"));
  train::TrainOptions o;
  o.model = model;
  o.grad.logits = "logits";
  o.grad.frozen = {"mask"};
  o.inputs_dir = dir / "inputs";
  o.optimizer.lr = 1e-2;
  o.optimizer.clip_norm = 0.5;  // clipping needs the whole model's norm
  o.steps = 3;
  o.threads = 1;
  return o;
}

// Two in-process ranks, stage k on rank k, each running `actions[k]`.
Status pipeline(const train::TrainOptions& o, bool split,
                const std::vector<std::vector<train::PipelineAction>>& actions) {
  return comm::run_in_process(2, [&](int rank, comm::Transport& t) -> Status {
    train::TrainOptions mine = o;
    mine.pp.transport = &t;
    mine.pp.ranks = {0, 1};
    mine.pp.stage = rank;
    mine.pp.micro_batches = 2;
    mine.pp.split_weight = split;
    mine.pp.cuts = {{"r1"}};
    mine.pp.actions = actions[static_cast<std::size_t>(rank)];
    HP_ASSIGN_OR_RETURN(auto rep, train::train(mine));
    (void)rep;
    return {};
  });
}

void same_weights(const fs::path& a, const fs::path& b) {
  onnx::ModelProto ma, mb;
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  REQUIRE(ma.ParseFromIstream(&fa));
  REQUIRE(mb.ParseFromIstream(&fb));
  REQUIRE(ma.graph().initializer_size() == mb.graph().initializer_size());
  for (int k = 0; k < ma.graph().initializer_size(); ++k) {
    const auto& x = ma.graph().initializer(k);
    const auto& y = mb.graph().initializer(k);
    REQUIRE(x.name() == y.name());
    REQUIRE(x.raw_data().size() == y.raw_data().size());
    const auto* p = reinterpret_cast<const float*>(x.raw_data().data());
    const auto* q = reinterpret_cast<const float*>(y.raw_data().data());
    for (std::size_t e = 0; e < x.raw_data().size() / 4; ++e) {
      INFO(x.name() << "[" << e << "]");
      CHECK(p[e] == Approx(q[e]).margin(2e-6));
    }
  }
}

const train::PipelineAction F0{Kind::forward, 0}, F1{Kind::forward, 1}, B0{Kind::backward, 0},
    B1{Kind::backward, 1}, W0{Kind::weight, 0}, W1{Kind::weight, 1};

}  // namespace

TEST_CASE("two pipeline stages train what one rank trains", "[train][pipeline]") {
  const fs::path d = fresh_dir("same");
  train::TrainOptions o = options(d);
  o.metrics = d / "one.jsonl";
  o.save_model = d / "one.onnx";
  REQUIRE(train::train(o));
  const auto want = test::metric_losses(o.metrics);
  REQUIRE(want.size() == 3);

  SECTION("gpipe") {
    o.metrics = d / "gpipe.jsonl";
    o.save_model = d / "gpipe.onnx";
    const Status st = pipeline(o, false, {{F0, F1, B0, B1}, {F0, F1, B0, B1}});
    INFO((st ? std::string() : st.error().message()));
    REQUIRE(st);
  }
  SECTION("zb-h1: B and W apart, W deferred") {
    o.metrics = d / "zb.jsonl";
    o.save_model = d / "zb.onnx";
    REQUIRE(pipeline(o, true, {{F0, F1, B0, B1, W0, W1}, {F0, B0, F1, B1, W0, W1}}));
  }
  const auto got = test::metric_losses(o.metrics);
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) CHECK(got[k] == Approx(want[k]).epsilon(1e-6));
  same_weights(d / "one.onnx", o.save_model);
  fs::remove_all(d);
}

TEST_CASE("three pipeline stages train what one rank trains", "[train][pipeline]") {
  // Cut at both residuals: the embedding tied to the head is read by stages 0 and 2, not 1, so its
  // gradient parts are summed over a group that leaves the middle stage out.
  const fs::path d = fresh_dir("three");
  train::TrainOptions o = options(d);
  o.metrics = d / "one.jsonl";
  o.save_model = d / "one.onnx";
  REQUIRE(train::train(o));
  const auto want = test::metric_losses(o.metrics);
  o.metrics = d / "three.jsonl";
  o.save_model = d / "three.onnx";
  const std::vector<std::vector<train::PipelineAction>> order = {
      {F0, F1, B0, W0, B1, W1}, {F0, F1, B0, W0, B1, W1}, {F0, B0, F1, B1, W0, W1}};
  const Status st = comm::run_in_process(3, [&](int rank, comm::Transport& t) -> Status {
    train::TrainOptions mine = o;
    mine.pp.transport = &t;
    mine.pp.ranks = {0, 1, 2};
    mine.pp.stage = rank;
    mine.pp.micro_batches = 2;
    mine.pp.split_weight = true;
    mine.pp.cuts = {{"r1"}, {"r2"}};
    mine.pp.actions = order[static_cast<std::size_t>(rank)];
    HP_ASSIGN_OR_RETURN(auto rep, train::train(mine));
    if (rank == 0) CHECK(rep.params > 0);
    return {};
  });
  INFO((st ? std::string() : st.error().message()));
  REQUIRE(st);
  const auto got = test::metric_losses(o.metrics);
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) CHECK(got[k] == Approx(want[k]).epsilon(1e-6));
  same_weights(d / "one.onnx", o.save_model);
  fs::remove_all(d);
}

TEST_CASE("a pipeline checkpoint resumes at one rank", "[train][pipeline]") {
  const fs::path d = fresh_dir("resume");
  train::TrainOptions o = options(d);
  o.save_model = d / "three.onnx";
  REQUIRE(train::train(o));
  o.steps = 2;
  o.save_model.clear();
  o.checkpoint_dir = d / "ckpt";
  REQUIRE(pipeline(o, false, {{F0, B0, F1, B1}, {F0, B0, F1, B1}}));
  o.steps = 1;
  o.checkpoint_dir.clear();
  o.resume_dir = d / "ckpt";
  o.save_model = d / "resumed.onnx";
  REQUIRE(train::train(o));
  same_weights(d / "three.onnx", d / "resumed.onnx");
  fs::remove_all(d);
}

TEST_CASE("pipeline training refuses what it cannot run", "[train][pipeline]") {
  const fs::path d = fresh_dir("refused");
  train::TrainOptions o = options(d);
  auto refused = [&](std::vector<std::string> cut, int micro) {
    Status st = comm::run_in_process(2, [&](int rank, comm::Transport& t) -> Status {
      train::TrainOptions mine = o;
      mine.pp.transport = &t;
      mine.pp.ranks = {0, 1};
      mine.pp.stage = rank;
      mine.pp.micro_batches = micro;
      mine.pp.cuts = {cut};
      mine.pp.actions = {F0, B0};
      HP_ASSIGN_OR_RETURN(auto rep, train::train(mine));
      (void)rep;
      return {};
    });
    REQUIRE_FALSE(st);
    CHECK(st.error().code == Errc::bad_input);
    return st.error().message();
  };
  // The attention output alone: the residual x crosses the cut too.
  CHECK(refused({"o"}, 1).find("emb") != std::string::npos);
  CHECK(refused({"r1"}, 3).find("does not split into 3 micro-batches") != std::string::npos);
  CHECK(refused({}, 1).find("boundary has 0 tensors") != std::string::npos);
  // Two stages with the boundaries of three.
  Status st = comm::run_in_process(2, [&](int rank, comm::Transport& t) -> Status {
    train::TrainOptions mine = o;
    mine.pp.transport = &t;
    mine.pp.ranks = {0, 1};
    mine.pp.stage = rank;
    mine.pp.cuts = {{"r1"}, {"r2"}};
    mine.pp.actions = {F0, B0};
    HP_ASSIGN_OR_RETURN(auto rep, train::train(mine));
    (void)rep;
    return {};
  });
  REQUIRE_FALSE(st);
  CHECK(st.error().message().find("need 1 stage boundaries, not 2") != std::string::npos);
  fs::remove_all(d);
}
