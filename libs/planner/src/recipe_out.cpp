// The best plan as a recipe: fully explicit, with paths relative to the recipe file.
//
// Ranks: the placement orders the axes innermost first, so rank = tp_i * s_tp + dp_i * s_dp +
// pp_i * s_pp with strides from that order, and stage k runs on every rank whose pipeline
// coordinate is k. The mesh is written as one layout "*" whose device_matrix lists the axes
// outermost first (the recipe's major-first convention) with their alias names. Interleaved plans
// write one stage per model chunk (pp * v entries; chunk j runs on pipeline rank j mod pp). Level 2
// chooses recomputation per block: a stage's `recompute` is the policy most of its blocks use, and
// the other blocks are listed in its `recompute_layers`, so the recipe keeps every choice.
#include <algorithm>
#include <filesystem>
#include <iterator>
#include <system_error>

#include "hp/planner/planner.h"
#include "pricing.h"

namespace hp::planner {
namespace {

namespace fs = std::filesystem;

std::int64_t degree(const Config& c, Axis a) {
  return a == Axis::tp ? c.tp : a == Axis::dp ? c.dp : c.pp;
}

std::int64_t stride(const Config& c, Axis a) {
  std::int64_t s = 1;
  for (Axis x : c.order) {
    if (x == a) break;
    s *= degree(c, x);
  }
  return s;
}

// Relative, so a recipe and its model move together; absolute when the two share nothing below the
// root (a recipe written to /tmp for a model under /home reads better as /home/... than
// ../../home/...).
std::string relative_to(const fs::path& target, const fs::path& recipe_path) {
  std::error_code ec;
  const fs::path dir = fs::absolute(recipe_path, ec).parent_path().lexically_normal();
  const fs::path abs = fs::absolute(target, ec).lexically_normal();
  auto top = [](const fs::path& p) {
    return std::distance(p.begin(), p.end()) > 1 ? *std::next(p.begin()) : fs::path();
  };
  if (ec || top(dir) != top(abs)) return abs.string();
  fs::path rel = fs::relative(abs, dir, ec);
  return ec || rel.empty() ? abs.string() : rel.generic_string();
}

}  // namespace

std::vector<std::int64_t> stage_ranks(const Config& c, std::int64_t pp_index) {
  std::vector<std::int64_t> ranks;
  for (std::int64_t d = 0; d < c.dp; ++d)
    for (std::int64_t t = 0; t < c.tp; ++t)
      ranks.push_back(pp_index * stride(c, Axis::pp) + d * stride(c, Axis::dp) +
                      t * stride(c, Axis::tp));
  // Not sorted: [[stages]] ranks are in stage-mesh order (dp major, tp minor), which hp shard reads
  // as the global rank at each mesh position.
  return ranks;
}

recipe::Recipe plan_to_recipe(const PlanReport& r, const fs::path& recipe_path, std::size_t plan) {
  const Plan& best = r.plans.at(plan);
  const Config& c = best.config;
  recipe::Recipe out;
  out.name = fs::path(r.model).stem().string() + "-plan";
  out.model = relative_to(r.model, recipe_path);
  std::error_code ec;
  out.cluster = fs::is_regular_file(r.cluster_ref, ec) ? relative_to(r.cluster_ref, recipe_path)
                                                       : r.cluster_ref;
  out.nodes = r.nodes;
  // [model] dims are the shapes of one step's inputs (what hp shard / launch / verify feed the
  // job): the global batch, which dp splits and micro-batching cuts further, bound to the model's
  // own batch dim (a static batch has none to bind).
  out.dims = r.dims;
  out.workload = recipe::Workload{
      r.mode, r.dtype, r.optimizer, r.global_batch, r.sequence ? r.seq : 0, r.command};
  out.parallel.dp = c.dp;
  out.parallel.tp = c.tp;
  out.parallel.pp = c.pp;
  out.parallel.optimizer_shard = c.optimizer_shard;
  // HSDP: the recipe records the shard group only when it is smaller than the DP group.
  out.parallel.shard_group = c.shard_group > 0 && c.shard_group < c.dp ? c.shard_group : 0;
  out.parallel.micro_batch_size = c.micro_batch_size;
  out.parallel.micro_batches = c.micro_batches;
  out.parallel.schedule = c.schedule;
  out.parallel.virtual_stages = c.virtual_stages;
  out.parallel.sequence_parallel = c.sequence_parallel;
  out.parallel.expert_parallel = c.ep;

  // Chunks in model order: stage k of a non-interleaved plan is one chunk; interleaved ranks hold v
  // chunks each, cut at the gaps of their block lists.
  const std::int64_t chunks = c.pp * c.virtual_stages;
  std::vector<std::vector<std::int64_t>> chunk_layers(static_cast<std::size_t>(chunks));
  std::vector<std::vector<recipe::Recompute>> chunk_rc(static_cast<std::size_t>(chunks));
  for (std::int64_t k = 0; k < c.pp; ++k) {
    const StagePlan& s = best.stages[static_cast<std::size_t>(k)];
    std::int64_t v = 0;
    for (std::size_t i = 0; i < s.blocks.size(); ++i) {
      if (i > 0 && s.blocks[i] != s.blocks[i - 1] + 1) ++v;
      const auto j = static_cast<std::size_t>(std::min(v, c.virtual_stages - 1) * c.pp + k);
      chunk_layers[j].push_back(s.blocks[i]);
      chunk_rc[j].push_back(s.recompute[i]);
    }
  }
  for (std::int64_t j = 0; j < chunks; ++j) {
    recipe::Stage st;
    st.index = j;
    st.layers = chunk_layers[static_cast<std::size_t>(j)];
    const auto& rc = chunk_rc[static_cast<std::size_t>(j)];
    // The most common policy is the stage's (ties go to the lighter one); the rest are overrides.
    std::size_t best_count = 0;
    for (auto mode :
         {recipe::Recompute::none, recipe::Recompute::selective, recipe::Recompute::full}) {
      const auto n = static_cast<std::size_t>(std::count(rc.begin(), rc.end(), mode));
      if (n > best_count) best_count = n, st.recompute = mode;
    }
    for (std::size_t i = 0; i < rc.size(); ++i)
      if (rc[i] != st.recompute) st.recompute_layers[rc[i]].push_back(st.layers[i]);
    st.ranks = stage_ranks(c, j % c.pp);
    out.stages.push_back(std::move(st));
  }

  if (r.train_table) {
    recipe::Train& t = out.train.emplace();
    if (!r.outputs.empty()) t.logits = r.outputs.front();
    // The plan priced Adam's two states per parameter for adam and adamw alike; hp trains AdamW
    // (Adam with weight decay 0 would be the same update, so nothing is lost by not offering it).
    t.optimizer = r.optimizer == "sgd" ? "sgd" : "adamw";
  }

  // No [layouts] table: the rank placement is in [[stages]] ranks, and hp shard derives the
  // Megatron-style layouts from the degrees (a recipe's [layouts] are for overriding them).
  return out;
}

}  // namespace hp::planner
