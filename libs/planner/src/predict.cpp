// planner::predict: one configuration through the cost model, no search.
//
// A plan hp plan ranks is priced as: the links of its axes under its placement (axis_links), its
// stages (level 2: assign_stages, or the layout given) and the step time combining them (predict in
// stage.cpp), for the workload and machine the options describe (pricing.h, shared with run()).
// This file does the same for a configuration given from outside, after checking that the cost
// model's formulas apply to it, so predict(candidate_of(plan)) is plan.predicted to the last bit.
//
// A recipe maps onto a Candidate key by key; the two things it does not state directly are
// recovered from what it does state: the placement from the [[stages]] ranks (hp plan -o writes
// them from the placement, stage_ranks() in recipe_out.cpp) and the micro-batch size from the batch
// dim a run feeds.
#include "hp/planner/predict.h"

#include <algorithm>
#include <utility>

#include <fmt/core.h>

#include "pricing.h"
#include "stage.h"

namespace hp::planner {
namespace {

namespace fs = std::filesystem;

Error bad(std::string where, std::string message, std::string hint = {}) {
  return Error(Errc::bad_input, std::move(message), std::move(where), std::move(hint));
}

std::int64_t routed_experts(const ModelProfile& m) {
  std::int64_t experts = 0;
  for (const auto& b : m.blocks) experts = std::max(experts, b.experts);
  return experts;
}

// Counts and levels in range, before anything multiplies or divides by them.
Status check_ranges(const Config& c) {
  const std::pair<const char*, std::int64_t> counts[] = {{"dp", c.dp},
                                                         {"tp", c.tp},
                                                         {"pp", c.pp},
                                                         {"micro_batch_size", c.micro_batch_size},
                                                         {"micro_batches", c.micro_batches},
                                                         {"virtual_stages", c.virtual_stages},
                                                         {"expert_parallel", c.ep}};
  for (auto [key, v] : counts)
    if (v < 1)
      return bad(fmt::format("parallel.{}", key),
                 fmt::format("{} is {}; it must be at least 1", key, v));
  if (c.optimizer_shard < 0 || c.optimizer_shard > 3)
    return bad("parallel.optimizer_shard",
               fmt::format("optimizer_shard is {}; it must be 0..3", c.optimizer_shard),
               "levels: 0 none, 1 optimizer, 2 gradients, 3 parameters");
  if (c.forced_recompute < -1 || c.forced_recompute > 2)
    return bad("recompute",
               fmt::format("forced recompute level {} is not -1 (chosen per block) or 0..2",
                           c.forced_recompute));
  if (c.shard_group < 0)
    return bad(
        "shard_group",
        fmt::format("shard_group is {}; it must be 0 (the whole DP group) or more", c.shard_group));
  return {};
}

// The configuration against the cluster and the model: what the search's enumeration guarantees of
// every candidate it prices (degrees filling the ranks, whole heads per TP rank, experts divisible
// by ep, ep inside dp, at least one block per pipeline stage and virtual stage).
Status check_config(const Config& c, std::int64_t ranks, const ModelProfile& m) {
  HP_TRY(check_ranges(c));
  if (c.dp * c.tp * c.pp != ranks)
    return bad("parallel",
               fmt::format("dp x tp x pp = {} x {} x {} = {} does not match the cluster's {} ranks",
                           c.dp, c.tp, c.pp, c.dp * c.tp * c.pp, ranks),
               "the degrees' product must equal the rank count: change them or the node count");
  const auto blocks = static_cast<std::int64_t>(m.blocks.size());
  if (c.pp > blocks)
    return bad("parallel.pp", fmt::format("pp = {} exceeds the model's {} blocks", c.pp, blocks),
               "every pipeline stage needs at least one block");
  if (c.schedule == recipe::Schedule::zbv)
    return bad("parallel.schedule",
               "hp plan does not model the zbv schedule (its V places chunk 1 of rank r at stage "
               "2pp-1-r, a layout the planner does not price)",
               "predict the recipe with schedule = \"zb-h1\", which the planner models");
  if (c.virtual_stages > 1 && c.schedule != recipe::Schedule::interleaved)
    return bad("parallel.virtual_stages",
               fmt::format("virtual_stages = {} needs the interleaved schedule, not {}",
                           c.virtual_stages, recipe::schedule_name(c.schedule)),
               "set schedule = interleaved, or virtual_stages = 1");
  if (c.schedule == recipe::Schedule::interleaved) {
    if (c.virtual_stages < 2)
      return bad("parallel.virtual_stages", "the interleaved schedule needs virtual_stages >= 2",
                 "set virtual_stages, or use the 1f1b schedule");
    if (c.pp * c.virtual_stages > blocks)
      return bad("parallel.virtual_stages",
                 fmt::format("pp x virtual_stages = {} x {} exceeds the model's {} blocks", c.pp,
                             c.virtual_stages, blocks),
                 "every virtual stage needs at least one block");
    if (c.micro_batches % c.pp != 0)
      return bad("parallel.micro_batches", fmt::format("micro_batches = {} is not a multiple of pp "
                                                       "= {}, which the interleaved schedule needs",
                                                       c.micro_batches, c.pp));
  }
  if (m.heads > 0 && m.heads % c.tp != 0)
    return bad("parallel.tp",
               fmt::format("tp = {} does not divide the model's {} attention heads", c.tp, m.heads),
               "Megatron TP splits whole heads: use a divisor of the head count");
  const std::int64_t experts = routed_experts(m);
  if (c.ep > 1 && experts == 0)
    return bad("parallel.expert_parallel",
               fmt::format("expert_parallel = {}, but the model has no routed experts", c.ep),
               "set expert_parallel = 1");
  if (c.ep > 1 && experts % c.ep != 0)
    return bad(
        "parallel.expert_parallel",
        fmt::format("expert_parallel = {} does not divide the model's {} experts", c.ep, experts),
        "use a divisor of the expert count");
  if (c.dp % c.ep != 0)
    return bad("parallel.expert_parallel",
               fmt::format("expert_parallel = {} does not divide dp = {}", c.ep, c.dp),
               "expert parallelism is carved out of dp");
  if (c.shard_group > 0 && c.dp % c.shard_group != 0)
    return bad("shard_group",
               fmt::format("shard_group = {} does not divide dp = {}", c.shard_group, c.dp),
               "the HSDP group is a divisor of the DP group");
  return {};
}

// A given layout: one entry per pipeline rank, each holding blocks, every block on exactly one
// rank.
Status check_layout(const std::vector<StageLayout>& stages, const Config& c,
                    const ModelProfile& m) {
  if (static_cast<std::int64_t>(stages.size()) != c.pp)
    return bad("stages",
               fmt::format("the layout has {} pipeline ranks but pp is {}", stages.size(), c.pp));
  const auto blocks = static_cast<std::int64_t>(m.blocks.size());
  std::vector<std::int64_t> owner(static_cast<std::size_t>(blocks), -1);
  for (std::size_t k = 0; k < stages.size(); ++k) {
    const StageLayout& s = stages[k];
    if (s.blocks.empty())
      return bad("stages", fmt::format("pipeline rank {} holds no blocks", k),
                 "every pipeline rank needs at least one block");
    if (!s.recompute.empty() && s.recompute.size() != s.blocks.size())
      return bad("stages", fmt::format("pipeline rank {} has {} blocks but {} recompute choices", k,
                                       s.blocks.size(), s.recompute.size()));
    for (auto b : s.blocks) {
      if (b < 0 || b >= blocks)
        return bad("stages",
                   fmt::format("pipeline rank {} holds layer {}, but the model's blocks are 0-{}",
                               k, b, blocks - 1),
                   "layers are the block numbers of layer discovery (hp plan --summary)");
      auto& o = owner[static_cast<std::size_t>(b)];
      if (o >= 0)
        return bad("stages",
                   fmt::format("layer {} is on pipeline rank {} and pipeline rank {}", b, o, k));
      o = static_cast<std::int64_t>(k);
    }
  }
  for (std::size_t b = 0; b < owner.size(); ++b)
    if (owner[b] < 0)
      return bad("stages", fmt::format("layer {} is on no pipeline rank", b),
                 "the stages must hold every block of the model");
  return {};
}

// Level 2 as the search runs it; when no assignment fits, the even split (interleaved: pp x v even
// chunks) with the recomputation that comes closest, so a configuration that does not fit still
// gets a price (its infeasible stages say why).
std::vector<StagePlan> level2(const ModelProfile& m, const Config& c, const Workload& w,
                              const Machine& mc, const AxisLinks& links) {
  auto stages = assign_stages(m, c, w, mc, links);
  if (!stages.empty()) return stages;
  const CostTable table = cost_table(m, c, w, mc, links);
  const StageContext ctx{m, c, w, mc, links, table};
  const auto blocks = static_cast<std::int64_t>(m.blocks.size());
  std::vector<std::int64_t> counts(static_cast<std::size_t>(c.pp));
  for (std::int64_t k = 0; k < c.pp; ++k)
    counts[static_cast<std::size_t>(k)] = blocks / c.pp + (k < blocks % c.pp ? 1 : 0);
  const auto layout = interleaved_layout(counts, c.virtual_stages);
  for (std::int64_t k = 0; k < c.pp; ++k)
    stages.push_back(evaluate_stage(ctx, k, layout[static_cast<std::size_t>(k)]));
  return stages;
}

// The given layout priced as level 2 prices the one it picks (cost_stage with the given
// recomputation).
std::vector<StagePlan> given_stages(const std::vector<StageLayout>& layout, const ModelProfile& m,
                                    const Config& c, const Workload& w, const Machine& mc,
                                    const AxisLinks& links) {
  const CostTable table = cost_table(m, c, w, mc, links);
  const StageContext ctx{m, c, w, mc, links, table};
  std::vector<StagePlan> stages;
  for (std::size_t k = 0; k < layout.size(); ++k) {
    const StageLayout& s = layout[k];
    auto rc = s.recompute.empty()
                  ? std::vector<recipe::Recompute>(s.blocks.size(), recipe::Recompute::none)
                  : s.recompute;
    stages.push_back(cost_stage(ctx, static_cast<std::int64_t>(k), s.blocks, std::move(rc)));
  }
  return stages;
}

// The first placement (in the search's order) whose stage ranks are the recipe's, among the stages
// that list ranks; the default placement when none does.
void recover_placement(const recipe::Recipe& r, Config& c) {
  for (const auto& order : kAxisOrders) {
    Config t = c;
    std::copy(order, order + 3, t.order);
    const bool same = std::all_of(r.stages.begin(), r.stages.end(), [&](const recipe::Stage& s) {
      return s.ranks.empty() || s.ranks == stage_ranks(t, s.index % t.pp);
    });
    if (same) {
      std::copy(order, order + 3, c.order);
      return;
    }
  }
}

// The recipe's [[stages]] as per-rank layouts: stage j runs on pipeline rank j mod pp, so rank k's
// blocks are those of stages k, k + pp, ... in that order.
Expected<std::vector<StageLayout>> recipe_layout(const recipe::Recipe& r) {
  const recipe::Parallel& p = r.parallel;
  const std::int64_t chunks = p.pp * p.virtual_stages;
  if (static_cast<std::int64_t>(r.stages.size()) != chunks)
    return bad(
        "stages",
        fmt::format("the recipe has {} stages but pp x virtual_stages is {}", r.stages.size(),
                    chunks),
        "write one [[stages]] entry per pipeline stage (and per virtual stage when interleaved)");
  std::vector<const recipe::Stage*> by_index(static_cast<std::size_t>(chunks), nullptr);
  for (std::size_t i = 0; i < r.stages.size(); ++i) {
    const recipe::Stage& s = r.stages[i];
    if (s.index < 0 || s.index >= chunks || by_index[static_cast<std::size_t>(s.index)])
      return bad(fmt::format("stages[{}].index", i),
                 fmt::format("stage index {} is out of range or repeated", s.index),
                 "stages are numbered 0 .. pp x virtual_stages - 1, each once");
    by_index[static_cast<std::size_t>(s.index)] = &s;
  }
  std::vector<StageLayout> layout(static_cast<std::size_t>(p.pp));
  for (std::int64_t j = 0; j < chunks; ++j) {
    StageLayout& rank = layout[static_cast<std::size_t>(j % p.pp)];
    for (auto layer : by_index[static_cast<std::size_t>(j)]->layers) {
      rank.blocks.push_back(layer);
      rank.recompute.push_back(by_index[static_cast<std::size_t>(j)]->recompute_of(layer));
    }
  }
  return layout;
}

}  // namespace

Expected<Plan> predict(const Candidate& candidate, const recipe::Cluster& cluster,
                       const ModelProfile& profile, const PredictOptions& options) {
  HP_ASSIGN_OR_RETURN(const auto topo, topology::Topology::from_cluster(cluster));
  const Config& c = candidate.config;
  HP_TRY(check_config(c, topo.ranks(), profile));
  if (!candidate.stages.empty()) HP_TRY(check_layout(candidate.stages, c, profile));
  if (dtype_bytes(options.dtype) != profile.dtype_bytes)
    return bad("dtype",
               fmt::format("the profile counts {} bytes per element, {} has {}",
                           profile.dtype_bytes, options.dtype, dtype_bytes(options.dtype)),
               "profile the model in the dtype the prediction is for");
  std::vector<std::string> warnings;  // a device priced at its fp32 peak is still priced
  HP_ASSIGN_OR_RETURN(const Machine mc, machine_for(topo, options.dtype, cluster.name, warnings));
  const Workload w = workload_for(options.train, options.dtype, options.optimizer,
                                  c.dp * c.micro_batch_size * c.micro_batches);
  HP_ASSIGN_OR_RETURN(const AxisLinks links, axis_links(topo, c));
  Plan plan{c, {}, {}, links};
  plan.stages = candidate.stages.empty() ? level2(profile, c, w, mc, links)
                                         : given_stages(candidate.stages, profile, c, w, mc, links);
  plan.predicted = predict(profile, c, w, mc, links, plan.stages);
  return plan;
}

Candidate candidate_of(const Plan& plan) {
  Candidate k{plan.config, {}};
  for (const auto& s : plan.stages) k.stages.push_back({s.blocks, s.recompute});
  return k;
}

Expected<Candidate> candidate_of(const recipe::Recipe& r) {
  const recipe::Parallel& p = r.parallel;
  Candidate k;
  Config& c = k.config;
  c.dp = p.dp, c.tp = p.tp, c.pp = p.pp, c.ep = p.expert_parallel;
  c.routed_experts = p.routed_experts;
  c.optimizer_shard = p.optimizer_shard;
  c.zero3_per_step = p.zero3_per_step;
  c.shard_group = p.shard_group;
  c.micro_batch_size = p.micro_batch_size, c.micro_batches = p.micro_batches;
  c.schedule = p.schedule, c.virtual_stages = p.virtual_stages;
  c.sequence_parallel = p.sequence_parallel;
  // Degrees out of range are predict()'s to report; nothing here divides by them.
  if (p.dp < 1 || p.tp < 1 || p.pp < 1 || p.micro_batches < 1 || p.virtual_stages < 1) return k;
  if (auto batch = r.dims.find("batch"); batch != r.dims.end()) {
    const std::int64_t per_step = p.dp * p.micro_batches;
    if (batch->second < per_step || batch->second % per_step != 0)
      return bad("model.dims",
                 fmt::format("the batch dim {} is not a multiple of dp x micro_batches = {} x {}",
                             batch->second, p.dp, p.micro_batches),
                 "bind batch to dp x micro_batch_size x micro_batches sequences");
    c.micro_batch_size = batch->second / per_step;
  }
  if (r.stages.empty()) return k;
  HP_ASSIGN_OR_RETURN(k.stages, recipe_layout(r));
  recover_placement(r, c);
  return k;
}

Expected<Plan> predict_recipe(const recipe::Recipe& r, const fs::path& base_dir,
                              const recipe::Cluster& cluster, const PredictOptions& options) {
  HP_ASSIGN_OR_RETURN(const Candidate candidate, candidate_of(r));
  // The sequence length: the recipe's [model] dims (under the model's own dim name), its
  // [workload] seq, or the model's static length; load_profile says which is missing.
  ProfileRequest request;
  request.model = base_dir / r.model;
  request.dims = r.dims;
  if (r.workload) request.seq = r.workload->seq;
  request.dtype = options.dtype;
  HP_ASSIGN_OR_RETURN(const LoadedProfile loaded, load_profile(request));
  return predict(candidate, cluster, loaded.profile, options);
}

}  // namespace hp::planner
