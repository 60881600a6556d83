// hp::planner::run, the table of contents of `hp plan`:
//   1. load the model once and profile its blocks at batch 1 and the planned sequence, in the
//   planned
//      dtype (load_profile, profile.cpp; shapes, FLOPs and layers come from libs/model);
//   2. describe the machine: topology, device peak for the dtype, calibration (machine_for below);
//   3. search level 1 + level 2 (search.cpp);
//   4. explain the winner, or say why nothing fits;
//   5. with --compare, search the two baselines' restricted spaces under the same cost model.
// The workload and machine helpers here are shared with planner::predict (predict.cpp), so a plan
// and a prediction of the same configuration are priced alike.
#include "hp/planner/planner.h"

#include <algorithm>
#include <cmath>

#include <fmt/core.h>

#include "hp/core/dtype.h"
#include "hp/core/optimizer.h"
#include "hp/core/units.h"
#include "hp/model/plan_options.h"
#include "hp/planner/predict.h"
#include "pricing.h"

namespace hp::planner {
namespace {

// Element and optimizer-state bytes come from the core tables (hp/core/dtype.h, optimizer.h), so
// the planner and offload-profile price alike. A name the tables do not know (hp plan's CLI lets
// none through) prices as before: 2 bytes, and no optimizer state for an unknown optimizer.
DType dtype_or_bf16(const std::string& dtype) {
  const auto t = parse_dtype(dtype);
  return t ? *t : DType::bf16;
}

double dtype_size(const std::string& dtype) { return hp::dtype_size(dtype_or_bf16(dtype)); }

double optimizer_bytes(const std::string& optimizer, const std::string& dtype) {
  const auto o = parse_optimizer(optimizer);
  return o ? optimizer_state_bytes(*o, dtype_or_bf16(dtype)) : 0;
}

// The breakdown component in which two plans differ most, as "name a vs b".
std::string biggest_difference(const Prediction& a, const Prediction& b) {
  const std::pair<const char*, double> parts[] = {
      {"compute", b.compute - a.compute},
      {"recompute", b.recompute - a.recompute},
      {"bubble", b.bubble - a.bubble},
      {"tp comm", b.tp_exposed - a.tp_exposed},
      {"ep comm", b.ep_exposed - a.ep_exposed},
      {"pp comm", b.pp_exposed - a.pp_exposed},
      {"dp comm", b.dp_exposed - a.dp_exposed},
      {"optimizer-shard comm", b.opt_exposed - a.opt_exposed},
      {"optimizer step", b.optimizer_step - a.optimizer_step}};
  const auto* best = &parts[0];
  for (const auto& p : parts)
    if (p.second > best->second) best = &p;
  return best->first;
}

// What tells two plans of one structure apart (same_structure): the refinements that differ, as
// "virtual stages and placement".
std::string refinement_difference(const Plan& a, const Plan& b) {
  const Config &x = a.config, &y = b.config;
  std::vector<const char*> parts;
  if (x.virtual_stages != y.virtual_stages) parts.push_back("virtual stages");
  if (x.micro_batch_size != y.micro_batch_size) parts.push_back("micro-batch size");
  if (x.sequence_parallel != y.sequence_parallel) parts.push_back("sequence parallelism");
  if (x.shard_group != y.shard_group) parts.push_back("ZeRO group");
  if (!std::equal(x.order, x.order + 3, y.order)) parts.push_back("placement");
  auto recompute = [](const Plan& p) {
    std::vector<recipe::Recompute> r;
    for (const auto& s : p.stages) r.insert(r.end(), s.recompute.begin(), s.recompute.end());
    return r;
  };
  auto blocks = [](const Plan& p) {
    std::vector<std::vector<std::int64_t>> r;
    for (const auto& s : p.stages) r.push_back(s.blocks);
    return r;
  };
  if (blocks(a) != blocks(b)) parts.push_back("stage assignment");
  if (recompute(a) != recompute(b)) parts.push_back("recomputation");
  if (parts.empty()) return "stage assignment";
  std::string out = parts[0];
  for (std::size_t i = 1; i < parts.size(); ++i)
    out += fmt::format("{}{}", i + 1 == parts.size() ? " and " : ", ", parts[i]);
  return out;
}

// The why line: the best against the best plan of a different structure, which says more than the
// runner-up (usually the same degrees with another refinement). Without a rival, the runner-up is
// a refinement of the best; without either, the best is the only plan that fits (the search keeps
// two plans and evaluates every candidate until it has them, so that claim is exact).
std::string explain(const SearchResult& found) {
  const Plan& b = found.plans.front();
  std::string why =
      fmt::format("{} reaches {:.1f}% MFU", short_config(b.config), 100 * b.predicted.mfu);
  if (found.rival) {
    const Plan& r = *found.rival;
    const double gain = r.predicted.iteration / b.predicted.iteration - 1;
    return why + fmt::format("; {:.2f}% faster than {} (it spends less on {})", 100 * gain,
                             short_config(r.config), biggest_difference(b.predicted, r.predicted));
  }
  if (!found.runner_up) return why + "; it is the only plan that fits";
  const Plan& r = *found.runner_up;
  return why + fmt::format(
                   "; no plan of another structure fits; the next, {} ({:.2f}% slower), differs "
                   "in {}",
                   short_config(r.config),
                   100 * (r.predicted.iteration / b.predicted.iteration - 1),
                   refinement_difference(b, r));
}

Error infeasible(const Shortfall& s, double memory, double usable) {
  const char* what = s.states >= s.activations ? "model states" : "activations";
  return Error(
      Errc::infeasible,
      fmt::format(
          "no plan fits: the smallest need is {} per device against {} usable of {} (states {}, "
          "activations {}; {} dominate) at {}",
          format_bytes(s.need), format_bytes(usable), format_bytes(memory), format_bytes(s.states),
          format_bytes(s.activations), what, short_config(s.config)),
      "",
      "use more nodes, a smaller global batch or sequence, or a cluster with more memory per "
      "device");
}

}  // namespace

std::string short_config(const Config& c) {
  std::string s = fmt::format("dp{} tp{} pp{}", c.dp, c.tp, c.pp);
  if (c.optimizer_shard > 0)
    s += fmt::format(" optimizer_shard={}", recipe::optimizer_shard_name(c.optimizer_shard));
  if (dense_shard(c) > 1 && dense_shard(c) < c.dp) s += fmt::format(" hsdp{}", dense_shard(c));
  s += fmt::format(" mbs{}x{}", c.micro_batch_size, c.micro_batches);
  if (c.pp > 1) s += fmt::format(" {}", recipe::schedule_name(c.schedule));
  if (c.virtual_stages > 1) s += fmt::format(" v{}", c.virtual_stages);
  if (c.sequence_parallel) s += " sp";
  if (c.ep > 1) s += fmt::format(" ep{}", c.ep);
  return s;
}

double dtype_bytes(const std::string& dtype) { return dtype_size(dtype); }

Workload workload_for(bool train, const std::string& dtype, const std::string& optimizer,
                      std::int64_t global_batch) {
  Workload w;
  w.train = train;
  w.global_batch = global_batch;
  w.grad_bytes = dtype_size(dtype);
  w.optimizer_state_bytes = optimizer_bytes(optimizer, dtype);
  return w;
}

Expected<Machine> machine_for(const topology::Topology& topo, const std::string& dtype,
                              const std::string& cluster_name, std::vector<std::string>& warnings) {
  Machine mc;
  const auto& dev = topo.device();
  mc.peak_flops = dev.peak_flops.of(dtype);
  mc.sustained_flops = dev.sustained_flops.of(dtype);
  if (mc.peak_flops <= 0 && dev.peak_flops.fp32 > 0) {
    warnings.push_back(
        fmt::format("{} has no {} peak in the cluster file; planning compute at its fp32 peak",
                    dev.name, dtype));
    mc.peak_flops = dev.peak_flops.fp32;
    mc.sustained_flops = dev.sustained_flops.fp32;
  }
  if (mc.peak_flops <= 0)
    return Error(Errc::bad_input,
                 fmt::format("device '{}' has no peak FLOP/s for {}", dev.name, dtype),
                 cluster_name, "set peak_flops in the cluster file");
  if (mc.sustained_flops <= 0 && dev.sustained_flops != recipe::PeakFlops{})
    warnings.push_back(fmt::format(
        "{} has a measured rate (sustained_flops) but not for {}; planning {} at peak x "
        "efficiency",
        dev.name, dtype, dtype));
  mc.memory = dev.memory;
  mc.memory_bandwidth = dev.memory_bandwidth;
  mc.cal = calibration_for(dev.kind);
  return mc;
}

const char* flops_convention() {
  return "model FLOPs = 3 x forward FLOPs of the ONNX graph (2 per multiply-accumulate, attention "
         "as "
         "exported; backward = 2 x forward), no recomputation (MFU); hardware FLOPs add recomputed "
         "forwards (HFU)";
}

// --global-batch, or one sequence per rank. A static-batch export runs exactly its own batch (dp
// and micro-batches split it), so that is the only global batch it can be planned for.
Expected<std::int64_t> planned_global_batch(const PlanOptions& opts, const ModelProfile& profile,
                                            std::int64_t ranks) {
  const std::int64_t b = profile.static_batch;
  if (b > 0 && opts.global_batch > 0 && opts.global_batch != b)
    return Error(Errc::usage,
                 fmt::format("the model's batch is static ({} on every input); --global-batch {} "
                             "cannot run it",
                             b, opts.global_batch),
                 opts.model,
                 fmt::format("pass --global-batch {}, or export the model with a dynamic batch "
                             "axis",
                             b));
  return opts.global_batch > 0 ? opts.global_batch : b > 0 ? b : ranks;
}

Expected<PlanReport> run(const PlanOptions& opts, const recipe::Cluster& cluster) {
  HP_ASSIGN_OR_RETURN(auto dims, model::parse_dim_bindings(opts.dim_args));
  HP_ASSIGN_OR_RETURN(LoadedProfile loaded,
                      load_profile({opts.model, dims, opts.seq, opts.dtype, opts.require_data}));
  const ModelProfile& profile = loaded.profile;
  HP_ASSIGN_OR_RETURN(auto topo, topology::Topology::from_cluster(cluster));
  PlanReport rep;
  rep.warnings = std::move(loaded.warnings);
  HP_ASSIGN_OR_RETURN(const Machine mc, machine_for(topo, opts.dtype, cluster.name, rep.warnings));
  HP_ASSIGN_OR_RETURN(const std::int64_t global_batch,
                      planned_global_batch(opts, profile, topo.ranks()));
  const Workload w = workload_for(opts.mode != "infer", opts.dtype, opts.optimizer, global_batch);

  HP_ASSIGN_OR_RETURN(const Fixed fixed, parse_fixes(opts.fix_args));
  if (auto st = check_fixes(fixed, topo.ranks(), profile, w.global_batch); !st) {
    Error e = std::move(st).error();
    e.what.where = opts.model;
    return e;
  }
  SearchResult found = search({profile, topo, w, mc, {opts.top_k, fixed}});
  if (found.stats.evaluated == 0)
    return Error(
        Errc::bad_input,
        fmt::format(
            "no configuration matches --fix: it needs dp*tp*pp = {} ranks, pp <= {} blocks, dp "
            "dividing the global batch {}, micro_batch_size*micro_batches = {}/dp, and for "
            "interleaving micro_batches a multiple of pp and pp*virtual_stages <= {} blocks",
            topo.ranks(), profile.blocks.size(), w.global_batch, w.global_batch,
            profile.blocks.size()),
        opts.model, "relax or correct the --fix values");
  if (found.plans.empty()) return infeasible(found.shortfall, mc.memory, usable_memory(mc));

  rep.model = opts.model;
  rep.cluster = cluster.name;
  rep.cluster_ref = opts.cluster;
  rep.nodes = cluster.nodes;
  rep.ranks = topo.ranks();
  rep.device = topo.device().name;
  rep.device_memory = mc.memory;
  rep.usable_memory = usable_memory(mc);
  rep.global_batch = w.global_batch;
  rep.seq = profile.seq;
  rep.sequence = profile.sequence;
  if (opts.global_batch <= 0)
    rep.batch_note =
        profile.static_batch > 0 ? "the model's static batch" : "default: one per rank";
  if (profile.sequence && opts.seq <= 0 && profile.seq_dim.empty())
    rep.seq_note = "the model's static length";
  rep.dims = {dims.begin(), dims.end()};
  if (!profile.batch_dim.empty()) rep.dims[profile.batch_dim] = w.global_batch;
  if (!profile.seq_dim.empty()) rep.dims[profile.seq_dim] = profile.seq;
  rep.dtype = opts.dtype;
  rep.mode = w.train ? "train" : "infer";
  rep.optimizer = opts.optimizer;
  rep.command = opts.command;
  for (int o : loaded.summary.graph.outputs)
    rep.outputs.push_back(loaded.summary.graph.tensor(o).name);
  rep.train_table = opts.train_table && w.train;
  rep.parameters = profile.total_parameters();
  rep.blocks = static_cast<std::int64_t>(profile.blocks.size());
  rep.stats = found.stats;
  rep.why = explain(found);
  rep.plans = std::move(found.plans);
  if (opts.compare)
    rep.baselines = run_baselines({profile, topo, w, mc, {1, {}}}, rep.plans.front());
  return rep;
}

}  // namespace hp::planner
