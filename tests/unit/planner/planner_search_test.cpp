// Planner search: level 2 against brute force on a small instance, uneven stages around a heavy
// head, and level 1 on two DGX A100 nodes keeping TP inside the node.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "hp/planner/planner.h"
#include "hp/planner/schedule.h"
#include "hp/recipe/presets.h"
#include "hp/recipe/verify.h"
#include "planner_test_util.h"

#include <unistd.h>

#include <filesystem>

using namespace hp;
using namespace hp::planner;
using hp_test::a100;

namespace {

using hp_test::small_gpt;
const auto preset = hp_test::preset_topology;

}  // namespace

TEST_CASE("planner: level 2 equals brute force over partitions and recompute sets", "[planner]") {
  ModelProfile m = small_gpt(6, 1024, 2048, 32000);
  Workload w;
  w.global_batch = 8;
  Config c;
  c.pp = 3;
  c.micro_batch_size = 2;
  c.micro_batches = 4;
  AxisLinks links;
  links.pp = {"node", 0, 1e30, 0};  // free p2p: brute force compares compute + recompute only
  // A memory limit that forces some recomputation on the first stage.
  Machine mc = a100(0);
  for (double mem : {1.6e9, 2.0e9, 3.0e9}) {
    mc.memory = mem;
    auto got = assign_stages(m, c, w, mc, links);
    // Brute force: every split into 3 non-empty contiguous stages, every recompute level per block.
    double best = std::numeric_limits<double>::infinity();
    const auto table_links = links;
    for (int a = 1; a < 5; ++a)
      for (int b = a + 1; b < 6; ++b) {
        std::vector<std::vector<std::int64_t>> split = {{}, {}, {}};
        for (int i = 0; i < 6; ++i) split[i < a ? 0 : i < b ? 1 : 2].push_back(i);
        double worst = 0;
        bool ok = true;
        for (int k = 0; k < 3 && ok; ++k) {
          // evaluate_stage is private; enumerate recompute sets through the public cost pieces.
          const std::size_t n = split[static_cast<std::size_t>(k)].size();
          double stage_best = std::numeric_limits<double>::infinity();
          std::vector<int> lv(n, 0);
          std::function<void(std::size_t)> rec = [&](std::size_t i) {
            if (i == n) {
              // The stage memory of docs/planner.md, "Memory", from its public pieces: the
              // schedule's activation peak, buffers and workspace (1F1B: one chunk).
              // Gradients leave the states for the peak, which places them in time.
              double states = 0, time = 0, grads = 0, workspace = 0;
              std::vector<UnitActivations> units;
              auto edge = [&](const BlockProfile& bp) {
                BlockCost bc = block_cost(bp, m, c, w, mc, table_links);
                const double g = block_states(bc, m, c, w).gradients;
                states += bc.state_bytes - g;
                grads += bc.grad_bytes;
                workspace = std::max(workspace, unit_workspace(bp, c));
                units.push_back({0, bc.act[0], 0, g});
                time += bc.fwd + bc.bwd + bc.tp_comm;
              };
              if (k == 0) edge(m.prologue);
              for (std::size_t j = 0; j < n; ++j) {
                const BlockProfile& bp =
                    m.blocks[static_cast<std::size_t>(split[static_cast<std::size_t>(k)][j])];
                BlockCost bc = block_cost(bp, m, c, w, mc, table_links);
                const double g = block_states(bc, m, c, w).gradients;
                states += bc.state_bytes - g;
                grads += bc.grad_bytes;
                workspace = std::max(workspace, unit_workspace(bp, c));
                units.push_back({0, bc.act[lv[j]], bc.act[0] - bc.act[lv[j]], g});
                time += bc.fwd + bc.bwd + bc.tp_comm +
                        (lv[j] == 1   ? bc.rc_selective
                         : lv[j] == 2 ? bc.rc_full
                                      : 0);
              }
              if (k == 2) edge(m.epilogue);
              const double acts =
                  activation_peak(live_counts(c.schedule, c.pp, k, c.micro_batches, 1), units);
              const double mem_need = states + acts + workspace +
                                      stage_buffers(m, c, w, grads, 0, 0) +
                                      mc.cal.transient_margin * mc.memory;
              if (mem_need <= mc.memory) stage_best = std::min(stage_best, time);
              return;
            }
            for (int l = 0; l < 3; ++l) {
              lv[i] = l;
              rec(i + 1);
            }
          };
          rec(0);
          if (!std::isfinite(stage_best)) ok = false;
          worst = std::max(worst, stage_best);
        }
        if (ok) best = std::min(best, worst);
      }
    if (!std::isfinite(best)) {
      CHECK(got.empty());
      continue;
    }
    REQUIRE(!got.empty());
    double worst = 0;
    for (const auto& s : got) worst = std::max(worst, s.time - s.pp_comm);
    CHECK(worst == Approx(best).epsilon(1e-3));
  }
}

TEST_CASE("planner: level 2 gives the stage with the LM head fewer blocks", "[planner]") {
  ModelProfile m = small_gpt(16, 2048, 4096, 256000);
  Workload w;
  Config c;
  c.pp = 4;
  c.micro_batches = 8;
  AxisLinks links;
  links.pp = {"node", 0, 300e9, 3e-6};
  auto stages = assign_stages(m, c, w, a100(80.0 * (1 << 30)), links);
  REQUIRE(stages.size() == 4);
  CHECK(stages.back().blocks.size() < stages.front().blocks.size());
  std::size_t total = 0;
  for (const auto& s : stages) total += s.blocks.size();
  CHECK(total == 16);
}

TEST_CASE("planner: on two DGX A100 nodes a 13B-class model keeps TP inside a node", "[planner]") {
  auto topo = preset("dgx-a100", 2);
  ModelProfile m = small_gpt(40, 2048, 5120, 51200);
  Workload w;
  w.global_batch = 64;
  SearchResult r = search({m, topo, w, a100(80.0 * (1 << 30)), {3, {}}});
  REQUIRE(!r.plans.empty());
  const Plan& best = r.plans.front();
  CHECK(best.config.dp * best.config.tp * best.config.pp == 16);
  CHECK(best.config.tp <= 8);
  auto links = axis_links(topo, best.config);
  REQUIRE(links);
  CHECK(links->tp.level <= 0);                // the node tier (or a single rank)
  CHECK(r.stats.evaluated > r.stats.level2);  // the bound pruned something
  for (std::size_t i = 1; i < r.plans.size(); ++i)
    CHECK(r.plans[i - 1].predicted.iteration <= r.plans[i].predicted.iteration);
  for (const auto& s : best.stages) CHECK(s.memory <= 80.0 * (1 << 30));
}

TEST_CASE("planner: nothing fits reports the smallest need", "[planner]") {
  auto topo = preset("dgx-a100", 1);
  ModelProfile m = small_gpt(96, 2048, 12288, 51200);  // 175B on 8 GPUs cannot fit
  Workload w;
  w.global_batch = 8;
  SearchResult r = search({m, topo, w, a100(80.0 * (1 << 30)), {3, {}}});
  CHECK(r.plans.empty());
  CHECK(r.shortfall.need > 80.0 * (1 << 30));
}

TEST_CASE("planner: run() on tiny-gpt2 writes a recipe that hp verify accepts", "[planner]") {
  auto c = recipe::load_cluster_ref("dgx-a100", {}, recipe::preset_dirs({}, HP_SOURCE_DIR));
  REQUIRE(c);
  auto scaled = recipe::scale_cluster(*c, 2);
  REQUIRE(scaled);
  PlanOptions opts;
  opts.model = std::string(HP_SOURCE_DIR) + "/tests/data/models/tiny-gpt2.onnx";
  opts.cluster = "dgx-a100";
  opts.global_batch = 32;
  opts.seq = 64;
  auto rep = run(opts, *scaled);
  REQUIRE(rep);
  REQUIRE(!rep->plans.empty());
  CHECK(rep->ranks == 16);
  CHECK(rep->plans.front().predicted.mfu > 0);
  CHECK(rep->plans.front().predicted.hfu >= rep->plans.front().predicted.mfu);

  const auto dir =
      std::filesystem::temp_directory_path() / ("hp-planner-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "plan.toml";
  const recipe::Recipe written = plan_to_recipe(*rep, path);
  REQUIRE(recipe::write_recipe(written, path));
  // The model path is relative to the recipe unless the two share nothing below the root.
  const auto top = [](const std::filesystem::path& p) { return *std::next(p.begin()); };
  if (top(dir) == top(std::filesystem::path(HP_SOURCE_DIR)))
    CHECK(std::filesystem::path(written.model).is_relative());
  else
    CHECK(written.model == std::string(HP_SOURCE_DIR) + "/tests/data/models/tiny-gpt2.onnx");
  recipe::VerifyOptions vo;
  vo.recipe = path;
  vo.preset_dirs = recipe::preset_dirs({}, HP_SOURCE_DIR);
  auto checked = recipe::check_recipe(vo);
  if (!checked) FAIL(checked.error().str());
  CHECK(checked->recipe.parallel.dp * checked->recipe.parallel.tp * checked->recipe.parallel.pp ==
        16);
  std::filesystem::remove_all(dir);
}

TEST_CASE("planner: run() fails with infeasible for 175B on one DGX node", "[planner]") {
  auto c = recipe::load_cluster_ref("dgx-a100", {}, recipe::preset_dirs({}, HP_SOURCE_DIR));
  REQUIRE(c);
  PlanOptions opts;
  opts.model = std::string(HP_SOURCE_DIR) + "/tests/data/models/gpt-175b-skeleton.onnx";
  opts.global_batch = 8;
  opts.seq = 2048;
  auto rep = run(opts, *c);
  REQUIRE(!rep);
  CHECK(rep.error().code == Errc::infeasible);
  CHECK(rep.error().message().find("no plan fits") != std::string::npos);
}

TEST_CASE("planner: a 1T-class GPT on 3072 A100s plans quickly", "[planner]") {
  auto topo = preset("dgx-a100", 384);
  ModelProfile m = small_gpt(128, 2048, 25600, 51200);  // Korthikanti's 1T: 128 layers, h = 25600
  Workload w;
  w.global_batch = 3072;
  SearchResult r = search({m, topo, w, a100(80.0 * (1 << 30)), {3, {}}});
  REQUIRE(!r.plans.empty());
  WARN("1T on 3072 ranks: " << r.stats.evaluated << " configurations in " << r.stats.seconds
                            << " s (" << static_cast<double>(r.stats.evaluated) / r.stats.seconds
                            << "/s), level 2 on " << r.stats.level2);
  CHECK(r.stats.seconds < 10.0);  // < 1 s in release builds; loose for sanitizer builds
  CHECK(r.plans.front().config.tp <= 8);
}

TEST_CASE("planner: Korthikanti 2022 configurations predict their published iteration times",
          "[planner]") {
  struct Case {
    const char* name;
    int layers;
    double hidden;
    std::int64_t tp, pp, v, gpus, batch, mbs;
    // Seconds per iteration, SP + selective recompute (docs/planner.md, "Validation").
    double published;
  };
  const Case cases[] = {{"22B", 48, 6144, 8, 1, 1, 8, 4, 4, 1.10},
                        {"175B", 96, 12288, 8, 8, 3, 64, 64, 1, 13.75},
                        {"530B", 105, 20480, 8, 35, 3, 280, 280, 1, 37.83},
                        {"1T", 128, 25600, 8, 64, 1, 512, 512, 1, 71.49}};
  for (const Case& k : cases) {
    auto topo = preset("dgx-a100", k.gpus / 8);
    ModelProfile m = small_gpt(k.layers, 2048, k.hidden, 51200);
    m.prologue.parameters = (51200 + 2048) * k.hidden;
    Workload w;
    w.global_batch = k.batch;
    Config c;
    c.dp = k.gpus / k.tp / k.pp, c.tp = k.tp, c.pp = k.pp;
    c.micro_batch_size = k.mbs, c.micro_batches = k.batch / c.dp / k.mbs;
    c.schedule = k.v > 1 ? recipe::Schedule::interleaved : recipe::Schedule::one_f_one_b;
    c.virtual_stages = k.v;
    c.sequence_parallel = true;
    auto links = axis_links(topo, c);
    REQUIRE(links);
    auto stages = assign_stages(m, c, w, a100(80.0 * (1 << 30)), *links);
    REQUIRE(!stages.empty());
    Prediction p = predict(m, c, w, a100(80.0 * (1 << 30)), *links, stages);
    WARN(k.name << ": predicted " << p.iteration << " s, published " << k.published << " s, MFU "
                << p.mfu);
    CHECK(p.iteration > k.published * 0.85);
    CHECK(p.iteration < k.published * 1.15);
    // The planner's own best for the same model, cluster and batch is at least as fast.
    SearchResult own = search({m, topo, w, a100(80.0 * (1 << 30)), {1, {}}});
    REQUIRE(!own.plans.empty());
    WARN(k.name << ": planner's best " << own.plans.front().predicted.iteration << " s (dp "
                << own.plans.front().config.dp << " tp " << own.plans.front().config.tp << " pp "
                << own.plans.front().config.pp << ")");
    CHECK(own.plans.front().predicted.iteration <= p.iteration * (1 + 1e-9));
  }
}

TEST_CASE("planner: a model without a sequence axis plans per sample; the recipe says so",
          "[planner]") {
  auto c = recipe::load_cluster_ref("local-cpu", {}, recipe::preset_dirs({}, HP_SOURCE_DIR));
  REQUIRE(c);
  PlanOptions opts;
  opts.model = std::string(HP_SOURCE_DIR) + "/tests/data/models/tiny-vit.onnx";  // images
  opts.dtype = "fp32";
  opts.command = "hp plan tiny-vit.onnx";
  auto rep = run(opts, *c);
  if (!rep) FAIL(rep.error().str());
  CHECK(!rep->sequence);
  CHECK(rep->seq == 1);
  const auto& q = rep->plans.front().predicted;
  CHECK(q.samples_per_second == Approx(q.tokens_per_second));
  CHECK(format_plan_text(*rep).find("samples/s") != std::string::npos);
  CHECK(format_plan_text(*rep).find("tokens/s") == std::string::npos);
  const recipe::Recipe r = plan_to_recipe(*rep, "plan.toml");
  CHECK(r.dims == std::map<std::string, std::int64_t>{{"batch", rep->global_batch}});
  REQUIRE(r.workload);
  CHECK(*r.workload ==
        recipe::Workload{"train", "fp32", "adam", rep->global_batch, 0, "hp plan tiny-vit.onnx"});
  // --seq on a model without a sequence is not an error: there is nothing for it to bind.
  opts.seq = 64;
  auto with_seq = run(opts, *c);
  REQUIRE(with_seq);
  CHECK(with_seq->seq == 1);
}

TEST_CASE("planner: a sequence model needs --seq unless its length is static", "[planner]") {
  auto c = recipe::load_cluster_ref("local-cpu", {}, recipe::preset_dirs({}, HP_SOURCE_DIR));
  REQUIRE(c);
  PlanOptions opts;
  opts.model = std::string(HP_SOURCE_DIR) + "/tests/data/models/tiny-gpt2.onnx";
  auto rep = run(opts, *c);
  REQUIRE(!rep);
  CHECK(rep.error().code == Errc::usage);
  CHECK_THAT(rep.error().message(), Catch::Contains("axis 1 of input"));
  CHECK_THAT(rep.error().message(), Catch::Contains("is symbolic"));
  opts.dim_args = {"seq=32"};  // binding the model's own dim is as good as --seq
  rep = run(opts, *c);
  if (!rep) FAIL(rep.error().str());
  CHECK(rep->seq == 32);
  CHECK(rep->sequence);
  CHECK(plan_to_recipe(*rep, "plan.toml").dims.at("seq") == 32);
}

TEST_CASE("planner: -o writes the best plan the check accepts, or refuses with every reason",
          "[planner]") {
  PlanOptions opts;
  opts.model = std::string(HP_SOURCE_DIR) + "/tests/data/models/tiny-gpt2.onnx";
  opts.cluster = "local-cpu";
  opts.nodes = 4;
  opts.global_batch = 4;
  opts.seq = 16;
  opts.preset_dirs = recipe::preset_dirs({}, HP_SOURCE_DIR);
  opts.output = "plan.toml";
  std::vector<recipe::Parallel> asked;
  // Refuses the first plan it sees, accepts the rest.
  opts.check_plan = [&](const recipe::Recipe& r, const std::filesystem::path& path) -> Status {
    CHECK(path == "plan.toml");
    asked.push_back(r.parallel);
    if (asked.size() == 1) return Error(Errc::bad_input, "layouts disagree at node X", "n");
    return {};
  };
  auto out = run_command(opts);
  if (!out) FAIL(out.error().str());
  REQUIRE(asked.size() == 2);
  REQUIRE(out->files.size() == 1);
  auto doc = recipe::parse_recipe(out->files[0].contents, "plan.toml");
  REQUIRE(doc.problems.empty());
  CHECK(doc.recipe.parallel == asked[1]);
  CHECK(!(doc.recipe.parallel == asked[0]));
  std::string warnings;
  for (const auto& w : out->warnings) warnings += w + "\n";
  CHECK_THAT(warnings, Catch::Contains("plan 1 ("));
  CHECK_THAT(warnings, Catch::Contains("cannot be sharded: layouts disagree at node X"));
  CHECK_THAT(warnings, Catch::Contains("wrote plan 2"));

  opts.check_plan = [](const recipe::Recipe&, const std::filesystem::path&) -> Status {
    return Error(Errc::bad_input, "no", "n");
  };
  auto none = run_command(opts);
  REQUIRE(!none);
  CHECK(none.error().code == Errc::infeasible);
  CHECK(none.error().all().size() == 3);  // --top-k 3: each ranked plan's reason
  CHECK_THAT(none.error().message(), Catch::Contains("plan 1"));
}

TEST_CASE("planner: a plan asked for training writes [train] on the model's first output",
          "[planner]") {
  auto c = recipe::load_cluster_ref("local-cpu", {}, recipe::preset_dirs({}, HP_SOURCE_DIR));
  REQUIRE(c);
  PlanOptions opts;
  opts.model = std::string(HP_SOURCE_DIR) + "/tests/data/models/user-llama-static.onnx";
  opts.cluster = "local-cpu";
  opts.dtype = "fp32";
  SECTION("not asked: no [train], whatever the mode") {
    auto rep = run(opts, *c);
    if (!rep) FAIL(rep.error().str());
    CHECK(rep->outputs == std::vector<std::string>{"logits"});
    CHECK(!plan_to_recipe(*rep, "plan.toml").train);
  }
  SECTION("asked: defaults, the logits output and the optimizer the plan was priced for") {
    opts.train_table = true;
    auto rep = run(opts, *c);
    if (!rep) FAIL(rep.error().str());
    const recipe::Recipe r = plan_to_recipe(*rep, "plan.toml");
    REQUIRE(r.train);
    CHECK(r.train->logits == "logits");
    CHECK(r.train->labels == "labels");
    CHECK(r.train->optimizer == "adamw");  // --optimizer adam (the default) trains as AdamW
    CHECK(r.train->steps == 100);
    // It reads back as written, with no problem.
    const auto doc = recipe::parse_recipe(recipe::format_recipe(r), "plan.toml");
    std::string problems;
    for (const auto& p : doc.problems) problems += p.where + ": " + p.message + "\n";
    INFO(problems);
    CHECK(doc.problems.empty());
    CHECK(doc.recipe == r);
    opts.optimizer = "sgd";
    auto sgd = run(opts, *c);
    REQUIRE(sgd);
    CHECK(plan_to_recipe(*sgd, "plan.toml").train->optimizer == "sgd");
  }
  SECTION("an inference plan never has one") {
    opts.train_table = true;
    opts.mode = "infer";
    auto rep = run(opts, *c);
    if (!rep) FAIL(rep.error().str());
    CHECK(!plan_to_recipe(*rep, "plan.toml").train);
  }
}
