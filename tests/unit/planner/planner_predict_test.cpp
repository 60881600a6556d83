// planner::predict: one configuration through the cost model without a search. It must price what
// the search picked exactly as the search did (from the plan, from the recipe hp plan writes of it,
// and with level 2 rerun), price every recipe hp ships (what hp launch reports next to a measured
// step), and say where a configuration it cannot price is wrong.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "hp/planner/planner.h"
#include "hp/planner/predict.h"
#include "hp/recipe/presets.h"

using namespace hp;
using namespace hp::planner;
namespace fs = std::filesystem;

namespace {

recipe::Cluster cluster(const std::string& name, std::int64_t nodes) {
  auto c = recipe::load_cluster_ref(name, {}, recipe::preset_dirs({}, HP_SOURCE_DIR));
  REQUIRE(c);
  if (nodes == 0 || nodes == c->nodes) return *c;
  auto scaled = recipe::scale_cluster(*c, nodes);
  REQUIRE(scaled);
  return *scaled;
}

std::string data_model(const std::string& name) {
  return std::string(HP_SOURCE_DIR) + "/tests/data/models/" + name;
}

// One `hp plan` problem: the model, the cluster and the options the search and predict() share.
struct Problem {
  std::string name;
  std::string model;
  std::string cluster;
  std::int64_t nodes = 1, global_batch = 0, seq = 0;
  std::vector<std::string> fixes;
  std::string mode = "train", dtype = "bf16", optimizer = "adam";
};

PlanOptions plan_options(const Problem& p) {
  PlanOptions o;
  o.model = p.model;
  o.cluster = p.cluster;
  o.global_batch = p.global_batch;
  o.seq = p.seq;
  o.fix_args = p.fixes;
  o.mode = p.mode;
  o.dtype = p.dtype;
  o.optimizer = p.optimizer;
  o.top_k = 3;
  return o;
}

PredictOptions predict_options(const Problem& p) {
  return {p.mode == "train", p.dtype, p.optimizer};
}

ModelProfile profile_of(const Problem& p) {
  auto loaded = load_profile({p.model, {}, p.seq, p.dtype, false});
  if (!loaded) FAIL(loaded.error().str());
  return loaded->profile;
}

const std::vector<Problem>& problems() {
  static const std::vector<Problem> list = {
      {"bundled tiny-gpt2, 4 CPU ranks",
       std::string(HP_SOURCE_DIR) + "/recipes/models/tiny-gpt2.onnx",
       "local-cpu",
       4,
       8,
       16,
       {}},
      {"tiny-gpt2, pp 2 x 4 micro-batches",
       data_model("tiny-gpt2.onnx"),
       "dgx-h100",
       1,
       16,
       32,
       {"pp=2", "micro_batches=4"}},
      {"tiny-gpt2, gpipe",
       data_model("tiny-gpt2.onnx"),
       "dgx-h100",
       1,
       16,
       32,
       {"pp=2", "schedule=gpipe"}},
      {"tiny-gpt2, interleaved",
       data_model("tiny-gpt2.onnx"),
       "dgx-h100",
       1,
       16,
       32,
       {"pp=2", "schedule=interleaved", "virtual_stages=2", "micro_batches=4"}},
      {"tiny-gpt2, full recompute",
       data_model("tiny-gpt2.onnx"),
       "dgx-h100",
       1,
       16,
       32,
       {"pp=2", "recompute=full"}},
      {"tiny-llama, 2 DGX A100", data_model("tiny-llama.onnx"), "dgx-a100", 2, 32, 64, {}},
      {"tiny-llama, inference",
       data_model("tiny-llama.onnx"),
       "dgx-a100",
       1,
       16,
       64,
       {"pp=2"},
       "infer",
       "fp32",
       "none"},
      {"masked-gpt2, ZeRO-3",
       data_model("masked-gpt2.onnx"),
       "dgx-h100",
       2,
       32,
       32,
       {"optimizer_shard=3"}},
      {"dense 141B on 128 Ascend 910B",
       data_model("planner-gpt-141b.onnx"),
       "ascend-910b-8x",
       16,
       512,
       4096,
       {}},
      {"MoE 141B with expert parallelism",
       data_model("planner-deepseek-moe-141b.onnx"),
       "ascend-910b-8x",
       16,
       512,
       4096,
       {}},
      {"175B skeleton on 16 DGX A100",
       data_model("gpt-175b-skeleton.onnx"),
       "dgx-a100",
       16,
       512,
       2048,
       {}},
  };
  return list;
}

}  // namespace

TEST_CASE("planner: predict() reprices every plan the search ranks, to the bit",
          "[planner][predict]") {
  for (const Problem& p : problems()) {
    INFO(p.name);
    const recipe::Cluster c = cluster(p.cluster, p.nodes);
    auto rep = run(plan_options(p), c);
    if (!rep) FAIL(rep.error().str());
    const ModelProfile m = profile_of(p);
    bool pipelined = false;
    for (const Plan& plan : rep->plans) {
      pipelined |= plan.config.pp > 1;
      // With the plan's stage layout: cost_stage on the same blocks and recomputation.
      auto again = predict(candidate_of(plan), c, m, predict_options(p));
      if (!again) FAIL(again.error().str());
      CHECK(again->predicted.iteration == plan.predicted.iteration);
      CHECK(again->predicted.peak_memory == plan.predicted.peak_memory);
      CHECK(again->predicted.mfu == plan.predicted.mfu);
      // Without it: level 2 runs again and chooses the same stages.
      Candidate level1{plan.config, {}};
      auto chosen = predict(level1, c, m, predict_options(p));
      if (!chosen) FAIL(chosen.error().str());
      CHECK(chosen->predicted.iteration == plan.predicted.iteration);
      REQUIRE(chosen->stages.size() == plan.stages.size());
      for (std::size_t k = 0; k < plan.stages.size(); ++k) {
        CHECK(chosen->stages[k].blocks == plan.stages[k].blocks);
        CHECK(chosen->stages[k].recompute == plan.stages[k].recompute);
        CHECK(chosen->stages[k].feasible);
      }
    }
    if (!p.fixes.empty() && p.fixes.front().rfind("pp=", 0) == 0) CHECK(pipelined);
  }
}

TEST_CASE("planner: the recipe hp plan writes is priced as the plan it came from",
          "[planner][predict]") {
  const auto dir = fs::temp_directory_path() / ("hp-predict-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  int compared = 0;
  for (const Problem& p : problems()) {
    INFO(p.name);
    const recipe::Cluster c = cluster(p.cluster, p.nodes);
    auto rep = run(plan_options(p), c);
    if (!rep) FAIL(rep.error().str());
    const Plan& best = rep->plans.front();
    // Recipes do not record HSDP groups: such a plan reads back as ZeRO over the whole DP group.
    if (best.config.shard_group > 0) continue;
    const fs::path path = dir / "plan.toml";
    REQUIRE(recipe::write_recipe(plan_to_recipe(*rep, path), path));
    auto written = recipe::load_recipe(path);
    if (!written) FAIL(written.error().str());
    auto k = candidate_of(*written);
    if (!k) FAIL(k.error().str());
    CHECK(k->config.micro_batch_size == best.config.micro_batch_size);
    CHECK(k->config.virtual_stages == best.config.virtual_stages);
    auto priced = predict_recipe(*written, dir, c, predict_options(p));
    if (!priced) FAIL(priced.error().str());
    CHECK(priced->predicted.iteration == best.predicted.iteration);
    CHECK(priced->predicted.peak_memory == best.predicted.peak_memory);
    // The placement read back from the stage ranks puts every axis on the plan's tiers.
    CHECK(priced->links.tp.level == best.links.tp.level);
    CHECK(priced->links.dp.level == best.links.dp.level);
    CHECK(priced->links.pp.level == best.links.pp.level);
    ++compared;
  }
  CHECK(compared >= 8);
  fs::remove_all(dir);
}

TEST_CASE("planner: every shipped recipe gets the inference prediction hp launch reports",
          "[planner][predict]") {
  const auto dirs = recipe::preset_dirs({}, HP_SOURCE_DIR);
  const fs::path recipes = fs::path(HP_SOURCE_DIR) / "recipes";
  int priced = 0;
  for (const auto& entry : fs::directory_iterator(recipes)) {
    if (entry.path().extension() != ".toml") continue;
    INFO(entry.path().string());
    auto r = recipe::load_recipe(entry.path());
    if (!r) FAIL(r.error().str());
    if (!r->groups.empty())
      continue;  // MPMD groups run their own modules: no one configuration to price
    auto c = recipe::cluster_for(*r, recipes, dirs);
    if (!c) FAIL(c.error().str());
    // What hp launch asks: forward passes at the executor's fp32, with the recipe's schedule as
    // written (the skeleton recipes are interleaved, which a search in inference mode never
    // visits).
    auto infer = predict_recipe(*r, recipes, *c, {false, "fp32", "none"});
    if (!infer &&
        infer.error().message().find("has no peak FLOP/s for fp32") != std::string::npos) {
      // A device whose cluster file states no fp32 peak (the Ascend 910C die) is priced in its own
      // dtype.
      CHECK(infer.error().where() == c->name);
      infer = predict_recipe(*r, recipes, *c, {false, "bf16", "none"});
    }
    if (!infer) FAIL(infer.error().str());
    CHECK(infer->predicted.iteration > 0);
    CHECK(infer->config.schedule == r->parallel.schedule);
    // And the training step the recipe was planned for.
    auto train = predict_recipe(*r, recipes, *c, {true, "bf16", "adam"});
    if (!train) FAIL(train.error().str());
    CHECK(train->predicted.iteration > 0);
    // The recipe's stages are priced as written, not re-chosen.
    if (!r->stages.empty()) {
      std::size_t blocks = 0;
      for (const auto& s : train->stages) blocks += s.blocks.size();
      std::size_t layers = 0;
      for (const auto& s : r->stages) layers += s.layers.size();
      CHECK(blocks == layers);
    }
    ++priced;
  }
  CHECK(priced >= 8);
}

TEST_CASE("planner: a hand-written recipe's uneven stages and batch are priced as written",
          "[planner][predict]") {
  const fs::path shard = fs::path(HP_SOURCE_DIR) / "tests/data/recipes/shard";
  const auto dirs = recipe::preset_dirs({}, HP_SOURCE_DIR);
  auto r = recipe::load_recipe(shard / "gpt2-tp2-pp2-stages.toml");
  if (!r) FAIL(r.error().str());
  auto c = recipe::cluster_for(*r, shard, dirs);
  REQUIRE(c);
  auto k = candidate_of(*r);
  REQUIRE(k);
  // batch 2 over dp 1 x 1 micro-batch: micro-batches of 2, whatever micro_batch_size says.
  CHECK(k->config.micro_batch_size == 2);
  auto plan = predict_recipe(*r, shard, *c, {false, "fp32", "none"});
  if (!plan) FAIL(plan.error().str());
  REQUIRE(plan->stages.size() == 2);
  CHECK(plan->stages[0].blocks == std::vector<std::int64_t>{0, 1, 2});
  CHECK(plan->stages[1].blocks == std::vector<std::int64_t>{3});

  // Every sharded test recipe whose model the planner can profile gets a prediction.
  for (const char* name :
       {"gpt2-dp2-pp2-mb2.toml", "gpt2-dp2-tp2-pp2.toml", "gpt2-tp2-sp.toml", "gpt2-tp2.toml",
        "llama-dp2-tp2-pp2.toml", "llama-tp4.toml", "gpt175b-skeleton-tp8-pp4.toml"}) {
    INFO(name);
    auto rr = recipe::load_recipe(shard / name);
    if (!rr) FAIL(rr.error().str());
    auto cc = recipe::cluster_for(*rr, shard, dirs);
    REQUIRE(cc);
    auto got = predict_recipe(*rr, shard, *cc, {false, "fp32", "none"});
    if (!got) FAIL(got.error().str());
    CHECK(got->predicted.iteration > 0);
  }
}

TEST_CASE("planner: a configuration that does not fit is still priced, and says so",
          "[planner][predict]") {
  const Problem p{
      "175B on one node", data_model("gpt-175b-skeleton.onnx"), "dgx-a100", 1, 8, 2048, {}};
  const ModelProfile m = profile_of(p);
  Candidate k;
  k.config.tp = 8;
  k.config.micro_batches = 8;
  auto plan = predict(k, cluster("dgx-a100", 1), m, predict_options(p));
  if (!plan) FAIL(plan.error().str());
  REQUIRE(plan->stages.size() == 1);
  CHECK(!plan->stages[0].feasible);
  CHECK(plan->predicted.peak_memory > 80.0 * (1 << 30));
  CHECK(plan->predicted.iteration > 0);
}

TEST_CASE("planner: a configuration predict() cannot price is a located, clear error",
          "[planner][predict]") {
  const Problem p{"tiny", data_model("tiny-gpt2.onnx"), "local-cpu", 4, 4, 16, {}};
  const ModelProfile m = profile_of(p);
  REQUIRE(m.blocks.size() == 4);
  const PredictOptions o = predict_options(p);
  auto fails = [&](const Candidate& k, std::int64_t nodes, const std::string& where,
                   const std::string& says) {
    auto got = predict(k, cluster("local-cpu", nodes), m, o);
    REQUIRE(!got);
    CHECK(got.error().code == Errc::bad_input);
    CHECK(got.error().where() == where);
    CHECK_THAT(got.error().message(), Catch::Contains(says));
  };
  Candidate k;
  k.config.dp = 2;
  fails(k, 4, "parallel", "dp x tp x pp = 2 x 1 x 1 = 2 does not match the cluster's 4 ranks");
  k = {};
  k.config.pp = 8;
  fails(k, 8, "parallel.pp", "pp = 8 exceeds the model's 4 blocks");
  k = {};
  k.config.tp = 3;
  fails(k, 3, "parallel.tp", "does not divide the model's");
  k = {};
  k.config.pp = 2;
  k.config.virtual_stages = 2;
  fails(k, 2, "parallel.virtual_stages", "needs the interleaved schedule");
  k.config.pp = 4;
  k.config.micro_batches = 4;
  k.config.schedule = recipe::Schedule::interleaved;
  fails(k, 4, "parallel.virtual_stages",
        "pp x virtual_stages = 4 x 2 exceeds the model's 4 blocks");
  k = {};
  k.config.dp = 2;
  k.config.ep = 2;
  fails(k, 2, "parallel.expert_parallel", "the model has no routed experts");
  k = {};
  k.config.micro_batches = 0;
  fails(k, 1, "parallel.micro_batches", "micro_batches is 0");
  k = {};
  k.config.pp = 2;
  k.stages = {{{0, 1}, {}}, {{2}, {}}};
  fails(k, 2, "stages", "layer 3 is on no pipeline rank");
  k.stages = {{{0, 1}, {}}, {{2, 3, 9}, {}}};
  fails(k, 2, "stages", "pipeline rank 1 holds layer 9, but the model's blocks are 0-3");
  k.stages = {{{0, 1, 2, 3}, {}}};
  fails(k, 2, "stages", "the layout has 1 pipeline ranks but pp is 2");

  auto fp32 = predict(Candidate{}, cluster("local-cpu", 1), m, {true, "fp32", "adam"});
  REQUIRE(!fp32);
  CHECK(fp32.error().where() == "dtype");

  // Recipes: the stage count, the batch and the sequence length are checked before the model is
  // read.
  recipe::Recipe r;
  r.model = "tiny-gpt2.onnx";
  r.parallel.pp = 2;
  r.stages.resize(3);
  auto stages = candidate_of(r);
  REQUIRE(!stages);
  CHECK(stages.error().where() == "stages");
  CHECK_THAT(stages.error().message(), Catch::Contains("3 stages but pp x virtual_stages is 2"));
  r.stages.clear();
  r.parallel.dp = 2;
  r.dims = {{"batch", 3}, {"seq", 16}};
  auto batch = candidate_of(r);
  REQUIRE(!batch);
  CHECK(batch.error().where() == "model.dims");
  CHECK_THAT(batch.error().message(),
             Catch::Contains("the batch dim 3 is not a multiple of dp x micro_batches"));
  r.dims = {{"batch", 4}};
  auto seq =
      predict_recipe(r, fs::path(HP_SOURCE_DIR) / "tests/data/models", cluster("local-cpu", 4), o);
  REQUIRE(!seq);
  CHECK(seq.error().code == Errc::usage);
  CHECK_THAT(seq.error().message(), Catch::Contains("planning needs a sequence length"));
}

TEST_CASE("planner: load_profile reads the model once, and a bad model before a missing sequence",
          "[planner][predict]") {
  auto missing = load_profile({"/nonexistent/model.onnx", {}, 0, "bf16", false});
  REQUIRE(!missing);
  CHECK(missing.error().code == Errc::bad_input);
  auto no_seq = load_profile({data_model("tiny-gpt2.onnx"), {}, 0, "bf16", false});
  REQUIRE(!no_seq);
  CHECK(no_seq.error().code == Errc::usage);
  auto from_dims = load_profile({data_model("tiny-gpt2.onnx"), {{"seq", 16}}, 0, "fp32", false});
  if (!from_dims) FAIL(from_dims.error().str());
  CHECK(from_dims->profile.seq == 16);
  CHECK(from_dims->profile.dtype_bytes == 4);
  CHECK(from_dims->profile.blocks.size() == 4);
}

TEST_CASE("planner: per-step ZeRO-3 gathers a stage once a step and keeps its parameters whole",
          "[planner][predict]") {
  // The same dp=2 x pp=2 recipe at ZeRO-3: per use, each of the 2 micro-batches' forward and
  // backward gathers the stage (4 gathers); per step, one; the parameters whole through the step.
  const fs::path shard = fs::path(HP_SOURCE_DIR) / "tests/data/recipes/shard";
  auto r = recipe::load_recipe(shard / "gpt2-dp2-pp2-mb2.toml");
  if (!r) FAIL(r.error().str());
  auto c = recipe::cluster_for(*r, shard, recipe::preset_dirs({}, HP_SOURCE_DIR));
  REQUIRE(c);
  r->parallel.optimizer_shard = 3;
  auto use = predict_recipe(*r, shard, *c, {true, "fp32", "adam"});
  if (!use) FAIL(use.error().str());
  r->parallel.zero3_per_step = true;
  auto step = predict_recipe(*r, shard, *c, {true, "fp32", "adam"});
  if (!step) FAIL(step.error().str());
  REQUIRE(step->predicted.opt_exposed > 0);
  CHECK(use->predicted.opt_exposed == Approx(4 * step->predicted.opt_exposed));
  // During the step it holds what ZeRO-2 holds (whole parameters, sharded gradients and states):
  // the kept buckets take the place of per-use's gather buffers.
  r->parallel.optimizer_shard = 2;
  r->parallel.zero3_per_step = false;
  auto two = predict_recipe(*r, shard, *c, {true, "fp32", "adam"});
  if (!two) FAIL(two.error().str());
  CHECK(step->predicted.peak_memory == Approx(two->predicted.peak_memory));
  CHECK(step->predicted.peak_memory != Approx(use->predicted.peak_memory));
}
