// Planner features beyond the core search: MoE profiling and expert parallelism, the --compare
// baselines, --sweep, the schedule picture, --fix checks against the model and cluster, and the
// de-duplication of the top-k list.
#include <fmt/core.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "hp/planner/planner.h"
#include "hp/recipe/presets.h"
#include "planner_test_util.h"

using namespace hp;
using namespace hp::planner;

namespace {

const auto cluster = hp_test::preset_cluster;

std::string data_model(const std::string& name) {
  return std::string(HP_SOURCE_DIR) + "/tests/data/models/" + name;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("planner: the DeepSeek-style skeleton profiles as 58 MoE blocks of 96 experts, top-6",
          "[planner]") {
  auto sum = model::summarize_model({data_model("planner-deepseek-moe-141b.onnx"),
                                     model::DimBindings{{"batch", 1}, {"seq", 4096}}, false});
  if (!sum) FAIL(sum.error().str());
  auto m = profile_model(*sum, 4096, 2);
  REQUIRE(m);
  REQUIRE(m->blocks.size() == 58);
  const BlockProfile& b = m->blocks[10];
  CHECK(b.experts == 96);
  CHECK(b.top_k == 6);
  CHECK(b.expert_parameters == Approx(3.0 * 96 * 5120 * 1536));
  CHECK(m->heads == 40);
  CHECK(m->total_parameters() == Approx(141.26e9).epsilon(0.01));
  // Active FLOPs: the routed experts cost top_k / experts of a dense expert layer.
  const double per_token_experts = 2.0 * 3 * 6 * 5120 * 1536;
  CHECK(b.fwd_flops > per_token_experts * 4096);
  CHECK(b.fwd_flops < 2.0 * 3 * 96 * 5120 * 1536 * 4096 / 4);
}

TEST_CASE("planner: expert parallelism splits expert states and adds all-to-all time",
          "[planner]") {
  ModelProfile m;
  m.seq = 1024;
  m.hidden_bytes = 2.0 * 1024 * 1024;
  BlockProfile b;
  b.parameters = 1e9;
  b.expert_parameters = 0.8e9;
  b.experts = 8;
  b.top_k = 2;
  b.fwd_flops = 1e12;
  m.blocks.push_back(b);
  Workload w;
  Machine mc;
  mc.peak_flops = 300e12;
  mc.memory = 64e9;
  mc.cal = calibration_for(recipe::DeviceKind::npu);
  AxisLinks links;
  links.ep = {"node", 0, 100e9, 5e-6};
  Config c1, c8;
  c1.dp = c8.dp = 8;
  c8.ep = 8;
  const BlockCost one = block_cost(b, m, c1, w, mc, links),
                  eight = block_cost(b, m, c8, w, mc, links);
  CHECK(one.ep_comm == 0);
  CHECK(eight.ep_comm > 0);
  CHECK(eight.expert_params == Approx(0.1e9));
  CHECK(eight.dense_params == Approx(0.2e9));
  CHECK(eight.state_bytes < one.state_bytes / 3);
}

TEST_CASE("planner: experts of a ModuleList count k/E of their FLOPs when routed", "[planner]") {
  // user-moe-stack: 2 layers of 4 experts (32 -> 64 -> 32) stacked by torch.stack, top-2.
  auto sum = model::summarize_model(
      {data_model("user-moe-stack.onnx"), model::DimBindings{{"batch", 2}, {"seq", 10}}, false});
  if (!sum) FAIL(sum.error().str());
  auto m = profile_model(*sum, 10, 4);
  REQUIRE(m);
  REQUIRE(m->blocks.size() == 2);
  const BlockProfile& b = m->blocks[0];
  CHECK(b.experts == 4);
  CHECK(b.top_k == 2);
  CHECK(b.expert_parameters == Approx(4.0 * (32 * 64 + 64 + 64 * 32 + 32)));
  // The export runs every expert on every token of its static batch (2 x 10 tokens): two matmuls
  // each, plus biases and GELU; top-2 of 4 leaves half of it unrouted.
  const double experts_dense = 4.0 * 2 * 2 * 20 * 32 * 64;
  CHECK(b.unrouted_flops == Approx(experts_dense / 2).epsilon(0.1));
  // One rank runs the export as written; expert parallelism with routing saves the unrouted FLOPs;
  // the all-gather dispatch does not.
  Workload w;
  Machine mc;
  mc.peak_flops = 1e12;
  mc.memory = 64e9;
  mc.cal = calibration_for(recipe::DeviceKind::cpu);
  AxisLinks links;
  Config one, routed, gathered;
  one.dp = routed.dp = gathered.dp = 2;
  routed.ep = gathered.ep = 2;
  gathered.routed_experts = false;
  const double f_one = block_cost(b, *m, one, w, mc, links).fwd;
  const double f_routed = block_cost(b, *m, routed, w, mc, links).fwd;
  CHECK(f_routed < f_one);
  CHECK(block_cost(b, *m, gathered, w, mc, links).fwd == Approx(f_one));
  // The dense-gate and Mixtral-style exports have no stacked experts: nothing to route (their
  // experts are added into a sum: the next test).
  auto mask = model::summarize_model(
      {data_model("user-moe.onnx"), model::DimBindings{{"batch", 2}, {"seq", 10}}, false});
  REQUIRE(mask);
  auto mm = profile_model(*mask, 10, 4);
  REQUIRE(mm);
  CHECK(mm->blocks[0].unrouted_flops == 0);
}

TEST_CASE("planner: experts added into a sum are experts, priced on their routed rows",
          "[planner]") {
  // user-moe adds gate_e * expert_e(x) into a zeros_like (every expert on every token, shapes
  // known); user-moe-scatter is Mixtral's loop, each expert on the rows torch.where gives it
  // (NonZero: the rows are decided by the data, so the graph's shapes leave those matmuls out).
  const double per_expert = 32 * 64 + 64 + 64 * 32 + 32;
  for (const char* name : {"user-moe.onnx", "user-moe-scatter.onnx"}) {
    INFO(name);
    auto sum = model::summarize_model(
        {data_model(name), model::DimBindings{{"batch", 2}, {"seq", 10}}, false});
    if (!sum) FAIL(sum.error().str());
    auto m = profile_model(*sum, 10, 4);
    REQUIRE(m);
    REQUIRE(m->blocks.size() == 2);
    for (const BlockProfile& b : m->blocks) {
      CHECK(b.experts == 4);
      CHECK(b.top_k == 2);
      CHECK(b.expert_parameters == Approx(4.0 * per_expert));
      CHECK(b.unrouted_flops == 0);  // the export runs what it computes
      // Mixtral's loop: each expert's two 32 x 64 matmuls on top-2 of 4 of the 20 tokens (10
      // rows), 2 FLOPs per multiply-accumulate; the gated sum's are counted from its shapes.
      const bool loop = std::string(name) == "user-moe-scatter.onnx";
      CHECK(b.routed_flops == Approx(loop ? 4.0 * 2 * 2 * 10 * 32 * 64 : 0.0));
      CHECK(b.summed);
    }
    // Under ep = 4 such a layer moves every member's rows (all-gather, reduce-scatter) where a
    // dispatch moves each token's top-2 copies: more, at top-2 of ep = 4.
    Workload w;
    w.train = true;
    Machine mc;
    mc.peak_flops = 1e12;
    mc.memory = 64e9;
    mc.cal = calibration_for(recipe::DeviceKind::cpu);
    AxisLinks links;
    links.ep = {"node", 0, 10e9, 5e-6};
    Config c;
    c.dp = c.ep = 4;
    BlockProfile stacked = m->blocks[0];
    stacked.summed = false;
    const BlockCost summed_cost = block_cost(m->blocks[0], *m, c, w, mc, links),
                    stacked_cost = block_cost(stacked, *m, c, w, mc, links);
    CHECK(summed_cost.ep_comm > stacked_cost.ep_comm);
    CHECK(summed_cost.ep_comm > 0);
  }
}

TEST_CASE("planner: --compare on the DeepSeek-style MoE on 128 Ascend 910B", "[planner][compare]") {
  PlanOptions opts;
  opts.model = data_model("planner-deepseek-moe-141b.onnx");
  opts.global_batch = 512;
  opts.seq = 4096;
  opts.compare = true;
  auto rep = run(opts, cluster("ascend-910b-8x", 16));
  if (!rep) FAIL(rep.error().str());
  REQUIRE(rep->baselines.size() == 2);
  const Plan& best = rep->plans.front();
  // Expert parallelism is competitive on a 141B MoE: a top plan uses it, within 1% of the best.
  // (Once interleaved stages were priced with the p micro-batches of every chunk they really hold,
  // the best became dp8 tp2 pp8 1F1B without ep, 0.2% ahead of dp16 tp2 pp4 ep4.)
  const auto with_ep = std::find_if(rep->plans.begin(), rep->plans.end(),
                                    [](const Plan& p) { return p.config.ep > 1; });
  REQUIRE(with_ep != rep->plans.end());
  CHECK(with_ep->predicted.iteration <= 1.01 * best.predicted.iteration);
  for (const auto& b : rep->baselines) {
    INFO(b.name);
    REQUIRE(b.plan);
    WARN("MoE " << b.name << ": " << b.plan->predicted.iteration << " s vs best "
                << best.predicted.iteration << " s, speedup " << 100 * b.speedup << "%");
    CHECK(b.speedup >= 0);
    CHECK(b.plan->config.dp * b.plan->config.tp * b.plan->config.pp == 128);
  }
  CHECK(rep->baselines[0].plan->config.pp == 1);
  CHECK(rep->baselines[0].plan->config.optimizer_shard == 0);
  const std::string text = format_plan_text(*rep);
  CHECK(text.find("dp-tp-only") != std::string::npos);
  CHECK(text.find("greedy-expert") != std::string::npos);
}

TEST_CASE("planner: --compare on a dense 141B GPT on 128 Ascend 910B", "[planner][compare]") {
  PlanOptions opts;
  opts.model = data_model("planner-gpt-141b.onnx");
  opts.global_batch = 512;
  opts.seq = 4096;
  opts.compare = true;
  auto rep = run(opts, cluster("ascend-910b-8x", 16));
  if (!rep) FAIL(rep.error().str());
  REQUIRE(rep->baselines.size() == 2);
  for (const auto& b : rep->baselines) {
    INFO(b.name);
    REQUIRE(b.plan);
    WARN("dense " << b.name << ": " << b.plan->predicted.iteration << " s vs best "
                  << rep->plans.front().predicted.iteration << " s, speedup " << 100 * b.speedup
                  << "%");
    CHECK(b.speedup >= 0);
  }
  const std::string json = format_plan_json(*rep);
  CHECK(json.find("\"compare\"") != std::string::npos);
  CHECK(json.find("\"speedup\"") != std::string::npos);
}

TEST_CASE("planner: --sweep prints one CSV row per value, infeasible rows included", "[planner]") {
  PlanOptions opts;
  opts.model = data_model("gpt-175b-skeleton.onnx");
  opts.seq = 2048;
  opts.global_batch = 64;
  opts.sweep = {"nodes=1,16"};
  auto rows = run_sweep(opts, cluster("dgx-a100", 1));
  REQUIRE(rows);
  INFO(rows->text);
  CHECK(count(rows->text, "\n") == 3);
  CHECK(rows->points == 2);
  REQUIRE(rows->infeasible == std::vector<std::string>{"nodes=1"});
  // The infeasible row carries the planner's reason, quoted because it holds commas.
  CHECK(rows->text.find("1,8,64,2048,infeasible,") != std::string::npos);
  CHECK(rows->text.find(",\"no plan fits") != std::string::npos);
  CHECK(rows->text.find("16,128,64,2048,ok,") != std::string::npos);
  CHECK(rows->text.find("search_seconds") == std::string::npos);
  opts.timing = true;
  auto timed = run_sweep(opts, cluster("dgx-a100", 1));
  REQUIRE(timed);
  CHECK(timed->text.find(",search_seconds,error\n") != std::string::npos);
}

TEST_CASE("planner: --sweep axes multiply, the first outermost", "[planner]") {
  PlanOptions opts;
  opts.model = data_model("tiny-gpt2.onnx");
  opts.seq = 16;
  opts.sweep = {"global-batch=8,16", "nodes=2,1"};
  auto rows = run_sweep(opts, cluster("dgx-a100", 1));
  REQUIRE(rows);
  INFO(rows->text);
  CHECK(rows->points == 4);
  const auto a = rows->text.find("\n2,16,8,"), b = rows->text.find("\n1,8,8,"),
             c = rows->text.find("\n2,16,16,"), d = rows->text.find("\n1,8,16,");
  REQUIRE(d != std::string::npos);
  CHECK((a < b && b < c && c < d));
  opts.json = true;
  auto again = run_sweep(opts, cluster("dgx-a100", 1)),
       twice = run_sweep(opts, cluster("dgx-a100", 1));
  REQUIRE(again);
  REQUIRE(twice);
  CHECK(again->text == twice->text);
  CHECK(count(again->text, "\n") == 4);
}

TEST_CASE("planner: malformed --sweep specs are usage errors naming the problem", "[planner]") {
  auto msg = [](std::vector<std::string> specs) {
    auto axes = parse_sweeps(specs);
    REQUIRE(!axes);
    CHECK(axes.error().code == Errc::usage);
    return axes.error().message();
  };
  CHECK(msg({"nodes=1,x"}) == "--sweep nodes=1,x: 'x' is not a positive integer");
  CHECK(msg({"nodes=1,0"}) == "--sweep nodes=1,0: '0' is not a positive integer");
  CHECK(msg({"nodes=1.5"}) == "--sweep nodes=1.5: '1.5' is not a positive integer");
  CHECK(msg({"pp=1,2"}) == "--sweep pp=1,2: unknown axis 'pp' (nodes, global-batch or seq)");
  CHECK(msg({"nodes="}) == "--sweep nodes=: no values for 'nodes'");
  CHECK(msg({"nodes=1,,2"}) == "--sweep nodes=1,,2: empty value in the list");
  CHECK(msg({"nodes=1,"}) == "--sweep nodes=1,: empty value in the list");
  CHECK(msg({"nodes"}) == "--sweep nodes: expected AXIS=V1,V2,...");
  CHECK(msg({"nodes=1,2,1"}) == "--sweep nodes=1,2,1: 1 appears twice");
  CHECK(msg({"global-batch=8", "global_batch=16"}) ==
        "--sweep global_batch=16: axis 'global-batch' is already swept");
  CHECK(msg({}) == "--sweep needs at least one axis");
  auto ok = parse_sweeps({"seq=64,32", "nodes=4"});
  REQUIRE(ok);
  REQUIRE(ok->size() == 2);
  CHECK((*ok)[0].key == "seq");
  CHECK((*ok)[0].values == std::vector<std::int64_t>{64, 32});
}

TEST_CASE("planner: a sweep with an infeasible point fails after its rows unless allowed",
          "[planner]") {
  PlanOptions opts;
  opts.model = data_model("gpt-175b-skeleton.onnx");
  opts.cluster = "dgx-a100";
  opts.preset_dirs = recipe::preset_dirs({}, HP_SOURCE_DIR);
  opts.seq = 2048;
  opts.global_batch = 64;
  opts.sweep = {"nodes=1,2"};
  auto out = run_command(opts);
  REQUIRE(out);
  REQUIRE(out->failure);
  CHECK(out->failure->code == Errc::infeasible);
  CHECK(out->failure->message().find("2 of 2 sweep points are infeasible (nodes=1; nodes=2)") == 0);
  CHECK(count(out->text, ",infeasible,") == 2);
  opts.allow_infeasible = true;
  auto allowed = run_command(opts);
  REQUIRE(allowed);
  CHECK(!allowed->failure);
  CHECK(allowed->text == out->text);
  opts.sweep.clear();
  auto single = run_command(opts);
  REQUIRE(!single);
  CHECK(single.error().message() == "--allow-infeasible goes with --sweep");
}

TEST_CASE(
    "planner: the schedule picture has one forward and one backward box per micro-batch and stage",
    "[planner]") {
  PlanOptions opts;
  opts.model = data_model("tiny-gpt2.onnx");
  opts.seq = 64;
  opts.global_batch = 16;
  opts.fix_args = {"pp=2", "dp=1", "tp=4", "micro_batch_size=2", "schedule=1f1b"};
  auto rep = run(opts, cluster("dgx-a100", 1));
  REQUIRE(rep);
  const Config& c = rep->plans.front().config;
  REQUIRE(c.pp == 2);
  const std::string svg = schedule_svg(*rep);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(count(svg, "<title>forward ") == static_cast<std::size_t>(c.micro_batches * c.pp));
  CHECK(count(svg, "<title>backward ") == static_cast<std::size_t>(c.micro_batches * c.pp));
}

TEST_CASE("planner: ZB-H1 plans draw W boxes and predict a smaller bubble than 1F1B", "[planner]") {
  PlanOptions opts;
  opts.model = data_model("tiny-gpt2.onnx");
  opts.seq = 64;
  opts.global_batch = 16;
  opts.fix_args = {"pp=2", "dp=1", "tp=4", "micro_batch_size=2", "schedule=zb-h1"};
  auto zb = run(opts, cluster("dgx-a100", 1));
  REQUIRE(zb);
  const Config& c = zb->plans.front().config;
  REQUIRE(c.schedule == recipe::Schedule::zb_h1);
  const std::string svg = schedule_svg(*zb);
  const auto boxes = static_cast<std::size_t>(c.micro_batches * c.pp);
  CHECK(count(svg, "<title>forward ") == boxes);
  CHECK(count(svg, "<title>backward ") == boxes);
  CHECK(count(svg, "<title>weight ") == boxes);
  CHECK(svg.find("weight grad") != std::string::npos);
  opts.fix_args.back() = "schedule=1f1b";
  auto one = run(opts, cluster("dgx-a100", 1));
  REQUIRE(one);
  REQUIRE(one->plans.front().config.micro_batches == c.micro_batches);
  const auto& pz = zb->plans.front().predicted;
  const auto& po = one->plans.front().predicted;
  CHECK(pz.bubble < po.bubble);
  CHECK(pz.iteration < po.iteration);
  CHECK(count(schedule_svg(*one), "<title>weight ") == 0);
  // zbv is refused with a reason.
  opts.fix_args.back() = "schedule=zbv";
  auto v = run(opts, cluster("dgx-a100", 1));
  REQUIRE_FALSE(v);
  CHECK(v.error().message().find("does not model zbv") != std::string::npos);
}

TEST_CASE("planner: --fix is checked against the cluster and the model", "[planner]") {
  ModelProfile m;
  m.heads = 12;
  m.blocks.resize(6);
  auto check = [&](std::vector<std::string> args, std::int64_t ranks, std::int64_t batch) {
    auto f = parse_fixes(args);
    REQUIRE(f);
    return check_fixes(*f, ranks, m, batch);
  };
  CHECK(check({"dp=2", "tp=2", "pp=2"}, 8, 8));
  CHECK(!check({"dp=2", "tp=2", "pp=1"}, 8, 8));
  CHECK(!check({"dp=3"}, 8, 8));
  CHECK(!check({"pp=8"}, 8, 8));
  CHECK(!check({"tp=8"}, 8, 8));
  CHECK(check({"tp=4"}, 8, 8));
  CHECK(!check({"ep=2"}, 8, 8));
  CHECK(!check({"dp=4"}, 8, 6));
  CHECK(!check({"dp=2", "micro_batch_size=3"}, 8, 8));
  CHECK(!check({"pp=2", "virtual_stages=4"}, 8, 8));
  auto e = check({"tp=8"}, 8, 8);
  CHECK(std::move(e).error().code == Errc::bad_input);
}

TEST_CASE("planner: --fix takes the common names of its keys and the recipe's shard levels",
          "[planner]") {
  auto f = parse_fixes({"zero=3", "tensor=2", "pipeline_parallel=2", "data=2", "mbs=4",
                        "micro-batches=2", "sp=true", "expert=1"});
  REQUIRE(f);
  CHECK(f->optimizer_shard == 3);
  CHECK(f->tp == 2);
  CHECK(f->pp == 2);
  CHECK(f->dp == 2);
  CHECK(f->micro_batch_size == 4);
  CHECK(f->micro_batches == 2);
  CHECK(f->sequence_parallel == true);
  CHECK(f->ep == 1);
  for (const char* same : {"zero_stage=gradients", "optimizer_shard=2", "zero=2"}) {
    auto g = parse_fixes({same});
    REQUIRE(g);
    CHECK(g->optimizer_shard == 2);
  }
  // An alias and its key are one key: two different values contradict each other.
  auto twice = parse_fixes({"zero=3", "optimizer_shard=optimizer"});
  REQUIRE(!twice);
  CHECK(twice.error().message() ==
        "--fix optimizer_shard=optimizer: contradicts an earlier --fix of the same key");
  auto bad = parse_fixes({"zero=4"});
  REQUIRE(!bad);
  CHECK(bad.error().code == Errc::usage);
  auto unknown = parse_fixes({"zero-level=1"});
  REQUIRE(!unknown);
  CHECK(unknown.error().message() == "--fix zero-level=1: unknown key 'zero-level'");
}

TEST_CASE("planner: the table, JSON and sweep name optimizer_shard by the recipe's level names",
          "[planner]") {
  PlanOptions opts;
  opts.model = data_model("tiny-gpt2.onnx");
  opts.seq = 16;
  opts.global_batch = 16;
  opts.fix_args = {"zero=3"};
  auto rep = run(opts, cluster("dgx-a100", 1));
  REQUIRE(rep);
  REQUIRE(rep->plans.front().config.optimizer_shard == 3);
  const std::string text = format_plan_text(*rep), json = format_plan_json(*rep);
  CHECK(text.find(" optimizer_shard ") != std::string::npos);
  CHECK(text.find(" zero ") == std::string::npos);
  CHECK(text.find(" parameters ") != std::string::npos);
  CHECK(json.find("\"optimizer_shard\": \"parameters\"") != std::string::npos);
  const recipe::Recipe r = plan_to_recipe(*rep, "plan.toml");
  CHECK(r.parallel.optimizer_shard == 3);
  CHECK(recipe::format_recipe(r).find("optimizer_shard = \"parameters\"") != std::string::npos);
  opts.sweep = {"nodes=1"};
  auto row = run_sweep(opts, cluster("dgx-a100", 1));
  REQUIRE(row);
  CHECK(row->text.find(",parameters,") != std::string::npos);
}

TEST_CASE("planner: --explain hands the best plan's recipe to the explainer the app passes",
          "[planner]") {
  PlanOptions opts;
  opts.model = data_model("tiny-gpt2.onnx");
  opts.seq = 16;
  opts.global_batch = 2;
  opts.explain = "h.0.mlp_proj.weight";
  opts.preset_dirs = recipe::preset_dirs({}, HP_SOURCE_DIR);
  auto none = run_command(opts);
  REQUIRE(!none);
  INFO(none.error().str());
  CHECK(none.error().code == Errc::not_implemented);
  opts.explain_tensor = [](const recipe::Recipe& r, const std::filesystem::path& at,
                           const std::string& name, bool json) -> Expected<std::string> {
    return fmt::format("{} dp={} {} {}\n", name, r.parallel.dp, at.filename().string(), json);
  };
  auto text = run_command(opts);
  REQUIRE(text);
  CHECK(text->text.find("under plan 1 (dp1 tp1 pp1") == 0);
  CHECK(text->text.find("\nh.0.mlp_proj.weight dp=1 plan.toml false\n") != std::string::npos);
  opts.json = true;
  auto json = run_command(opts);
  REQUIRE(json);
  CHECK(json->text == "h.0.mlp_proj.weight dp=1 plan.toml true\n");
  opts.summary = true;
  auto summary = run_command(opts);
  REQUIRE(!summary);
  CHECK(summary.error().code == Errc::usage);
}

TEST_CASE("planner: the top-k plans are pairwise different configurations", "[planner]") {
  PlanOptions opts;
  opts.model = data_model("tiny-gpt2.onnx");
  opts.seq = 64;
  opts.global_batch = 32;
  opts.top_k = 10;
  auto rep = run(opts, cluster("dgx-a100", 2));
  REQUIRE(rep);
  std::set<std::string> seen;
  for (const auto& p : rep->plans) {
    const Config& c = p.config;
    std::string key = std::to_string(c.dp) + "/" + std::to_string(c.tp) + "/" +
                      std::to_string(c.pp) + "/" + std::to_string(c.ep) + "/" +
                      std::to_string(c.optimizer_shard) + "/" + std::to_string(c.micro_batch_size) +
                      "/" + recipe::schedule_name(c.schedule) + "/" +
                      std::to_string(c.virtual_stages) + "/" + (c.sequence_parallel ? "sp" : "") +
                      "/" + p.links.tp.tier + p.links.dp.tier + p.links.pp.tier;
    CHECK(seen.insert(key).second);
  }
}

TEST_CASE(
    "planner: run_command resolves the bundled model and the cluster, and returns what to print "
    "and write",
    "[planner][command]") {
  PlanOptions opts;
  opts.preset_dirs = recipe::preset_dirs({}, HP_SOURCE_DIR);
  opts.model_dirs = {"/nonexistent/models", std::string(HP_SOURCE_DIR) + "/recipes/models"};
  opts.summary = true;
  opts.json = true;
  opts.dim_args = {"batch=1"};
  opts.seq = 8;
  opts.cluster = "dgx-h100";
  opts.nodes = 2;
  auto summary = run_command(opts);
  if (!summary) FAIL(summary.error().str());
  CHECK(summary->model == std::string(HP_SOURCE_DIR) + "/recipes/models/tiny-gpt2.onnx");
  CHECK(summary->text.find("\"cluster\": {") != std::string::npos);
  CHECK(summary->text.find("\"ranks\": 16") != std::string::npos);
  CHECK(summary->files.empty());

  // Planning without a cluster plans on local-cpu; -o and --schedule-svg come back as files, in
  // order.
  opts = PlanOptions{};
  opts.preset_dirs = recipe::preset_dirs({}, HP_SOURCE_DIR);
  opts.model = data_model("tiny-gpt2.onnx");
  opts.seq = 16;
  opts.global_batch = 2;
  opts.output = "plan.toml";
  opts.schedule_svg = "plan.svg";
  auto planned = run_command(opts);
  if (!planned) FAIL(planned.error().str());
  CHECK(planned->text.find("cluster      local-cpu: 1 ranks") != std::string::npos);
  REQUIRE(planned->files.size() == 2);
  CHECK(planned->files[0].path == "plan.svg");
  CHECK(planned->files[1].path == "plan.toml");
  CHECK(planned->files[1].contents.find("cluster = \"local-cpu\"") != std::string::npos);

  opts.sweep = {"nodes=1,2"};
  auto sweep = run_command(opts);
  REQUIRE(!sweep);
  CHECK(sweep.error().code == Errc::usage);
  opts = PlanOptions{};
  opts.nodes = 2;
  auto nodes = run_command(opts);
  REQUIRE(!nodes);
  CHECK(nodes.error().message() == "--nodes needs --cluster");
  opts = PlanOptions{};
  opts.summary = true;
  opts.model_dirs = {"/nonexistent/models"};
  auto bundled = run_command(opts);
  REQUIRE(!bundled);
  CHECK(bundled.error().where() == "/nonexistent/models/tiny-gpt2.onnx");
}
