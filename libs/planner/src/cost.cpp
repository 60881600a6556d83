// The analytic cost model, per block and per configuration.
//
// Compute. A block's forward costs its ONNX FLOPs (2 per multiply-accumulate, counted by libs/model
// at micro-batch 1 and the planned sequence) times the micro-batch size, divided by the TP degree,
// at `compute_efficiency` x peak FLOP/s of the planned dtype. Backward is 2x forward (one GEMM for
// the input gradient, one for the weight gradient), so training is 3x forward. Recomputation adds a
// forward: all of it for "full", only the attention-score part (the matmuls touching seq x seq
// tensors, plus their softmax) for "selective" (Korthikanti et al. 2022).
//
// Every kernel also pays a fixed launch-and-tail cost (kernel_overhead, 4 us on accelerators, the
// order of a CUDA/ACL launch plus a partial wave; 1 us on CPUs) per forward and twice per backward.
// This is what makes small micro-batches slower than large ones at equal FLOPs.
//
// Calibration. There is no profiler behind these numbers. GEMM efficiency grows with the matrix
// width each device multiplies, n = hidden / tp, so the achievable fraction of peak is the
// saturating curve 0.8 * n / (n + 444) for GPUs and NPUs. Its two constants were FITTED by hand to
// the four A100 iteration times of Korthikanti et al. 2022 (22B/175B/530B/1T with SP + selective
// recompute: n = 768..3200 gives 0.51..0.70), so the validation test on
// those same points is a consistency check, not independent evidence. Widths beyond the widest
// fitted point (n = 3200, the 1T model at tp 8) keep its 0.70: extrapolating the curve made 175B
// prefer tp 2 (n = 6144 would get 0.75) on no evidence. NPUs reuse the GPU curve untested (Ascend
// 910 end-to-end MFU reports are lower, 30-50%); CPUs use a flat 0.5. Small models (n of a few
// dozen) get a few percent: realistic for launch-bound kernels on accelerators.
//
// Communication (alpha-beta over topology::group_link of the group each axis forms under the chosen
// placement). TP (Megatron): each transformer block does 2 all-reduces of b*s*h in forward and 2 in
// backward; with sequence parallelism each becomes a reduce-scatter + all-gather of the same
// volume, so the time is the same and the gain is in activation memory. Overlap ratios are per
// pattern (Calibration): TP collectives sit on the critical path (0), DP gradient reduction
// overlaps half of the last backward (0.5, bucketed DDP), ZeRO-3 parameter gathers are prefetched
// (0.5), p2p is exposed.
//
// Memory per device. Model states per parameter follow the ZeRO paper (Rajbhandari et al. 2020):
// weights w (dtype), gradients g, optimizer states K (12 for mixed-precision Adam: fp32 master +
// two moments), with ZeRO-1 sharding K, ZeRO-2 g+K, ZeRO-3 everything over the DP group.
// Activations are the block's stored tensors (an upper bound from the ONNX graph: unfused kernels
// keep more than fused ones); under TP, 10/34 of the non-attention part stays replicated unless
// sequence parallelism splits it (Korthikanti Table 2); full recompute keeps only the block input.
#include "hp/planner/cost.h"

#include <algorithm>

#include "hp/planner/schedule.h"
#include "hp/topology/collectives.h"

namespace hp::planner {

double ModelProfile::total_parameters() const {
  double p = prologue.parameters + epilogue.parameters;
  for (const auto& b : blocks) p += b.parameters;
  return p;
}

double ModelProfile::total_fwd_flops() const {
  double f = prologue.fwd_flops + epilogue.fwd_flops;
  for (const auto& b : blocks) f += b.fwd_flops;
  return f;
}

Calibration calibration_for(recipe::DeviceKind kind) {
  Calibration c;
  if (kind == recipe::DeviceKind::cpu) {
    c.compute_efficiency = 0.5;
  } else {
    c.compute_efficiency = 0.8;
    c.efficiency_half_width = 444;
    c.efficiency_max_width = 3200;
  }
  c.kernel_overhead = kind == recipe::DeviceKind::cpu ? 1e-6 : 4e-6;
  return c;
}

double efficiency(const Calibration& c, double width) {
  if (c.efficiency_half_width <= 0) return c.compute_efficiency;
  if (c.efficiency_max_width > 0) width = std::min(width, c.efficiency_max_width);
  return c.compute_efficiency * width / (width + c.efficiency_half_width);
}

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::tp: return "tp";
    case Axis::dp: return "dp";
    case Axis::pp: return "pp";
  }
  return "?";
}

namespace {

std::int64_t degree(const Config& c, Axis a) {
  return a == Axis::tp ? c.tp : a == Axis::dp ? c.dp : c.pp;
}

// The first group of axis `a`: ranks 0, stride, 2*stride, ... where stride is the product of the
// degrees of the axes placed inside it.
std::int64_t axis_stride(const Config& c, Axis a) {
  std::int64_t stride = 1;
  for (Axis x : c.order) {
    if (x == a) break;
    stride *= degree(c, x);
  }
  return stride;
}

// `count` ranks `step` apart from rank 0 (one group of an axis, or of part of the DP axis).
Expected<topology::Link> group_link(const topology::Topology& topo, std::int64_t count,
                                    std::int64_t step) {
  std::vector<std::int64_t> ranks;
  for (std::int64_t i = 0; i < count; ++i) ranks.push_back(i * step);
  return topo.group_link(ranks);
}

Expected<topology::Link> first_group_link(const topology::Topology& topo, const Config& c, Axis a) {
  return group_link(topo, degree(c, a), axis_stride(c, a));
}

}  // namespace

Expected<AxisLinks> axis_links(const topology::Topology& topo, const Config& c) {
  AxisLinks links;
  HP_ASSIGN_OR_RETURN(links.tp, first_group_link(topo, c, Axis::tp));
  HP_ASSIGN_OR_RETURN(links.dp, first_group_link(topo, c, Axis::dp));
  HP_ASSIGN_OR_RETURN(links.pp, first_group_link(topo, c, Axis::pp));
  // Expert parallelism takes the innermost ep ranks of each DP group (Megatron's EP inside DP), so
  // the all-to-all stays on the fastest tier the DP axis reaches; the expert-DP group strides over
  // them.
  const std::int64_t ep = std::max<std::int64_t>(1, c.ep), sdp = axis_stride(c, Axis::dp);
  HP_ASSIGN_OR_RETURN(links.ep, group_link(topo, ep, sdp));
  HP_ASSIGN_OR_RETURN(links.edp, group_link(topo, std::max<std::int64_t>(1, c.dp / ep), ep * sdp));
  // HSDP shards over the innermost shard_group ranks of the DP group; the shard's replicas stride
  // over them.
  const std::int64_t o = c.shard_group > 0 && c.shard_group < c.dp ? c.shard_group : c.dp;
  HP_ASSIGN_OR_RETURN(links.shard, group_link(topo, o, sdp));
  HP_ASSIGN_OR_RETURN(links.replica, group_link(topo, c.dp / o, o * sdp));
  return links;
}

std::int64_t dense_shard(const Config& c) {
  if (c.optimizer_shard == 0) return 1;
  return c.shard_group > 0 && c.shard_group < c.dp ? c.shard_group : c.dp;
}

std::int64_t expert_shard(const Config& c) {
  if (c.optimizer_shard == 0) return 1;
  const std::int64_t ep = std::max<std::int64_t>(1, c.ep), o = dense_shard(c);
  if (o == c.dp) return std::max<std::int64_t>(1, c.dp / ep);
  return o % ep == 0 ? o / ep : 1;  // the HSDP group holds o/ep copies of each expert
}

double usable_memory(const Machine& mc) { return mc.memory * (1.0 - mc.cal.transient_margin); }

double gradient_sync_time(const Config& c, const Workload& w, const Machine& mc,
                          const AxisLinks& links, double dense, double expert) {
  if (!w.train) return 0;
  const std::int64_t ep = std::max<std::int64_t>(1, c.ep),
                     edp = std::max<std::int64_t>(1, c.dp / ep);
  // ZeRO reduce-scatters into the shard group; under HSDP the shards are then all-reduced across
  // their replicas (the slower tier), 1/o of the bytes each.
  auto sync = [&](const topology::Link& l, std::int64_t n, std::int64_t shard, double params) {
    const double bytes = params * w.grad_bytes;
    if (c.optimizer_shard == 0) return topology::all_reduce_time(l, n, bytes);
    if (shard >= n) return topology::reduce_scatter_time(l, n, bytes);
    const auto o = std::max<std::int64_t>(1, shard);
    return topology::reduce_scatter_time(links.shard, o, bytes) +
           topology::all_reduce_time(links.replica, n / o, bytes / static_cast<double>(o));
  };
  double t = sync(links.dp, c.dp, dense_shard(c), dense);
  if (expert > 0) t += sync(links.edp, edp, expert_shard(c), expert);
  return t * (1.0 - mc.cal.overlap_dp);
}

// The ZeRO level the memory model counts: per-step ZeRO-3 holds its parameters whole through the
// step, as level 2 does (its kept buckets take the place of the gather buffers).
static int memory_level(const Config& c) {
  return c.optimizer_shard == 3 && c.zero3_per_step ? 2 : c.optimizer_shard;
}

double state_bytes_per_param(const Workload& w, double dtype_bytes, int zero_level,
                             std::int64_t shard) {
  if (!w.train) return dtype_bytes;
  const double o = static_cast<double>(std::max<std::int64_t>(1, shard));
  const double wb = dtype_bytes, g = w.grad_bytes, k = w.optimizer_state_bytes;
  switch (zero_level) {
    case 1: return wb + g + k / o;
    case 2: return wb + (g + k) / o;
    case 3: return (wb + g + k) / o;
    default: return wb + g + k;
  }
}

double in_flight(const Config& c, std::int64_t stage) {
  const LiveCounts& live = live_counts(c.schedule, c.pp, stage, c.micro_batches, c.virtual_stages);
  double most = 0;
  for (const auto& n : live.after_forward) {
    double total = 0;
    for (auto x : n) total += static_cast<double>(x);
    most = std::max(most, total);
  }
  return most / static_cast<double>(live.chunks);
}

StateBytes block_states(const BlockCost& b, const ModelProfile& m, const Config& c,
                        const Workload& w) {
  StateBytes s;
  auto add = [&](double params, std::int64_t shard) {
    const double o = static_cast<double>(std::max<std::int64_t>(1, shard));
    const int z = w.train ? memory_level(c) : 0;
    s.parameters += params * m.dtype_bytes / (z >= 3 ? o : 1.0);
    if (!w.train) return;
    s.gradients += params * w.grad_bytes / (z >= 2 ? o : 1.0);
    s.optimizer += params * w.optimizer_state_bytes / (z >= 1 ? o : 1.0);
  };
  add(b.dense_params, dense_shard(c));
  add(b.expert_params, expert_shard(c));
  return s;
}

double stage_buffers(const ModelProfile& m, const Config& c, const Workload& w, double grads,
                     double a2a, double biggest_weights) {
  const double mbs = static_cast<double>(c.micro_batch_size);
  const double t = static_cast<double>(c.tp);
  double bytes = 0;
  if (c.pp > 1)
    bytes += 2.0 * mbs * m.hidden_bytes / (c.sequence_parallel ? t : 1.0) * (w.train ? 2.0 : 1.0);
  if (c.tp > 1) bytes += mbs * m.hidden_bytes;
  if (w.train && c.dp > 1) bytes += std::min(kGradBucket, grads);
  bytes += a2a;
  if (c.optimizer_shard == 3 && !c.zero3_per_step) bytes += 2.0 * biggest_weights;
  return bytes;
}

double unit_workspace(const BlockProfile& b, const Config& c) {
  return 4.0 * static_cast<double>(c.micro_batch_size) * b.boundary_bytes /
         static_cast<double>(c.tp);
}

BlockCost block_cost(const BlockProfile& b, const ModelProfile& m, const Config& c,
                     const Workload& w, const Machine& mc, const AxisLinks& links) {
  BlockCost r;
  const double mb = static_cast<double>(c.micro_batch_size);
  const double t = static_cast<double>(c.tp);
  const double width =
      m.hidden_bytes / (static_cast<double>(std::max<std::int64_t>(1, m.seq)) * m.dtype_bytes) / t;
  const double rate = mc.sustained_flops > 0
                          ? mc.sustained_flops
                          : mc.peak_flops * efficiency(mc.cal, std::max(1.0, width));
  // A ModuleList's experts run on every token unless expert parallelism routes them (cost.h).
  const double flops = b.fwd_flops + (c.ep > 1 && c.routed_experts ? 0.0 : b.unrouted_flops);
  r.fwd = mb * flops / t / rate + b.kernels * mc.cal.kernel_overhead;
  // Activations a rank holds: TP splits all but the replicated share (LayerNorms, dropout and
  // residual adds without sequence parallelism).
  const double replicated = c.sequence_parallel || c.tp == 1 ? 0.0 : 10.0 / 34.0;
  r.act_infer = mb * b.act_bytes * (replicated + (1.0 - replicated) / t);
  // A measured rate is the GEMMs' own (hp devices --measure), with nothing of the memory-bound
  // work between them in it, as a table peak times its calibrated efficiency has: there every
  // activation byte is written once and read once more, which a memcpy bandwidth (a byte read
  // and written) prices at bytes / bandwidth. The backward's twice the forward covers its reads
  // of the activations and its gradients' writes (docs/planner.md, "Calibration").
  if (mc.sustained_flops > 0 && mc.memory_bandwidth > 0) r.fwd += r.act_infer / mc.memory_bandwidth;
  r.bwd = w.train ? 2.0 * r.fwd : 0.0;
  r.rc_selective = mb * b.quadratic_flops / t / rate;
  r.rc_full = r.fwd;
  r.rc_selective += r.rc_selective > 0 ? 0.1 * b.kernels * mc.cal.kernel_overhead : 0.0;
  if (c.tp > 1 && b.tp_collectives > 0) {
    // SP's reduce-scatter + all-gather moves what one ring all-reduce moves: same alpha-beta time.
    const double msg = mb * m.hidden_bytes;
    const double one = topology::all_reduce_time(links.tp, c.tp, msg);
    const double fwd_comm = b.tp_collectives * one * (1.0 - mc.cal.overlap_tp);
    r.tp_comm = w.train ? 2.0 * fwd_comm : fwd_comm;
    r.rc_full += fwd_comm;  // a full recompute repeats the forward collectives
  }
  const double quad = mb * b.quadratic_act_bytes / t;
  const double lin_total = mb * (b.act_bytes - b.quadratic_act_bytes);
  const double lin = lin_total * (replicated + (1.0 - replicated) / t);
  if (w.train) {
    r.act[0] = lin + quad;
    r.act[1] = lin;
    r.act[2] = mb * b.boundary_bytes / (c.sequence_parallel ? t : 1.0);
  }
  // Routed experts are split over ep (and TP inside each expert, ETP = TP); their optimizer states
  // shard over the dp/ep ranks that hold the same experts. The rest is Megatron-TP split.
  const std::int64_t ep = b.experts > 0 ? std::max<std::int64_t>(1, c.ep) : 1;
  r.dense_params = (b.parameters - b.expert_parameters) / t;
  r.expert_params = b.expert_parameters / t / static_cast<double>(ep);
  const std::int64_t dshard = dense_shard(c), eshard = expert_shard(c);
  r.state_bytes =
      r.dense_params * state_bytes_per_param(w, m.dtype_bytes, memory_level(c), dshard) +
      r.expert_params * state_bytes_per_param(w, m.dtype_bytes, memory_level(c), eshard);
  r.weight_bytes = (r.dense_params + r.expert_params) * m.dtype_bytes;
  r.grad_bytes = w.train ? (r.dense_params + r.expert_params) * w.grad_bytes : 0.0;
  if (b.experts > 0 && ep > 1) {
    // Dispatch and combine: each rank sends its tokens' top_k copies of the hidden state (split
    // over TP under SP), a 1/ep share to every peer; backward mirrors both.
    const double msg = static_cast<double>(std::max<std::int64_t>(1, b.top_k)) * mb *
                       m.hidden_bytes / (c.sequence_parallel ? t : 1.0);
    double one = topology::all_to_all_time(links.ep, ep, msg) * (1.0 - mc.cal.overlap_ep);
    r.a2a_buffer = 2.0 * msg;
    if (b.summed) {  // every member's rows gathered, the partial sums reduce-scattered back
      const double rows = static_cast<double>(ep) * mb * m.hidden_bytes;
      one = (topology::all_gather_time(links.ep, ep, rows) +
             topology::reduce_scatter_time(links.ep, ep, rows)) /
            2.0 * (1.0 - mc.cal.overlap_ep);
      r.a2a_buffer = 2.0 * rows;
    }
    r.ep_comm = (w.train ? 4.0 : 2.0) * one;
    r.rc_full += 2.0 * one;  // a full recompute repeats the forward dispatch and combine
  }
  return r;
}

}  // namespace hp::planner
