// One pipeline rank's cost, and the step time of a whole plan.
//
// A rank's peak memory is its model states, plus the activations of its blocks times the number of
// micro-batches the schedule keeps in flight there (in_flight(): 1F1B stage k holds p-k, GPipe all m,
// interleaving adds (p-1)/(p v)), plus communication buffers (a send and a receive buffer for the
// pipeline, a TP collective buffer, a DP gradient bucket, the prefetched gathered block under
// ZeRO-3), plus the activations a fully recomputed block rebuilds during its backward, plus the
// transient margin. Recompute choices are per block (none / selective / full).
//
// The step time (predict) is the Metis form of planner.md §1 generalised to interleaving:
//   T_pipe = m * max_k t_k + (sum_k t_k - max_k t_k) / v
// which is (m - 1) max t + sum t for v = 1 and m t + (p - 1) t / v for equal stages (the
// interleaved bubble of Narayanan et al. 2021). DP gradient reduction, ZeRO gathers and the optimizer
// step follow the pipeline flush, minus their overlap ratios.
#include "stage.h"

#include <algorithm>

#include "hp/topology/collectives.h"

namespace hp::planner {

CostTable cost_table(const ModelProfile& m, const Config& c, const Workload& w, const Machine& mc,
                     const AxisLinks& links) {
  CostTable t;
  t.blocks.reserve(m.blocks.size());
  // Repeated blocks are usually identical: cost each distinct profile once.
  auto same = [](const BlockProfile& x, const BlockProfile& y) {
    return x.parameters == y.parameters && x.fwd_flops == y.fwd_flops && x.quadratic_flops == y.quadratic_flops &&
           x.act_bytes == y.act_bytes && x.quadratic_act_bytes == y.quadratic_act_bytes &&
           x.boundary_bytes == y.boundary_bytes && x.tp_collectives == y.tp_collectives && x.kernels == y.kernels;
  };
  for (std::size_t i = 0; i < m.blocks.size(); ++i) {
    if (i > 0 && same(m.blocks[i], m.blocks[i - 1]))
      t.blocks.push_back(t.blocks.back());
    else
      t.blocks.push_back(block_cost(m.blocks[i], m, c, w, mc, links));
  }
  t.prologue = block_cost(m.prologue, m, c, w, mc, links);
  t.epilogue = block_cost(m.epilogue, m, c, w, mc, links);
  return t;
}

namespace {

using recipe::Recompute;

int level(Recompute r) { return r == Recompute::none ? 0 : r == Recompute::selective ? 1 : 2; }

double rc_time(const BlockCost& b, Recompute r) {
  return r == Recompute::none ? 0.0 : r == Recompute::selective ? b.rc_selective : b.rc_full;
}

// One upgrade step of one block (none -> selective or selective -> full).
struct Upgrade {
  std::size_t slot = 0;
  int to = 1;
  double saves = 0, costs = 0;
};

double buffers(const StageContext& ctx, const std::vector<std::int64_t>& blocks) {
  const Config& c = ctx.config;
  const double msg = static_cast<double>(c.micro_batch_size) * ctx.model.hidden_bytes;
  double bytes = 0;
  if (c.pp > 1) bytes += 2.0 * msg;
  if (c.tp > 1) bytes += msg;
  if (ctx.work.train && c.dp > 1) bytes += 64.0 * 1024 * 1024;  // one gradient bucket (DDP default 25M fp32 ~ 100 MB; we count 64 MiB)
  if (c.optimizer_shard == 3) {
    double biggest = 0;
    for (auto b : blocks) biggest = std::max(biggest, ctx.costs.blocks[b].weight_bytes);
    bytes += 2.0 * biggest * static_cast<double>(c.dp);  // gathered block + prefetch
  }
  return bytes;
}

}  // namespace

StagePlan evaluate_stage(const StageContext& ctx, std::int64_t stage, std::vector<std::int64_t> blocks) {
  const Config& c = ctx.config;
  const auto& costs = ctx.costs;
  const bool first = stage == 0, last = stage == c.pp - 1;
  StagePlan s;
  s.blocks = std::move(blocks);
  s.recompute.assign(s.blocks.size(), Recompute::none);
  const double flight = ctx.work.train ? in_flight(c, stage) : 1.0;

  // Fixed parts: states, buffers, margin, prologue/epilogue activations (never recomputed).
  double fixed = buffers(ctx, s.blocks) + ctx.machine.cal.transient_margin * ctx.machine.memory;
  double states = 0, acts = 0, transient = 0;
  auto add_edge = [&](const BlockCost& b) {
    states += b.state_bytes;
    acts += b.act[0] * flight;
    s.compute += b.fwd + b.bwd;
    s.tp_comm += b.tp_comm;
    if (!ctx.work.train) transient = std::max(transient, b.act[0]);
  };
  if (first) add_edge(costs.prologue);
  if (last) add_edge(costs.epilogue);
  for (auto b : s.blocks) {
    const BlockCost& bc = costs.blocks[b];
    states += bc.state_bytes;
    acts += bc.act[0] * flight;
    s.compute += bc.fwd + bc.bwd;
    s.tp_comm += bc.tp_comm;
    if (!ctx.work.train) transient = std::max(transient, ctx.model.blocks[b].act_bytes);
  }
  auto total = [&] { return states + acts + fixed + transient; };

  // Recompute greedily while over the limit: best bytes saved per second added first.
  if (ctx.work.train && c.forced_recompute > 0) {
    const auto forced = static_cast<Recompute>(c.forced_recompute);
    for (std::size_t i = 0; i < s.blocks.size(); ++i) {
      const BlockCost& bc = costs.blocks[s.blocks[i]];
      acts -= (bc.act[0] - bc.act[level(forced)]) * flight;
      s.recompute[i] = forced;
    }
  } else if (ctx.work.train && c.forced_recompute < 0 && total() > ctx.machine.memory) {
    std::vector<Upgrade> ups;
    for (std::size_t i = 0; i < s.blocks.size(); ++i) {
      const BlockCost& bc = costs.blocks[s.blocks[i]];
      ups.push_back({i, 1, (bc.act[0] - bc.act[1]) * flight, bc.rc_selective});
      ups.push_back({i, 2, (bc.act[1] - bc.act[2]) * flight, bc.rc_full - bc.rc_selective});
    }
    std::stable_sort(ups.begin(), ups.end(), [](const Upgrade& a, const Upgrade& b) {
      return a.saves * b.costs > b.saves * a.costs;  // a.saves/a.costs > b.saves/b.costs, no division
    });
    for (const auto& u : ups) {
      if (total() <= ctx.machine.memory) break;
      if (u.saves <= 0 || level(s.recompute[u.slot]) >= u.to) continue;
      const BlockCost& bc = costs.blocks[s.blocks[u.slot]];
      acts -= (bc.act[level(s.recompute[u.slot])] - bc.act[u.to]) * flight;
      s.recompute[u.slot] = u.to == 1 ? Recompute::selective : Recompute::full;
    }
  }
  // A fully recomputed block rebuilds its whole activations once during its backward.
  for (std::size_t i = 0; i < s.blocks.size(); ++i) {
    const BlockCost& bc = costs.blocks[s.blocks[i]];
    if (s.recompute[i] == Recompute::full) transient = std::max(transient, bc.act[0]);
    s.recompute_time += rc_time(bc, s.recompute[i]);
    const double rc_flops = s.recompute[i] == Recompute::none ? 0.0
                            : s.recompute[i] == Recompute::selective ? ctx.model.blocks[s.blocks[i]].quadratic_flops
                                                                     : ctx.model.blocks[s.blocks[i]].fwd_flops;
    s.recompute_flops += static_cast<double>(c.micro_batch_size) * rc_flops / static_cast<double>(c.tp);
  }
  if (c.pp > 1) {
    const double msg = static_cast<double>(c.micro_batch_size) * ctx.model.hidden_bytes /
                       (c.sequence_parallel ? static_cast<double>(c.tp) : 1.0);
    const double sends = (first || last ? 1.0 : 2.0) * (ctx.work.train ? 2.0 : 1.0) *
                         static_cast<double>(c.virtual_stages);
    s.pp_comm = sends * topology::send_recv_time(ctx.links.pp, msg) * (1.0 - ctx.machine.cal.overlap_pp);
  }
  s.states = states;
  s.activations = acts;
  s.memory = total();
  s.feasible = s.memory <= ctx.machine.memory;
  s.time = s.compute + s.recompute_time + s.tp_comm + s.pp_comm;
  return s;
}

Prediction predict(const ModelProfile& m, const Config& c, const Workload& w, const Machine& mc,
                   const AxisLinks& links, const std::vector<StagePlan>& stages) {
  Prediction p;
  const double mbs = static_cast<double>(c.micro_batches);
  const double v = static_cast<double>(c.virtual_stages);
  const double pp = static_cast<double>(c.pp);
  double tmax = 0, tsum = 0, rc_flops = 0, states_params = 0;
  for (const auto& s : stages) {
    tmax = std::max(tmax, s.time);
    tsum += s.time;
    p.compute += mbs * s.compute / pp;
    p.recompute += mbs * s.recompute_time / pp;
    p.tp_exposed += mbs * s.tp_comm / pp;
    p.pp_exposed += mbs * s.pp_comm / pp;
    rc_flops += s.recompute_flops;
    p.peak_memory = std::max(p.peak_memory, s.memory);
  }
  const double pipeline = mbs * tmax + (tsum - tmax) / v;
  p.bubble = std::max(0.0, pipeline - (p.compute + p.recompute + p.tp_exposed + p.pp_exposed));

  if (w.train) {
    // The biggest rank's parameters decide the post-flush collectives and the optimizer step.
    for (std::size_t k = 0; k < stages.size(); ++k) {
      double params = 0;
      for (auto b : stages[k].blocks) params += m.blocks[b].parameters;
      if (k == 0) params += m.prologue.parameters;
      if (k + 1 == stages.size()) params += m.epilogue.parameters;
      states_params = std::max(states_params, params / static_cast<double>(c.tp));
    }
    const double grads = states_params * w.grad_bytes;
    const double weights = states_params * m.dtype_bytes;
    if (c.optimizer_shard == 0) {
      p.dp_exposed = topology::all_reduce_time(links.dp, c.dp, grads) * (1.0 - mc.cal.overlap_dp);
    } else {
      p.dp_exposed = topology::reduce_scatter_time(links.dp, c.dp, grads) * (1.0 - mc.cal.overlap_dp);
      const double gathers = c.optimizer_shard == 3 ? 2.0 * mbs : 1.0;
      const double hidden = c.optimizer_shard == 3 ? mc.cal.overlap_opt : 0.0;
      p.opt_exposed = gathers * topology::all_gather_time(links.dp, c.dp, weights) * (1.0 - hidden);
    }
    // Adam reads weights, grads, master, two moments and writes four of them: ~32 bytes/param.
    const double shard = c.optimizer_shard > 0 ? static_cast<double>(c.dp) : 1.0;
    if (mc.memory_bandwidth > 0) p.optimizer_step = 32.0 * states_params / shard / mc.memory_bandwidth;
  }
  p.iteration = pipeline + p.dp_exposed + p.opt_exposed + p.optimizer_step;

  const double devices = static_cast<double>(c.dp * c.tp * c.pp);
  const double seqs = static_cast<double>(w.global_batch);
  p.tokens_per_second = seqs * static_cast<double>(m.seq) / p.iteration;
  p.model_flops = (w.train ? 3.0 : 1.0) * m.total_fwd_flops() * seqs;
  p.hardware_flops = p.model_flops + rc_flops * mbs * static_cast<double>(c.tp * c.dp);
  p.tflops_model = p.model_flops / p.iteration / devices / 1e12;
  p.tflops_hardware = p.hardware_flops / p.iteration / devices / 1e12;
  p.mfu = p.tflops_model * 1e12 / mc.peak_flops;
  p.hfu = p.tflops_hardware * 1e12 / mc.peak_flops;
  return p;
}

}  // namespace hp::planner
