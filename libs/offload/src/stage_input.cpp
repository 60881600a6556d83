// build_stages (stage_input.h). Unit seconds and activation bytes come from planner::block_cost,
// which already applies TP, sequence parallelism and the micro-batch size; recompute picks the
// kept bytes (act[none|selective|full]) and adds the rebuild to the backward.
#include "hp/offload/stage_input.h"

#include <algorithm>
#include <map>

#include <fmt/core.h>

#include "hp/model/summary.h"
#include "hp/offload/formulas.h"
#include "hp/planner/planner.h"
#include "hp/planner/predict.h"
#include "hp/topology/collectives.h"
#include "hp/topology/topology.h"

namespace hp::offload {
namespace {

struct Placed {
  std::int64_t chunk = 0;
  std::int64_t block = -1;  ///< -1 prologue, -2 epilogue
  recipe::Recompute rc = recipe::Recompute::none;
};

// The residual stream's width h: the widest float tensor crossing a block boundary with exactly one
// sequence dim (attention masks have two; rotary tables are narrower). The planner's hidden_bytes
// sums every tensor of the widest cut, masks and rotary tables included, which would overstate the
// KV cache. 0 when no cut has such a tensor.
double residual_width(const model::ModelSummary& s, std::int64_t seq) {
  double h = 0;
  for (const auto& c : s.layering.cuts)
    for (int ti : c.tensors) {
      const model::Tensor& t = s.graph.tensor(ti);
      if (!t.has_shape || !t.is_float()) continue;
      int seq_dims = 0;
      for (const auto& d : t.dims) seq_dims += d.value == seq ? 1 : 0;
      const auto n = t.numel();
      if (seq_dims == 1 && n) h = std::max(h, static_cast<double>(*n) / static_cast<double>(seq));
    }
  return h;
}

// What every unit of every stage is priced with: the recipe's configuration as the planner sees it,
// the links of its parallel axes, the machine and the workload (train, and a forward-only twin
// whose activations are what exists while a unit runs, also for inference).
struct Pricing {
  const recipe::Recipe& r;
  const StageBuildOptions& o;
  const model::ModelSummary& summary;
  const planner::ModelProfile& prof;
  std::int64_t seq = 0;
  double db = 0;  ///< bytes per element of the dtype
  planner::Config c;
  planner::AxisLinks links;
  planner::Machine mc;
  planner::Workload w, wt;
  double hidden = 0;    ///< the residual stream's width (KV cache)
  double kv_ratio = 1;  ///< kv heads / heads (GQA)

  // Which blocks each pipeline rank runs, and in which chunk, prologue first and epilogue last.
  Expected<std::vector<std::vector<Placed>>> place() const;
  // One unit: its states, activations, times and copies (training or inference).
  Unit unit_of(const Placed& pl, const planner::BlockProfile& b, const planner::BlockCost& bc,
               const planner::BlockCost& bt, double& rc_time) const;
  // Pipeline rank k's units, the planner's view of its time and its capacity figures.
  void build_stage(std::int64_t k, std::vector<Placed>& placed, BuiltStages& out,
                   std::vector<planner::StagePlan>& plans) const;
};

Expected<std::vector<std::vector<Placed>>> Pricing::place() const {
  const auto& p = r.parallel;
  const auto nblocks = static_cast<std::int64_t>(prof.blocks.size());
  std::vector<std::vector<Placed>> ranks(static_cast<std::size_t>(p.pp));
  if (r.stages.empty()) {
    for (std::int64_t b = 0; b < nblocks; ++b) ranks[0].push_back({0, b, recipe::Recompute::none});
  } else {
    for (const auto& st : r.stages)
      for (auto b : st.layers) {
        if (b < 0 || b >= nblocks)
          return Error(Errc::bad_input,
                       fmt::format("stage {} names layer {} but the model has {} blocks", st.index,
                                   b, nblocks),
                       r.name, "re-plan the recipe for this model");
        ranks[static_cast<std::size_t>(st.index % p.pp)].push_back(
            {st.index / p.pp, b, st.recompute_of(b)});
      }
  }
  ranks.front().insert(ranks.front().begin(), Placed{0, -1, recipe::Recompute::none});
  ranks.back().push_back(Placed{c.virtual_stages - 1, -2, recipe::Recompute::none});
  return ranks;
}

Unit Pricing::unit_of(const Placed& pl, const planner::BlockProfile& b,
                      const planner::BlockCost& bc, const planner::BlockCost& bt,
                      double& rc_time) const {
  const auto& p = r.parallel;
  const double t = static_cast<double>(p.tp);
  const double mbs = static_cast<double>(p.micro_batch_size);
  const std::int64_t shard = p.optimizer_shard > 0 ? p.dp : 1;
  Unit u;
  u.name = b.name.empty() ? (pl.block == -1   ? "prologue"
                             : pl.block == -2 ? "epilogue"
                                              : "block")
                          : b.name;
  u.chunk = pl.chunk;
  u.param_count = bc.dense_params + bc.expert_params;
  const int lv = static_cast<int>(pl.rc);
  rc_time = 0;
  // Model states exactly as the planner counts them (expert parallelism and ZeRO applied).
  const planner::StateBytes st = planner::block_states(bc, prof, c, w);
  u.parameters = st.parameters;
  if (!o.train) {
    u.act = bc.act_infer;
    u.fwd = bc.fwd + bc.tp_comm;
    if (b.quadratic_flops > 0)  // attention: K and V of every token of the micro-batch
      u.kv = 2.0 * hidden * kv_ratio * static_cast<double>(seq) * mbs * db / t;
    return u;
  }
  u.gradients = st.gradients;
  u.optimizer = st.optimizer;
  u.act = bc.act[lv];
  u.act_transient = bc.act[0] - bc.act[lv];
  rc_time = pl.rc == recipe::Recompute::full        ? bc.rc_full
            : pl.rc == recipe::Recompute::selective ? bc.rc_selective
                                                    : 0;
  u.fwd = bc.fwd + bc.tp_comm / 2;
  u.bwd = bc.bwd + rc_time + bc.tp_comm / 2;
  if (w.optimizer_state_bytes > 0) {
    // Adam reads weights, grads, master, two moments and writes four of them: ~32 bytes/param
    // (the planner's figure); SGD touches about half.
    const double per = w.optimizer_state_bytes >= 8 ? 32.0 : 16.0;
    u.opt_bytes = per * u.param_count / static_cast<double>(shard);
    u.opt = mc.memory_bandwidth > 0 ? u.opt_bytes / mc.memory_bandwidth : 0;
    u.update_bytes = u.param_count / static_cast<double>(shard) * db;
  }
  return u;
}

void Pricing::build_stage(std::int64_t k, std::vector<Placed>& placed, BuiltStages& out,
                          std::vector<planner::StagePlan>& plans) const {
  const auto& p = r.parallel;
  const double t = static_cast<double>(p.tp);
  const double mbs = static_cast<double>(p.micro_batch_size);
  std::stable_sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
    if (a.chunk != b.chunk) return a.chunk < b.chunk;
    auto key = [](std::int64_t x) { return x == -1 ? -1 : x == -2 ? std::int64_t{1} << 60 : x; };
    return key(a.block) < key(b.block);
  });
  StageInput in;
  in.stage = k;
  in.stages = p.pp;
  in.micro_batches = p.micro_batches;
  in.virtual_stages = c.virtual_stages;
  in.schedule = p.schedule;
  in.train = o.train;
  planner::StagePlan sp;
  CapacityStage cs;
  double grads = 0, a2a = 0, biggest = 0;
  for (const auto& pl : placed) {
    const planner::BlockProfile& b = pl.block == -1 ? prof.prologue
                                     : pl.block == -2
                                         ? prof.epilogue
                                         : prof.blocks[static_cast<std::size_t>(pl.block)];
    const planner::BlockCost bc = planner::block_cost(b, prof, c, w, mc, links);
    const planner::BlockCost bt = planner::block_cost(b, prof, c, wt, mc, links);
    double rc_time = 0;
    Unit u = unit_of(pl, b, bc, bt, rc_time);
    grads += bc.grad_bytes;
    a2a = std::max(a2a, bc.a2a_buffer);
    biggest = std::max(biggest, bc.weight_bytes);
    sp.compute += bc.fwd + bc.bwd;
    sp.recompute_time += rc_time;
    sp.tp_comm += bc.tp_comm;
    if (pl.block >= 0) {
      sp.blocks.push_back(pl.block);
      sp.recompute.push_back(pl.rc);
    }
    in.workspace = std::max(in.workspace, planner::unit_workspace(b, c));
    cs.weights.push_back(u.parameters);
    cs.kv_per_token.push_back(u.kv / (static_cast<double>(seq) * mbs));
    cs.act_per_token = std::max(cs.act_per_token, bt.act[0] / (static_cast<double>(seq) * mbs));
    in.units.push_back(std::move(u));
  }
  // The planner's buffers (cost.h stage_buffers), so the peak here is the stage memory it reports.
  in.buffers = planner::stage_buffers(prof, c, w, grads, a2a, biggest);
  if (p.pp > 1) {
    const double msg = mbs * prof.hidden_bytes / (p.sequence_parallel ? t : 1.0);
    const bool edge = k == 0 || k == p.pp - 1;
    const double sends =
        (edge ? 1.0 : 2.0) * (o.train ? 2.0 : 1.0) * static_cast<double>(c.virtual_stages);
    sp.pp_comm = sends * topology::send_recv_time(links.pp, msg) * (1.0 - mc.cal.overlap_pp);
  }
  sp.time = sp.compute + sp.recompute_time + sp.tp_comm + sp.pp_comm;
  cs.fixed = in.buffers + in.workspace;
  plans.push_back(std::move(sp));
  out.capacity.stages.push_back(std::move(cs));
  out.stages.push_back(std::move(in));
}

}  // namespace

Expected<BuiltStages> build_stages(const recipe::Recipe& r, const recipe::Cluster& cluster,
                                   const StageBuildOptions& o) {
  // The planner's own profile of the model: the same batch and sequence axes (whatever the export
  // named them; a static sequence or none), the same per-sequence figures, so the two tools price
  // one model.
  planner::ProfileRequest request;
  request.model = o.model;
  request.dims = {r.dims.begin(), r.dims.end()};
  request.seq = r.workload ? r.workload->seq : 0;
  request.dtype = dtype_name(o.dtype);
  HP_ASSIGN_OR_RETURN(const planner::LoadedProfile loaded, planner::load_profile(request));
  const model::ModelSummary& summary = loaded.summary;
  const planner::ModelProfile& prof = loaded.profile;
  const std::int64_t seq = prof.seq;
  const double db = dtype_size(o.dtype);
  HP_ASSIGN_OR_RETURN(auto topo, topology::Topology::from_cluster(cluster));
  const auto& p = r.parallel;
  if (r.ranks() != topo.ranks())
    return Error(Errc::bad_input,
                 fmt::format("dp*tp*pp = {} ranks but cluster '{}' has {}", r.ranks(), cluster.name,
                             topo.ranks()),
                 r.name, "run 'hp verify' on the recipe");

  Pricing pr{r, o, summary, prof};
  pr.seq = seq;
  pr.db = db;
  planner::Config& c = pr.c;
  c.dp = p.dp, c.tp = p.tp, c.pp = p.pp;
  c.optimizer_shard = p.optimizer_shard;
  c.micro_batch_size = p.micro_batch_size, c.micro_batches = p.micro_batches;
  c.schedule = p.schedule;
  c.virtual_stages = p.schedule == recipe::Schedule::interleaved ? p.virtual_stages : 1;
  c.sequence_parallel = p.sequence_parallel;
  c.ep = p.expert_parallel;
  HP_ASSIGN_OR_RETURN(pr.links, planner::axis_links(topo, c));
  BuiltStages out;
  out.device = topo.device();
  out.seq = seq;
  // The planner's own view of the device; its warnings (a dtype priced at the fp32 peak) are hp
  // plan's to print, not the memory timeline's.
  std::vector<std::string> planner_warnings;
  HP_ASSIGN_OR_RETURN(
      pr.mc, planner::machine_for(topo, dtype_name(o.dtype), cluster.name, planner_warnings));
  pr.w.train = o.train;
  pr.w.global_batch = p.dp * p.micro_batch_size * p.micro_batches;
  pr.w.grad_bytes = db;
  pr.w.optimizer_state_bytes = optimizer_state_bytes(o.optimizer, o.dtype);
  pr.wt = pr.w;
  pr.wt.train =
      true;  // activations of a forward, also for inference (what exists while a unit runs)
  pr.hidden = residual_width(summary, seq);
  if (pr.hidden <= 0) pr.hidden = prof.hidden_bytes / (static_cast<double>(seq) * db);
  pr.kv_ratio = o.heads > 0 ? static_cast<double>(o.kv_heads) / static_cast<double>(o.heads) : 1.0;

  HP_ASSIGN_OR_RETURN(auto ranks, pr.place());
  std::vector<planner::StagePlan> plans;
  for (std::int64_t k = 0; k < p.pp; ++k)
    pr.build_stage(k, ranks[static_cast<std::size_t>(k)], out, plans);
  out.predicted_step = planner::predict(prof, c, pr.w, pr.mc, pr.links, plans).iteration;
  out.capacity.context = seq;
  out.capacity.batch = p.micro_batch_size * p.micro_batches;
  return out;
}

}  // namespace hp::offload
