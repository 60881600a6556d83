// The two renderings of a PlanReport: a table for terminals and one JSON object for scripts. Both
// state the FLOPs convention, the search cost, and per plan the time breakdown and the peak memory
// per stage against the device's capacity.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "hp/core/units.h"
#include "hp/planner/planner.h"

namespace hp::planner {
namespace {

using nlohmann::json;

std::string placement(const Config& c) {
  return fmt::format("{}<{}<{}", axis_name(c.order[0]), axis_name(c.order[1]),
                     axis_name(c.order[2]));
}

// "none" when a stage recomputes nothing, else counts such as "selective x3, full x1".
std::string recompute_summary(const StagePlan& s) {
  int sel = 0, full = 0;
  for (auto r : s.recompute) {
    sel += r == recipe::Recompute::selective;
    full += r == recipe::Recompute::full;
  }
  if (sel == 0 && full == 0) return "none";
  std::string out;
  if (sel) out += fmt::format("selective x{}", sel);
  if (full) out += fmt::format("{}full x{}", sel ? ", " : "", full);
  return out;
}

// The plan-wide recompute policy written into [parallel]/JSON: the strongest any block uses.
const char* overall_recompute(const Plan& p) {
  recipe::Recompute r = recipe::Recompute::none;
  for (const auto& s : p.stages)
    for (auto x : s.recompute)
      if (static_cast<int>(x) > static_cast<int>(r)) r = x;
  return recipe::recompute_name(r);
}

// The optimizer_shard cell of the table: the recipe's level name, "/N" when ZeRO shards over HSDP
// groups of N data-parallel ranks rather than the whole dp group.
std::string shard_cell(const Config& c) {
  const std::int64_t group = dense_shard(c);
  return group > 1 && group < c.dp
             ? fmt::format("{}/{}", recipe::optimizer_shard_name(c.optimizer_shard), group)
             : recipe::optimizer_shard_name(c.optimizer_shard);
}

std::string block_ranges(const StagePlan& s) { return recipe::format_ranges(s.blocks); }

// The tier each axis talks over ("self" for a degree-1 axis).
std::string tier(const topology::Link& l) { return l.level < 0 ? "self" : l.tier; }

json parallel_json(const Plan& p) {
  const Config& c = p.config;
  return {{"dp", c.dp},
          {"tp", c.tp},
          {"pp", c.pp},
          {"optimizer_shard", recipe::optimizer_shard_name(c.optimizer_shard)},
          {"optimizer_shard_group", dense_shard(c)},
          {"micro_batch_size", c.micro_batch_size},
          {"micro_batches", c.micro_batches},
          {"schedule", recipe::schedule_name(c.schedule)},
          {"virtual_stages", c.virtual_stages},
          {"sequence_parallel", c.sequence_parallel},
          {"expert_parallel", c.ep},
          {"recompute", overall_recompute(p)},
          {"placement",
           {{"order", {axis_name(c.order[0]), axis_name(c.order[1]), axis_name(c.order[2])}},
            {"tp_tier", tier(p.links.tp)},
            {"dp_tier", tier(p.links.dp)},
            {"pp_tier", tier(p.links.pp)},
            {"ep_tier", tier(p.links.ep)}}}};
}

json predicted_json(const Prediction& p) {
  return {{"iteration_seconds", p.iteration},
          {"tokens_per_second", p.tokens_per_second},
          {"samples_per_second", p.samples_per_second},
          {"tflops_per_device_model", p.tflops_model},
          {"tflops_per_device_hardware", p.tflops_hardware},
          {"mfu", p.mfu},
          {"hfu", p.hfu},
          {"peak_memory_bytes", p.peak_memory},
          {"breakdown_seconds",
           {{"compute", p.compute},
            {"recompute", p.recompute},
            {"bubble", p.bubble},
            {"tp_comm", p.tp_exposed},
            {"ep_comm", p.ep_exposed},
            {"pp_comm", p.pp_exposed},
            {"dp_comm", p.dp_exposed},
            {"optimizer_shard_comm", p.opt_exposed},
            {"optimizer_step", p.optimizer_step}}}};
}

json plan_json(const Plan& p) {
  json stages = json::array();
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    const StagePlan& s = p.stages[k];
    json rc = json::array();
    for (auto r : s.recompute) rc.push_back(recipe::recompute_name(r));
    stages.push_back({{"index", k},
                      {"blocks", block_ranges(s)},
                      {"recompute", rc},
                      {"memory_bytes", s.memory},
                      {"state_bytes", s.states},
                      {"activation_bytes", s.activations},
                      {"seconds_per_micro_batch", s.time}});
  }
  return {{"parallel", parallel_json(p)},
          {"predicted", predicted_json(p.predicted)},
          {"stages", stages}};
}

}  // namespace

std::string format_plan_json(const PlanReport& r) {
  json cands = json::array();
  for (const auto& p : r.plans)
    cands.push_back({{"parallel", parallel_json(p)}, {"predicted", predicted_json(p.predicted)}});
  json j = {{"model", r.model},
            {"cluster",
             {{"name", r.cluster},
              {"nodes", r.nodes},
              {"ranks", r.ranks},
              {"device", r.device},
              {"memory_bytes", r.device_memory},
              {"usable_memory_bytes", r.usable_memory}}},
            {"workload",
             {{"global_batch", r.global_batch},
              {"seq", r.seq},
              {"sequence_axis", r.sequence},
              {"dtype", r.dtype},
              {"mode", r.mode},
              {"optimizer", r.optimizer},
              {"parameters", r.parameters},
              {"blocks", r.blocks}}},
            {"best", plan_json(r.plans.front())},
            {"candidates", cands},
            {"why", r.why},
            {"flops_convention", flops_convention()},
            {"search",
             {{"seconds", r.stats.seconds},
              {"evaluated", r.stats.evaluated},
              {"level2", r.stats.level2},
              {"pruned_memory", r.stats.pruned_memory},
              {"pruned_time", r.stats.pruned_time},
              {"level2_infeasible", r.stats.level2_infeasible}}},
            {"warnings", r.warnings}};
  if (!r.baselines.empty()) {
    json cmp = json::object();
    for (const auto& b : r.baselines) {
      json e = {{"description", b.description}, {"evaluated", b.evaluated}};
      if (b.plan) {
        e["parallel"] = parallel_json(*b.plan);
        e["predicted"] = predicted_json(b.plan->predicted);
        e["speedup"] = b.speedup;
      } else {
        e["infeasible"] = true;
      }
      cmp[b.name] = e;
    }
    j["compare"] = cmp;
  }
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string format_plan_text(const PlanReport& r) {
  std::string out = fmt::format("model        {} ({} parameters, {} blocks)\n", r.model,
                                format_count(r.parameters), r.blocks);
  out += fmt::format(
      "cluster      {}: {} ranks of {} ({} each, {} usable: a {:.0f}% transient margin stays "
      "free)\n",
      r.cluster, r.ranks, r.device, format_bytes(r.device_memory), format_bytes(r.usable_memory),
      r.device_memory > 0 ? 100 * (1 - r.usable_memory / r.device_memory) : 0.0);
  auto note = [](const std::string& n) { return n.empty() ? n : " (" + n + ")"; };
  out += fmt::format(
      "workload     {}, global batch {}{}{}, {}, {}\n", r.mode, r.global_batch, note(r.batch_note),
      r.sequence ? fmt::format(" x seq {}{}", r.seq, note(r.seq_note)) : " (no sequence axis)",
      r.dtype, r.optimizer);
  out += fmt::format(
      "search       {} configurations in {}, level 2 on {}; pruned {} by memory, {} by time bound "
      "({:.0f} configurations/s)\n\n",
      r.stats.evaluated, format_seconds(r.stats.seconds), r.stats.level2, r.stats.pruned_memory,
      r.stats.pruned_time,
      r.stats.seconds > 0 ? static_cast<double>(r.stats.evaluated) / r.stats.seconds : 0.0);
  out += fmt::format(
      "{:>2} {:>5} {:>3} {:>3} {:>3} {:>15} {:>9} {:>11} {:>2} {:>3} {:>8} {:>11} {:>11} {:>6} "
      "{:>6} {:>10} {}\n",
      "#", "dp", "tp", "pp", "ep", "optimizer_shard", "mbs x n", "schedule", "v", "sp", "placement",
      "iteration", r.sequence ? "tokens/s" : "samples/s", "MFU", "HFU", "TF/s/dev",
      "peak mem / limit");
  for (std::size_t i = 0; i < r.plans.size(); ++i) {
    const Plan& p = r.plans[i];
    const Config& c = p.config;
    const Prediction& q = p.predicted;
    out += fmt::format(
        "{:>2} {:>5} {:>3} {:>3} {:>3} {:>15} {:>9} {:>11} {:>2} {:>3} {:>8} {:>11} {:>11} "
        "{:>5.1f}% {:>5.1f}% {:>10.4g} {} / {}\n",
        i + 1, c.dp, c.tp, c.pp, c.ep, shard_cell(c),
        fmt::format("{}x{}", c.micro_batch_size, c.micro_batches),
        recipe::schedule_name(c.schedule), c.virtual_stages, c.sequence_parallel ? "yes" : "no",
        placement(c), format_seconds(q.iteration),
        format_count(r.sequence ? q.tokens_per_second : q.samples_per_second), 100 * q.mfu,
        100 * q.hfu, q.tflops_model, format_bytes(q.peak_memory), format_bytes(r.usable_memory));
  }
  out += "\ntime breakdown per iteration (exposed communication per pattern)\n";
  for (std::size_t i = 0; i < r.plans.size(); ++i) {
    const Prediction& q = r.plans[i].predicted;
    out += fmt::format(
        "{:>2} compute {}, recompute {}, bubble {}, tp {}, ep {}, pp {}, dp {}, optimizer-shard "
        "{}, optimizer step {}\n",
        i + 1, format_seconds(q.compute), format_seconds(q.recompute), format_seconds(q.bubble),
        format_seconds(q.tp_exposed), format_seconds(q.ep_exposed), format_seconds(q.pp_exposed),
        format_seconds(q.dp_exposed), format_seconds(q.opt_exposed),
        format_seconds(q.optimizer_step));
  }
  const Plan& best = r.plans.front();
  out += "\nstages of plan 1\n";
  for (std::size_t k = 0; k < best.stages.size(); ++k) {
    const StagePlan& s = best.stages[k];
    out += fmt::format(
        "  stage {:<3} blocks {:<14} recompute {:<26} memory {} / {} (states {}, activations {})\n",
        k, block_ranges(s), recompute_summary(s), format_bytes(s.memory),
        format_bytes(r.usable_memory), format_bytes(s.states), format_bytes(s.activations));
  }
  out += fmt::format("  axes: tp over {}, dp over {}, pp over {} (placement innermost first: {})\n",
                     tier(best.links.tp), tier(best.links.dp), tier(best.links.pp),
                     placement(best.config));
  if (best.config.ep > 1)
    out += fmt::format("  experts: ep {} inside dp, all-to-all over {}\n", best.config.ep,
                       tier(best.links.ep));
  if (!r.baselines.empty()) {
    out += "\nbaselines (same cost model; speedup = baseline iteration / best iteration - 1)\n";
    for (const auto& b : r.baselines) {
      if (!b.plan) {
        out += fmt::format("  {:<14} no plan fits ({} configurations; {})\n", b.name, b.evaluated,
                           b.description);
        continue;
      }
      const Config& c = b.plan->config;
      out += fmt::format(
          "  {:<14} dp{} tp{} pp{} optimizer_shard {} mbs{}x{} recompute {}: {}, MFU {:.1f}%; "
          "best plan is {:+.2f}% faster ({} configurations; {})\n",
          b.name, c.dp, c.tp, c.pp, shard_cell(c), c.micro_batch_size, c.micro_batches,
          overall_recompute(*b.plan), format_seconds(b.plan->predicted.iteration),
          100 * b.plan->predicted.mfu, 100 * b.speedup, b.evaluated, b.description);
    }
  }
  out += fmt::format("\nwhy: {}\n", r.why);
  out += fmt::format("flops: {}\n", flops_convention());
  return out;
}

}  // namespace hp::planner
