// One pipeline rank's cost, and the step time of a whole plan.
//
// A rank's peak memory is its weights and optimizer states, plus its activations and gradients at
// the schedule's busiest moment, plus communication buffers and kernel workspace (stage_buffers,
// unit_workspace in cost.h). The activations are priced per model chunk against the schedule's
// live micro-batch counts (schedule.h: live_counts, activation_peak), which include what a
// recomputed block rebuilds during its backward and the gradients each unit allocates in its first
// backward, so this is the peak hp offload-profile's timeline simulates from the same op order
// (docs/planner.md, "Memory"). It must fit the device memory less the transient margin (the
// context, library buffers and fragmentation no model sees), which is kept free rather than added
// to the prediction. Recompute choices are per block (none / selective / full): exact (every count
// of full and selective blocks) when a rank's
// blocks are identical, greedy by bytes saved per second added otherwise.
//
// The step time (predict) is the Metis form of the pipeline time generalised to interleaving:
//   T_pipe = m * max_k t_k + (sum_k t_k - max_k t_k) / v
// which is (m - 1) max t + sum t for v = 1 and m t + (p - 1) t / v for equal stages (the
// interleaved bubble of Narayanan et al. 2021). ZB-H1 scales the bubble term by f / (f + b + w),
// its bubble_seconds over 1F1B's with the backward split evenly (b = w: the input and the weight
// gradient of a matmul cost the same), i.e. the plan's forward share of compute. DP gradient
// reduction, ZeRO gathers and the optimizer step follow the pipeline flush, minus their overlap
// ratios.
#include "stage.h"

#include <algorithm>
#include <cmath>

#include "hp/planner/schedule.h"
#include "hp/topology/collectives.h"

namespace hp::planner {

CostTable cost_table(const ModelProfile& m, const Config& c, const Workload& w, const Machine& mc,
                     const AxisLinks& links) {
  CostTable t;
  t.blocks.reserve(m.blocks.size());
  // Repeated blocks are usually identical: cost each distinct profile once.
  auto same = [](const BlockProfile& x, const BlockProfile& y) {
    return x.parameters == y.parameters && x.fwd_flops == y.fwd_flops &&
           x.unrouted_flops == y.unrouted_flops && x.quadratic_flops == y.quadratic_flops &&
           x.act_bytes == y.act_bytes && x.quadratic_act_bytes == y.quadratic_act_bytes &&
           x.boundary_bytes == y.boundary_bytes && x.tp_collectives == y.tp_collectives &&
           x.kernels == y.kernels && x.expert_parameters == y.expert_parameters &&
           x.experts == y.experts && x.top_k == y.top_k;
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

// The model chunk (virtual stage) of each of a rank's blocks: runs of consecutive block indices
// (rank k holds chunks k, k + pp, ..., never adjacent when pp > 1); when the runs are not v of them
// (pp = 1), the interleaved layout's even split.
std::vector<std::int64_t> chunks_of(const std::vector<std::int64_t>& blocks, std::int64_t v) {
  std::vector<std::int64_t> out(blocks.size(), 0);
  if (v <= 1) return out;
  std::int64_t runs = blocks.empty() ? 0 : 1;
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    if (blocks[i] != blocks[i - 1] + 1) ++runs;
    out[i] = runs - 1;
  }
  if (runs == v) return out;
  const auto n = static_cast<std::int64_t>(blocks.size());
  std::size_t i = 0;
  for (std::int64_t c = 0; c < v; ++c)
    for (std::int64_t j = 0; j < n / v + (c < n % v ? 1 : 0); ++j) out[i++] = c;
  return out;
}

// Whether every block of a stage has the same cost entry (the usual case: repeated layers).
bool uniform(const CostTable& t, const std::vector<std::int64_t>& blocks) {
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    const BlockCost& a = t.blocks[static_cast<std::size_t>(blocks[0])];
    const BlockCost& b = t.blocks[static_cast<std::size_t>(blocks[i])];
    if (a.act[0] != b.act[0] || a.act[1] != b.act[1] || a.act[2] != b.act[2] ||
        a.rc_selective != b.rc_selective || a.rc_full != b.rc_full)
      return false;
  }
  return true;
}

}  // namespace

double bubble_scale(const Config& c, bool train, double fwd, double all) {
  const recipe::Schedule s =
      !train && c.schedule == recipe::Schedule::zb_h1 ? recipe::Schedule::one_f_one_b : c.schedule;
  const double half = std::max(0.0, all - fwd) / 2;
  const double base =
      bubble_seconds(recipe::Schedule::one_f_one_b, c.pp, c.micro_batches, 1, fwd, half, half);
  if (!(base > 0))
    return s == recipe::Schedule::interleaved ? 1.0 / static_cast<double>(c.virtual_stages) : 1.0;
  return bubble_seconds(s, c.pp, c.micro_batches, c.virtual_stages, fwd, half, half) / base;
}

StagePlan cost_stage(const StageContext& ctx, std::int64_t stage, std::vector<std::int64_t> blocks,
                     std::vector<Recompute> recompute) {
  const Config& c = ctx.config;
  const auto& costs = ctx.costs;
  const bool first = stage == 0, last = stage == c.pp - 1;
  const bool train = ctx.work.train;
  StagePlan s;
  s.blocks = std::move(blocks);
  s.recompute = std::move(recompute);
  s.recompute.resize(s.blocks.size(), Recompute::none);
  const std::int64_t v = c.schedule == recipe::Schedule::interleaved ? c.virtual_stages : 1;
  double states = 0, infer_peak = 0, grads = 0, a2a = 0, a2a_buffer = 0, biggest = 0, workspace = 0,
         resident_grads = 0;
  std::vector<UnitActivations> units;
  units.reserve(s.blocks.size() + 2);
  auto add = [&](const BlockCost& b, const BlockProfile& p, Recompute r, std::int64_t chunk) {
    states += b.state_bytes;
    grads += b.grad_bytes;
    s.compute += b.fwd + b.bwd;
    s.forward += b.fwd;
    s.tp_comm += b.tp_comm;
    a2a += b.ep_comm;
    a2a_buffer = std::max(a2a_buffer, b.a2a_buffer);
    biggest = std::max(biggest, b.weight_bytes);
    workspace = std::max(workspace, unit_workspace(p, c));
    s.recompute_time += rc_time(b, r);
    const double rc_flops =
        r == Recompute::none ? 0.0
        : r == Recompute::selective
            ? p.quadratic_flops
            : p.fwd_flops + (c.ep > 1 && c.routed_experts ? 0.0 : p.unrouted_flops);
    s.recompute_flops +=
        static_cast<double>(c.micro_batch_size) * rc_flops / static_cast<double>(c.tp);
    // Training keeps act[level] per micro-batch in flight and rebuilds the rest during the
    // backward; inference holds one unit's activations at a time.
    const double kept = b.act[level(r)];
    if (train) {
      // The gradients are part of the model states but exist only from the unit's first
      // backward to the optimizer step: the peak places them in time with the activations.
      const double g = block_states(b, ctx.model, c, ctx.work).gradients;
      resident_grads += g;
      units.push_back({chunk, kept, b.act[0] - kept, g});
    }
    infer_peak = std::max(infer_peak, b.act_infer);
  };
  // Model order (prologue first, epilogue last): the peak's backward transients depend on it.
  if (first) add(costs.prologue, ctx.model.prologue, Recompute::none, 0);
  const auto chunk = chunks_of(s.blocks, v);
  for (std::size_t i = 0; i < s.blocks.size(); ++i) {
    const auto b = static_cast<std::size_t>(s.blocks[i]);
    add(costs.blocks[b], ctx.model.blocks[b], train ? s.recompute[i] : Recompute::none, chunk[i]);
  }
  if (last) add(costs.epilogue, ctx.model.epilogue, Recompute::none, v - 1);
  s.ep_comm = a2a;
  if (c.pp > 1) {
    const double msg = static_cast<double>(c.micro_batch_size) * ctx.model.hidden_bytes /
                       (c.sequence_parallel ? static_cast<double>(c.tp) : 1.0);
    const double sends =
        (first || last ? 1.0 : 2.0) * (train ? 2.0 : 1.0) * static_cast<double>(c.virtual_stages);
    s.pp_comm =
        sends * topology::send_recv_time(ctx.links.pp, msg) * (1.0 - ctx.machine.cal.overlap_pp);
  }
  s.states = states;
  if (train) {
    const LiveCounts& live = live_counts(c.schedule, c.pp, stage, c.micro_batches, v);
    s.dynamic = activation_peak(live, units, &s.activations);
  } else {
    s.activations = s.dynamic = infer_peak;
  }
  s.memory = states - resident_grads + s.dynamic + workspace +
             stage_buffers(ctx.model, c, ctx.work, grads, a2a_buffer, biggest);
  s.feasible = s.memory <= usable_memory(ctx.machine);
  s.time = s.compute + s.recompute_time + s.tp_comm + s.ep_comm + s.pp_comm;
  return s;
}

namespace {

// Exact recompute choice for a stage of identical blocks: for every count of fully recomputed
// blocks, the fewest selective ones that make the stage fit; the cheapest pair wins.
std::vector<Recompute> uniform_recompute(const StageContext& ctx, std::int64_t stage,
                                         const std::vector<std::int64_t>& blocks) {
  const std::size_t n = blocks.size();
  std::vector<Recompute> none(n, Recompute::none);
  const StagePlan base = cost_stage(ctx, stage, blocks, none);
  const double limit = usable_memory(ctx.machine);
  if (base.memory <= limit || n == 0) return none;
  const Config& c = ctx.config;
  const BlockCost& bc = ctx.costs.blocks[static_cast<std::size_t>(blocks[0])];
  // Only the activation peak changes with the choice (states, buffers and workspace do not), so a
  // choice is checked against the exact peak without re-costing the stage. Full blocks come
  // first, then selective ones, as the result lays them out.
  const double fixed = base.memory - base.dynamic;
  const std::int64_t v = c.schedule == recipe::Schedule::interleaved ? c.virtual_stages : 1;
  const auto chunk = chunks_of(blocks, v);
  const LiveCounts& live = live_counts(c.schedule, c.pp, stage, c.micro_batches, v);
  // The choice is changed block by block and the peak tracked incrementally (PeakTracker).
  const bool first = stage == 0, last = stage == c.pp - 1;
  std::vector<UnitActivations> units;
  auto grads = [&](const BlockCost& b) {
    return block_states(b, ctx.model, c, ctx.work).gradients;
  };
  if (first) units.push_back({0, ctx.costs.prologue.act[0], 0, grads(ctx.costs.prologue)});
  const std::size_t off = units.size();
  for (std::size_t i = 0; i < n; ++i) units.push_back({chunk[i], bc.act[0], 0, grads(bc)});
  if (last) units.push_back({v - 1, ctx.costs.epilogue.act[0], 0, grads(ctx.costs.epilogue)});
  PeakTracker tracker(live, std::move(units));
  std::vector<int> current(n, 0);
  auto fits = [&](std::size_t nf, std::size_t ns) {
    for (std::size_t i = 0; i < n; ++i) {
      const int lv = i < nf ? 2 : i < nf + ns ? 1 : 0;
      if (lv == current[i]) continue;
      current[i] = lv;
      tracker.set(off + i, bc.act[lv], bc.act[0] - bc.act[lv]);
    }
    return fixed + tracker.peak() <= limit;
  };
  // For every count of full blocks, the fewest selective ones that fit. More full blocks never
  // need more selective ones, so the count only walks down: about 2n checks in all.
  double best = -1;
  std::size_t best_full = 0, best_sel = 0, ns = n;
  for (std::size_t nf = 0; nf <= n; ++nf) {
    if (best >= 0 && static_cast<double>(nf) * bc.rc_full >= best) break;
    ns = std::min(ns, n - nf);
    if (!fits(nf, ns)) continue;
    while (ns > 0 && fits(nf, ns - 1)) --ns;
    const double t =
        static_cast<double>(nf) * bc.rc_full + static_cast<double>(ns) * bc.rc_selective;
    if (best < 0 || t < best) best = t, best_full = nf, best_sel = ns;
  }
  std::vector<Recompute> r(n, Recompute::none);
  if (best < 0) {
    std::fill(r.begin(), r.end(), Recompute::full);
    return r;
  }
  for (std::size_t i = 0; i < best_full; ++i) r[i] = Recompute::full;
  for (std::size_t i = best_full; i < best_full + best_sel; ++i) r[i] = Recompute::selective;
  return r;
}

// Greedy recompute choice for mixed blocks: best bytes saved per second added first.
std::vector<Recompute> greedy_recompute(const StageContext& ctx, std::int64_t stage,
                                        const std::vector<std::int64_t>& blocks) {
  std::vector<Recompute> r(blocks.size(), Recompute::none);
  const double limit = usable_memory(ctx.machine);
  if (cost_stage(ctx, stage, blocks, r).memory <= limit) return r;
  const double flight = in_flight(ctx.config, stage);
  std::vector<Upgrade> ups;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const BlockCost& bc = ctx.costs.blocks[static_cast<std::size_t>(blocks[i])];
    ups.push_back({i, 1, (bc.act[0] - bc.act[1]) * flight, bc.rc_selective});
    ups.push_back({i, 2, (bc.act[1] - bc.act[2]) * flight, bc.rc_full - bc.rc_selective});
  }
  std::stable_sort(ups.begin(), ups.end(), [](const Upgrade& a, const Upgrade& b) {
    return a.saves * b.costs > b.saves * a.costs;  // a.saves/a.costs > b.saves/b.costs, no division
  });
  for (const auto& u : ups) {
    if (u.saves <= 0 || level(r[u.slot]) >= u.to) continue;
    r[u.slot] = u.to == 1 ? Recompute::selective : Recompute::full;
    if (cost_stage(ctx, stage, blocks, r).memory <= limit) break;
  }
  return r;
}

}  // namespace

StagePlan evaluate_stage(const StageContext& ctx, std::int64_t stage,
                         std::vector<std::int64_t> blocks) {
  const Config& c = ctx.config;
  std::vector<Recompute> rc(blocks.size(), Recompute::none);
  if (ctx.work.train && c.forced_recompute > 0)
    std::fill(rc.begin(), rc.end(), static_cast<Recompute>(c.forced_recompute));
  else if (ctx.work.train && c.forced_recompute < 0)
    rc = uniform(ctx.costs, blocks) ? uniform_recompute(ctx, stage, blocks)
                                    : greedy_recompute(ctx, stage, blocks);
  return cost_stage(ctx, stage, std::move(blocks), std::move(rc));
}

Prediction predict(const ModelProfile& m, const Config& c, const Workload& w, const Machine& mc,
                   const AxisLinks& links, const std::vector<StagePlan>& stages) {
  Prediction p;
  const double mbs = static_cast<double>(c.micro_batches);
  const double pp = static_cast<double>(c.pp);
  double tmax = 0, tsum = 0, rc_flops = 0, fwd = 0, all = 0;
  for (const auto& s : stages) {
    tmax = std::max(tmax, s.time);
    tsum += s.time;
    fwd += s.forward;
    all += s.compute;
    p.compute += mbs * s.compute / pp;
    p.recompute += mbs * s.recompute_time / pp;
    p.tp_exposed += mbs * s.tp_comm / pp;
    p.ep_exposed += mbs * s.ep_comm / pp;
    p.pp_exposed += mbs * s.pp_comm / pp;
    rc_flops += s.recompute_flops;
    p.peak_memory = std::max(p.peak_memory, s.memory);
  }
  const double pipeline = mbs * tmax + (tsum - tmax) * bubble_scale(c, w.train, fwd, all);
  p.bubble = std::max(
      0.0, pipeline - (p.compute + p.recompute + p.tp_exposed + p.ep_exposed + p.pp_exposed));

  if (w.train) {
    // The slowest rank's gradient reduction and the biggest rank's gathers and optimizer step
    // follow the flush.
    const CostTable t = cost_table(m, c, w, mc, links);
    double weights = 0, opt_params = 0;
    for (std::size_t k = 0; k < stages.size(); ++k) {
      double dense = 0, expert = 0;
      auto add = [&](const BlockCost& b) { dense += b.dense_params, expert += b.expert_params; };
      for (auto b : stages[k].blocks) add(t.blocks[static_cast<std::size_t>(b)]);
      if (k == 0) add(t.prologue);
      if (k + 1 == stages.size()) add(t.epilogue);
      p.dp_exposed = std::max(p.dp_exposed, gradient_sync_time(c, w, mc, links, dense, expert));
      weights = std::max(weights, (dense + expert) * m.dtype_bytes);
      const auto shard = static_cast<double>(dense_shard(c)),
                 eshard = static_cast<double>(expert_shard(c));
      opt_params = std::max(opt_params, dense / shard + expert / eshard);
    }
    if (c.optimizer_shard > 0) {
      const double gathers = zero_gathers(c, mbs);
      const double hidden = c.optimizer_shard == 3 ? mc.cal.overlap_opt : 0.0;
      p.opt_exposed = gathers * topology::all_gather_time(links.shard, dense_shard(c), weights) *
                      (1.0 - hidden);
    }
    // Adam reads weights, grads, master, two moments and writes four of them: ~32 bytes/param.
    if (mc.memory_bandwidth > 0) p.optimizer_step = 32.0 * opt_params / mc.memory_bandwidth;
  }
  p.iteration = pipeline + p.dp_exposed + p.opt_exposed + p.optimizer_step;

  const double devices = static_cast<double>(c.dp * c.tp * c.pp);
  const double seqs = static_cast<double>(w.global_batch);
  p.tokens_per_second = seqs * static_cast<double>(m.seq) / p.iteration;
  p.samples_per_second = seqs / p.iteration;
  p.model_flops = (w.train ? 3.0 : 1.0) * m.total_fwd_flops() * seqs;
  p.hardware_flops = p.model_flops + rc_flops * mbs * static_cast<double>(c.tp * c.dp);
  p.tflops_model = p.model_flops / p.iteration / devices / 1e12;
  p.tflops_hardware = p.hardware_flops / p.iteration / devices / 1e12;
  p.mfu = p.tflops_model * 1e12 / mc.peak_flops;
  p.hfu = p.tflops_hardware * 1e12 / mc.peak_flops;
  return p;
}

}  // namespace hp::planner
