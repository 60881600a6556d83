// Pipeline-parallel training (libs/train/src/pipeline_run.cpp, pipeline_stage.cpp) on two
// (and three) in-process ranks against one rank: the transformer of train_stage_models.h (an
// embedding tied to the head, so one weight lives on both stages) cut at the residual after
// attention, with a batch whose two micro-batches hold different numbers of ignored (-100) labels,
// so each micro-batch's loss gradient must be weighted by its share of the labels. GPipe and the
// split backward (B and W apart, ZB-H1's order) must train what one rank trains, and a checkpoint
// written by the pipeline must resume at one rank; the pipeline's refusals are checked too. With
// ZeRO-3 on two replicas of each stage (four ranks), the stages' parts borrow their parameters
// from the data-parallel shards, in the step's order (pipeline_gather.h, tested alone first).
#include <catch2/catch.hpp>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "hp/comm/comm.h"
#include "hp/train/checkpoint.h"
#include "hp/train/trainer.h"
#include "pipeline_gather.h"
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

namespace {

// Records what a StepGathers asks of its source; a fetch writes the bucket's number plus the
// parameter's position, so a copy into the wrong destination shows.
struct RecordingSource : exec::WeightSource {
  std::vector<std::string> calls;
  void prefetch(std::size_t g) override { calls.push_back("P" + std::to_string(g)); }
  Status fetch(std::size_t g, std::span<float* const> dst) override {
    calls.push_back("F" + std::to_string(g));
    for (std::size_t i = 0; i < dst.size(); ++i)
      if (dst[i]) *dst[i] = static_cast<float>(10 * g + i);
    return {};
  }
};

}  // namespace

TEST_CASE("a pipeline step's gathers go one ahead across its parts", "[train][pipeline][zero3]") {
  RecordingSource src;
  train::detail::StepGathers step(src);
  step.set_sequence({0, 1, 0, 2});  // e.g. a forward part's two buckets, then a backward's
  float x = -1;
  float* one[] = {&x};
  REQUIRE(step.begin_step());
  REQUIRE(step.fetch(0, one));
  CHECK(src.calls == std::vector<std::string>{"P0", "P1", "F0"});
  REQUIRE(step.fetch(1, one));
  REQUIRE(step.fetch(0, one));
  // The next part's first bucket was asked for during the previous one's last use.
  CHECK(src.calls == std::vector<std::string>{"P0", "P1", "F0", "P0", "F1", "P2", "F0"});
  // A step left unfinished, then one whose order differs: both refused.
  CHECK_FALSE(step.begin_step());
  REQUIRE(step.fetch(2, one));
  CHECK(src.calls.back() == "F2");
  CHECK(src.calls.size() == 8);  // nothing asked past the step's end
  REQUIRE(step.begin_step());
  CHECK(src.calls.back() == "P0");  // the next step's first bucket, asked before its first action
  const Status wrong = step.fetch(1, one);
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().message().find("out of the step's order") != std::string::npos);

  // A part holding parameters 0 and 2 of a bucket of three gets those, the source a null for 1.
  train::detail::StepGathers again(src);
  again.set_sequence({1});
  REQUIRE(again.begin_step());
  train::detail::PartSource part(again, {{1, 3, {0, 2}, {"a", "c"}}});
  float a = 0, c = 0;
  float* two[] = {&a, &c};
  REQUIRE(part.fetch(0, two));
  CHECK(a == 10.0f);
  CHECK(c == 12.0f);
  float* three[] = {&a, &c, &x};
  CHECK_FALSE(part.fetch(0, three));
}

TEST_CASE("ZeRO-3 pipeline stages on two replicas train what one rank trains",
          "[train][pipeline][zero3]") {
  const fs::path d = fresh_dir("zero3");
  train::TrainOptions o = options(d);
  o.save_model = d / "one.onnx";
  o.metrics = d / "one.jsonl";
  REQUIRE(train::train(o));
  const auto want = test::metric_losses(o.metrics);
  // Ranks 0, 1 hold stage 0 and ranks 2, 3 stage 1; pipeline r % 2 takes row r % 2 of the batch
  // (4 labels against 1: the replicas' gradients weigh 4/5 and 1/5). Buckets of 256 bytes, so
  // every part borrows several, some only in part.
  // Per-step gathers (zero3_gather = "per-step"): each bucket gathered once a step and kept.
  const bool per_step = GENERATE(false, true);
  INFO((per_step ? "per-step gathers" : "per-use gathers"));
  auto run = [&](const train::TrainOptions& base, bool split) {
    return comm::run_in_process(4, [&](int rank, comm::Transport& t) -> Status {
      train::TrainOptions mine = base;
      const int stage = rank / 2, replica = rank % 2;
      mine.pp.transport = &t;
      mine.pp.ranks = {replica, 2 + replica};
      mine.pp.stage = stage;
      mine.pp.micro_batches = 1;
      mine.pp.split_weight = split;
      mine.pp.cuts = {{"r1"}};
      mine.pp.actions = split ? std::vector<train::PipelineAction>{F0, B0, W0}
                              : std::vector<train::PipelineAction>{F0, B0};
      mine.dp.transport = &t;
      mine.dp.group = {2 * stage, 2 * stage + 1};
      mine.dp.zero = 3;
      mine.dp.bucket_bytes = 256;
      mine.dp.gather_per_step = per_step;
      HP_ASSIGN_OR_RETURN(auto rep, train::train(mine));
      if (rank == 0 &&
          rep.summary.find("ZeRO-3: the first stage's parameters") == std::string::npos)
        return Error(Errc::internal, "no ZeRO-3 line in the summary: " + rep.summary);
      if (rank == 0 &&
          per_step != (rep.summary.find("ZeRO-3 per-step gathers") != std::string::npos))
        return Error(Errc::internal, "the per-step line is wrong: " + rep.summary);
      return {};
    });
  };
  const bool split = GENERATE(false, true);
  INFO((split ? "B and W apart" : "whole backward"));
  o.save_model = d / "z3.onnx";
  o.metrics = d / "z3.jsonl";
  const Status st = run(o, split);
  INFO((st ? std::string() : st.error().message()));
  REQUIRE(st);
  const auto got = test::metric_losses(o.metrics);
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) CHECK(got[k] == Approx(want[k]).epsilon(1e-6));
  same_weights(d / "one.onnx", d / "z3.onnx");

  // Two steps at ZeRO-3 checkpointed (each stage's rank its pieces), the third at one rank.
  o.steps = 2;
  o.save_model.clear();
  o.metrics.clear();
  o.checkpoint_dir = d / "ckpt";
  REQUIRE(run(o, split));
  o.steps = 1;
  o.checkpoint_dir.clear();
  o.resume_dir = d / "ckpt";
  o.save_model = d / "resumed.onnx";
  REQUIRE(train::train(o));
  same_weights(d / "one.onnx", d / "resumed.onnx");
  fs::remove_all(d);
}
