// The planner's analytic cost model: what one block costs (time, memory, traffic) under one
// parallel configuration, and what a pipeline stage and a whole training (or inference) step cost.
// Every quantity is in SI units: seconds, bytes, FLOPs. The formulas and their sources are in the
// essay at the top of src/cost.cpp; the calibration constants are in Calibration below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/recipe.h"
#include "hp/topology/topology.h"

namespace hp::planner {

/// One plannable unit (a block from layer discovery, or the prologue/epilogue) at micro-batch size
/// 1 and the planned sequence length, in the planned dtype.
struct BlockProfile {
  std::string name;
  double parameters = 0;  ///< parameter elements
  double fwd_flops = 0;   ///< one forward, one sequence
  double quadratic_flops =
      0;                 ///< of which in attention-score matmuls (what selective recompute redoes)
  double act_bytes = 0;  ///< activations kept for backward, one sequence, no TP split
  double quadratic_act_bytes = 0;  ///< of which seq x seq tensors (freed by selective recompute)
  double boundary_bytes = 0;       ///< the tensor crossing into the next block (one sequence)
  int tp_collectives = 0;  ///< forward all-reduces under Megatron TP (2 for attention + MLP)
  double kernels = 0;      ///< nodes producing activations (each a kernel launch in forward)
  // Mixture of experts (zero for dense blocks): routed experts are stacked weights whose leading
  // dim is the expert count; expert parallelism splits them, everything else stays replicated.
  double expert_parameters = 0;  ///< of `parameters`, in routed experts
  std::int64_t experts = 0;      ///< routed experts per MoE layer (0 = dense block)
  std::int64_t top_k = 0;        ///< experts each token is routed to
  /// Experts exported as a ModuleList (each run on every token, stacked with torch.stack): the
  /// forward FLOPs they spend on tokens the router did not send them. fwd_flops leaves them out,
  /// since under expert parallelism hp routes each token to its top-k experts only
  /// (docs/training.md); with ep = 1 the export runs as written and they count.
  double unrouted_flops = 0;
  /// Experts added into a sum by a loop that runs each on the rows routed to it (Mixtral's
  /// torch.where): the rows are decided by the data, so the graph's shapes do not give these
  /// matmuls' FLOPs; they are priced on top_k / E of the block's tokens and included in fwd_flops.
  double routed_flops = 0;
  /// The experts are added into a sum by a loop: under expert parallelism the layer runs on every
  /// member's rows, all-gathered, and its partial sums are reduce-scattered (docs/training.md,
  /// "Summed expert layers"), instead of the all-to-alls of a dispatch.
  bool summed = false;
  std::int64_t heads = 0;  ///< attention heads (from the seq x seq score tensors); 0 = none seen
};

/// The model as the planner sees it: prologue, repeated blocks, epilogue.
struct ModelProfile {
  BlockProfile prologue;
  std::vector<BlockProfile> blocks;
  BlockProfile epilogue;
  std::int64_t seq = 0;
  double dtype_bytes = 2;   ///< bytes per element of the planned dtype
  double hidden_bytes = 0;  ///< b=1 boundary activation (s x h x dtype): TP/PP message size unit
  std::int64_t heads = 0;   ///< attention heads (from the seq x seq score tensors); 0 = unknown
  bool sequence = true;     ///< the model has a sequence axis; false: seq = 1, planned per sample
  /// The batch the model was exported with when it is static (every input's axis 0 a number): the
  /// only batch it runs, split by dp and micro-batches. 0 = a symbolic batch.
  std::int64_t static_batch = 0;
  std::string batch_dim;  ///< the model's symbolic batch dim (any name); empty when static
  std::string seq_dim;    ///< the model's symbolic sequence dim (any name); empty when static/none

  double total_parameters() const;
  double total_fwd_flops() const;  ///< one forward, one sequence
};

/// The fraction of device memory no plan may use, in `hp plan` and `hp offload-profile` alike
/// (docs/planner.md, "Memory"): buffers and kernel workspace are counted explicitly, so the margin
/// is what no cost model sees (the CUDA/CANN context, NCCL/HCCL internal buffers, allocator
/// fragmentation). It is also the recipe's default [offload] margin.
inline constexpr double kTransientMargin = 0.1;
/// PyTorch DDP's default gradient bucket (bucket_cap_mb = 25): the staging buffer of the gradient
/// all-reduce (or reduce-scatter), never more than the rank's gradients.
inline constexpr double kGradBucket = 25.0 * 1024 * 1024;

/// Achievable fractions and overlap ratios. See src/cost.cpp for where each number comes from.
struct Calibration {
  /// Achieved / peak FLOP/s of dense kernels as a function of the per-device GEMM width
  /// n = hidden / tp: compute_efficiency * n / (n + efficiency_half_width). 0 half-width =
  /// constant.
  double compute_efficiency = 0.6;
  double efficiency_half_width = 0;
  /// The widest n of the fitting data: wider GEMMs get the efficiency at this width (the curve is
  /// not extrapolated past what it was fitted on). 0 = no cap.
  double efficiency_max_width = 0;
  double kernel_overhead = 4e-6;  ///< seconds per kernel launch and tail, per micro-batch and pass
  double overlap_tp = 0.0;        ///< share of TP collectives hidden under compute
  double overlap_dp = 0.5;        ///< share of the DP gradient reduction hidden under backward
  double overlap_opt = 0.5;       ///< share of optimizer-shard gathers hidden (ZeRO-3 prefetch)
  double overlap_pp = 0.0;        ///< share of pipeline send/recv hidden
  double overlap_ep = 0.0;  ///< share of expert all-to-alls hidden (dispatch waits on routing)
  double transient_margin = kTransientMargin;  ///< fraction of device memory kept free
};

/// The calibration hp uses for a device kind (gpu / npu / cpu).
Calibration calibration_for(recipe::DeviceKind kind);
/// The compute efficiency at per-device GEMM width `width` (elements).
double efficiency(const Calibration& c, double width);

/// How the parallel axes are laid onto ranks: order[0] is the innermost (stride 1) axis.
enum class Axis { tp, dp, pp };
const char* axis_name(Axis a);

/// A level-1 configuration: degrees, micro-batching, schedule and axis placement.
struct Config {
  std::int64_t dp = 1, tp = 1, pp = 1;
  int optimizer_shard = 0;  ///< ZeRO level 0..3; levels 1..3 shard over the whole DP group
  std::int64_t micro_batch_size = 1, micro_batches = 1;
  recipe::Schedule schedule = recipe::Schedule::one_f_one_b;
  std::int64_t virtual_stages = 1;
  bool sequence_parallel = false;
  std::int64_t ep = 1;  ///< expert-parallel degree: carved out of dp, splits routed experts
  /// With ep > 1, a ModuleList's experts run on their routed tokens only (the recipe's
  /// expert_dispatch = "routed"); false: on all of the group's tokens
  /// (BlockProfile::unrouted_flops).
  bool routed_experts = true;
  /// ZeRO-3 (the recipe's zero3_gather = "per-step"): each bucket gathered once per step and kept
  /// whole until the backward is done, instead of for every use of every micro-batch.
  bool zero3_per_step = false;
  /// HSDP: ZeRO shards over the innermost shard_group ranks of each DP group (a faster tier) and
  /// replicates across the dp / shard_group such groups; 0 = shard over the whole DP group.
  std::int64_t shard_group = 0;
  Axis order[3] = {Axis::tp, Axis::dp, Axis::pp};
  int forced_recompute = -1;  ///< 0..2 forces none/selective/full on every block (--fix recompute)
};

/// What the planner is asked to plan.
struct Workload {
  std::int64_t global_batch = 1;  ///< sequences per step
  bool train = true;
  double optimizer_state_bytes = 12;  ///< per parameter: fp32 master + Adam moments (K in ZeRO)
  double grad_bytes = 2;              ///< per parameter
};

/// The machine: device figures and the links each parallel axis gets under a placement.
struct Machine {
  double peak_flops = 0;  ///< dense, planned dtype
  /// Measured GEMM rate of the planned dtype (the cluster's sustained_flops), 0 when not measured:
  /// where set, matrix products are priced at it, flat, instead of peak x eff(width).
  double sustained_flops = 0;
  double memory = 0;  ///< bytes per device
  double memory_bandwidth = 0;
  Calibration cal;
};
/// The memory a plan may use: the device's minus the transient margin kept free.
double usable_memory(const Machine& mc);
/// The device of `topo` as the cost model sees it: its peak and measured rate for `dtype` (the fp32
/// ones, with a line in `warnings`, when the cluster file gives no peak for the dtype), memory,
/// bandwidth and calibration. A device with no peak at all is Errc::bad_input located at
/// `cluster_name`.
Expected<Machine> machine_for(const topology::Topology& topo, const std::string& dtype,
                              const std::string& cluster_name, std::vector<std::string>& warnings);

/// Links of the TP, DP and PP groups of a configuration (from topology::group_link).
struct AxisLinks {
  topology::Link tp, dp, pp;
  topology::Link ep;       ///< the innermost ep ranks of a DP group (expert all-to-all)
  topology::Link edp;      ///< the DP ranks holding the same experts (dp/ep of them)
  topology::Link shard;    ///< the ranks ZeRO shards over (the DP group, or the HSDP group)
  topology::Link replica;  ///< HSDP: the dp/shard_group ranks holding the same shard
};
/// Ranks the optimizer states of replicated (dense) parameters are split over: 1 without ZeRO, the
/// HSDP group when set, else the whole DP group.
std::int64_t dense_shard(const Config& c);
/// The same for routed experts, whose copies live on the dp/ep ranks holding the same experts.
std::int64_t expert_shard(const Config& c);
Expected<AxisLinks> axis_links(const topology::Topology& topo, const Config& c);

/// Per-block costs for one micro-batch under a configuration (one device's share).
struct BlockCost {
  double fwd = 0, bwd = 0;               ///< compute seconds
  double rc_selective = 0, rc_full = 0;  ///< extra forward seconds when recomputed
  double tp_comm = 0;                    ///< exposed TP (or SP) collective seconds, fwd + bwd
  double ep_comm = 0;                    ///< exposed expert all-to-all seconds, fwd + bwd
  double act[3] = {0, 0, 0};             ///< bytes kept per micro-batch for none / selective / full
  double act_infer = 0;     ///< bytes alive while the block runs one micro-batch forward
  double a2a_buffer = 0;    ///< dispatch + combine buffers of the expert all-to-all
  double state_bytes = 0;   ///< parameters + gradients + optimizer states on one device
  double weight_bytes = 0;  ///< parameters alone on one device (planned dtype)
  double grad_bytes = 0;    ///< gradients on one device (training)
  double dense_params = 0, expert_params = 0;  ///< parameter elements on one device, by kind
};
BlockCost block_cost(const BlockProfile& b, const ModelProfile& m, const Config& c,
                     const Workload& w, const Machine& mc, const AxisLinks& links);

/// Bytes of model states per parameter on one device under a ZeRO level and shard degree.
double state_bytes_per_param(const Workload& w, double dtype_bytes, int zero_level,
                             std::int64_t shard);

/// Exposed seconds of the gradient reduction after the flush for a rank holding `dense` replicated
/// and `expert` expert-parallel parameter elements (all-reduce, or reduce-scatter under ZeRO).
double gradient_sync_time(const Config& c, const Workload& w, const Machine& mc,
                          const AxisLinks& links, double dense, double expert);

/// Micro-batches per model chunk whose activations stage k (0-based) keeps alive at its busiest
/// moment (schedule.h live_counts: the most chunk activations alive after a forward, over the
/// chunks): 1F1B p-k, GPipe m, interleaved about p on every stage (Megatron's warm-up runs
/// 2(p-k-1) + (v-1)p chunk forwards). The stage memory itself prices each chunk's own count; this
/// average ranks recomputation candidates.
double in_flight(const Config& c, std::int64_t stage);

/// Model states of one block on one device, by kind (the ZeRO split of BlockCost::state_bytes).
struct StateBytes {
  double parameters = 0, gradients = 0, optimizer = 0;
  double total() const { return parameters + gradients + optimizer; }
};
StateBytes block_states(const BlockCost& b, const ModelProfile& m, const Config& c,
                        const Workload& w);

/// Communication buffers of a pipeline rank holding `grads` bytes of gradients: a send and a
/// receive buffer for the pipeline's activations (and, training, their gradients), one TP
/// collective buffer, a DP gradient bucket, the largest expert all-to-all `a2a`, and under ZeRO-3
/// the gathered block `biggest_weights` plus its prefetched successor.
double stage_buffers(const ModelProfile& m, const Config& c, const Workload& w, double grads,
                     double a2a, double biggest_weights);
/// ZeRO's parameter all-gathers of a stage per step: level 3 gathers for the forward and the
/// backward use of each of `mbs` micro-batches (once per step with Config::zero3_per_step),
/// levels 1-2 once after the update.
inline double zero_gathers(const Config& c, double mbs) {
  return c.optimizer_shard == 3 && !c.zero3_per_step ? 2.0 * mbs : 1.0;
}
/// Kernel workspace while a unit runs: the largest transient of one op, four boundary tensors of
/// one micro-batch (TP split). A rank holds the largest of its units'.
double unit_workspace(const BlockProfile& b, const Config& c);

/// A pipeline rank's share after level 2: its blocks (indices into ModelProfile::blocks;
/// contiguous, or v contiguous chunks when interleaved) and the recompute choice per block.
struct StagePlan {
  std::vector<std::int64_t> blocks;
  std::vector<recipe::Recompute> recompute;  ///< parallel to blocks
  bool feasible = true;                      ///< memory <= usable_memory (margin kept free)
  double recompute_flops = 0;                ///< extra forward FLOPs per micro-batch on one device
  double time = 0;  ///< per micro-batch: fwd + bwd + recompute + TP + p2p seconds
  double compute = 0, recompute_time = 0, tp_comm = 0, ep_comm = 0, pp_comm = 0;
  double forward = 0;      ///< the forward part of `compute` (ZB-H1's bubble scales with it)
  double memory = 0;       ///< peak bytes: states + activations (peak) + buffers + workspace
  double states = 0;       ///< model states, gradients included
  double activations = 0;  ///< the activation peak alone (the report's figure)
  /// The peak of activations and gradients together (the gradients exist from each unit's first
  /// backward; schedule.h activation_peak): memory counts this instead of the states' gradients.
  double dynamic = 0;
};

/// The predicted step of a full plan.
struct Prediction {
  double iteration = 0;  ///< seconds per step
  double compute = 0, recompute = 0, bubble = 0;
  double tp_exposed = 0, ep_exposed = 0, pp_exposed = 0, dp_exposed = 0, opt_exposed = 0,
         optimizer_step = 0;
  double tokens_per_second = 0;
  double samples_per_second = 0;                 ///< sequences (or images, rows) per second
  double model_flops = 0;                        ///< per step, no recomputation (MFU convention)
  double hardware_flops = 0;                     ///< per step, with recomputation (HFU)
  double tflops_model = 0, tflops_hardware = 0;  ///< per device
  double mfu = 0, hfu = 0;
  double peak_memory = 0;  ///< max over stages
};

/// Combines stage plans into the step time (the Metis form generalised to interleaving;
/// src/stage.cpp).
Prediction predict(const ModelProfile& m, const Config& c, const Workload& w, const Machine& mc,
                   const AxisLinks& links, const std::vector<StagePlan>& stages);

}  // namespace hp::planner
