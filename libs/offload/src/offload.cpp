// hp::offload::run, the table of contents of `hp offload-profile`:
//   1. check the options (budget, mode, state kinds, latency) before reading anything;
//   2. read the recipe and insist on a plan; resolve its cluster and model;
//   3. profile the model with the planner and cost every unit of every pipeline rank
//   (stage_input.cpp);
//   4. simulate each rank's step, and plan offload where the budget needs it (timeline, policy);
//   5. predict the step time with the planner's cost model, plus the exposed transfer time;
//   6. inference capacity, measured bandwidths, and the files asked for (--svg, -o).
#include "hp/offload/offload.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include <fmt/core.h>

#include "hp/core/fs.h"
#include "hp/core/units.h"
#include "hp/offload/stage_input.h"
#include "hp/planner/cost.h"
#include "hp/recipe/presets.h"
#include "hp/recipe/verify.h"

namespace hp::offload {
namespace {

namespace fs = std::filesystem;

struct Checked {
  std::optional<double> hbm;
  DType dtype = DType::bf16;
  Optimizer optimizer = Optimizer::adam;
  std::vector<Target> targets;
  double latency = 0;
  bool train = true;
};

Expected<Checked> check_options(const OffloadOptions& o) {
  Checked c;
  if (o.mode != "train" && o.mode != "infer")
    return Error(Errc::usage, fmt::format("--mode must be train or infer, got '{}'", o.mode));
  c.train = o.mode == "train";
  HP_ASSIGN_OR_RETURN(c.dtype, parse_dtype(o.dtype));
  HP_ASSIGN_OR_RETURN(c.optimizer, parse_optimizer(o.optimizer));
  if (!o.hbm.empty()) {
    auto b = parse_bytes(o.hbm);
    if (!b || !(*b > 0))
      return Error(Errc::usage, fmt::format("malformed --hbm '{}'", o.hbm), "",
                   "give a size such as 64GiB, 80GB or 17179869184");
    c.hbm = *b;
  }
  if (!o.latency_budget.empty()) {
    if (c.train) return Error(Errc::usage, "--latency-budget needs --mode infer");
    auto s = parse_seconds(o.latency_budget);  // hp/core/units.h: the rule recipes use too
    if (!s)
      return Error(Errc::usage, fmt::format("malformed --latency-budget '{}'", o.latency_budget),
                   "", "give a time such as 50ms, 0.1s, 800us or 500ns");
    if (!(*s > 0))
      return Error(Errc::usage, fmt::format("--latency-budget must be greater than 0, got '{}'",
                                            o.latency_budget));
    c.latency = *s;
  }
  if (o.optimizer_ratio != -1 && !(o.optimizer_ratio >= 0 && o.optimizer_ratio <= 1))
    return Error(Errc::usage,
                 fmt::format("--optimizer-ratio must be in [0, 1], got {}", o.optimizer_ratio));
  if ((o.heads > 0) != (o.kv_heads > 0) || (o.heads > 0 && o.kv_heads > o.heads))
    return Error(Errc::usage, "--heads and --kv-heads go together, with kv-heads <= heads");
  HP_ASSIGN_OR_RETURN(c.targets, parse_targets(o.targets));
  return c;
}

// The recipe, refusing one without a plan with its own message (the parser would only say that a
// required table is missing).
Expected<recipe::Recipe> load_planned_recipe(const fs::path& path) {
  HP_ASSIGN_OR_RETURN(auto doc, recipe::read_recipe(path));
  if (doc.syntax_ok && !doc.where.contains("parallel"))
    return Error(Errc::bad_input, "the recipe has no plan: [parallel] is missing",
                 path.string() + ":1",
                 "make one with 'hp plan MODEL -o recipe.toml', or add [parallel] and [[stages]]");
  HP_ASSIGN_OR_RETURN(auto r, recipe::load_recipe(path));
  if (r.parallel.pp > 1 && r.stages.empty())
    return Error(
        Errc::bad_input,
        fmt::format("the recipe has no plan for its {} pipeline stages: [[stages]] is missing",
                    r.parallel.pp),
        doc.where.at("parallel.pp"),
        "run 'hp plan MODEL -o recipe.toml' to assign layers to stages");
  return r;
}

const recipe::DeviceType* host_device(const recipe::Cluster& c) {
  for (const auto& d : c.device_types)
    if (d.kind == recipe::DeviceKind::cpu) return &d;
  return nullptr;
}

recipe::SourcedValue pick(const std::optional<recipe::Offload>& off,
                          recipe::SourcedValue recipe::Offload::*field, double table) {
  if (off && ((*off).*field).value > 0) return (*off).*field;
  return {table, table > 0 ? "table" : "unknown"};
}

const char* backend_for(recipe::DeviceKind k) {
  switch (k) {
    case recipe::DeviceKind::gpu: return "cuda";
    case recipe::DeviceKind::npu: return "ascend";
    case recipe::DeviceKind::cpu: return "cpu";
  }
  return "cpu";
}

}  // namespace

// Flags first, then what the recipe's [workload] says the plan was made for, then the defaults: a
// recipe planned for fp32 training with SGD is profiled as that unless a flag says otherwise.
OffloadOptions resolve_workload(OffloadOptions o, const recipe::Recipe& rec) {
  const recipe::Workload w = rec.workload.value_or(recipe::Workload{});
  if (o.mode.empty()) o.mode = w.mode;
  if (o.dtype.empty()) o.dtype = w.dtype;
  if (o.optimizer.empty()) o.optimizer = w.optimizer;
  return o;
}

Expected<OffloadReport> run(const OffloadOptions& given) {
  HP_ASSIGN_OR_RETURN(auto rec, load_planned_recipe(given.recipe));
  HP_TRY(recipe::check_recipe_before_use(given.recipe, given.preset_dirs));
  const OffloadOptions options = resolve_workload(given, rec);
  HP_ASSIGN_OR_RETURN(auto checked, check_options(options));
  const fs::path dir =
      options.recipe.parent_path().empty() ? fs::path(".") : options.recipe.parent_path();
  HP_ASSIGN_OR_RETURN(auto cluster, recipe::cluster_for(rec, dir, options.preset_dirs));

  StageBuildOptions sb;
  sb.model = (dir / rec.model).lexically_normal();
  sb.train = checked.train;
  sb.dtype = checked.dtype;
  sb.optimizer = checked.optimizer;
  sb.heads = options.heads;
  sb.kv_heads = options.kv_heads;
  HP_ASSIGN_OR_RETURN(auto built, build_stages(rec, cluster, sb));

  OffloadReport r;
  r.recipe = options.recipe.string();
  r.cluster = cluster.name;
  r.device = built.device.name;
  r.mode = options.mode;
  r.dtype = options.dtype;
  r.optimizer = options.optimizer;
  const auto& p = rec.parallel;
  r.dp = p.dp, r.tp = p.tp, r.pp = p.pp, r.zero = p.optimizer_shard;
  r.micro_batches = p.micro_batches, r.micro_batch_size = p.micro_batch_size, r.seq = built.seq;
  r.schedule = recipe::schedule_name(p.schedule);
  r.device_memory = built.device.memory;
  // One margin for hp plan and offload-profile (planner cost.h kTransientMargin, docs/planner.md,
  // "Memory"); a recipe's [offload] margin overrides it.
  r.margin = rec.offload ? rec.offload->margin : planner::kTransientMargin;
  if (checked.hbm) {
    r.budget = *checked.hbm;
    r.budget_source = "--hbm";
  } else {
    r.budget = built.device.memory * (1 - r.margin);
    r.budget_source = fmt::format("device memory x (1 - margin {})", r.margin);
  }
  const recipe::DeviceType* host = host_device(cluster);
  const bool cpu_rank = built.device.kind == recipe::DeviceKind::cpu;
  r.h2d = pick(rec.offload, &recipe::Offload::h2d_bandwidth, built.device.h2d_bandwidth);
  r.d2h = pick(rec.offload, &recipe::Offload::d2h_bandwidth, built.device.d2h_bandwidth);
  r.host_memory =
      pick(rec.offload, &recipe::Offload::host_memory,
           host && !cpu_rank ? host->memory / static_cast<double>(cluster.ranks_per_node()) : 0.0);
  r.host_bandwidth = cpu_rank ? built.device.memory_bandwidth : host ? host->memory_bandwidth : 0.0;
  if (r.host_bandwidth <= 0) {
    r.host_bandwidth = 100e9;
    r.notes.push_back(
        "the cluster file has no host CPU: the host optimizer step assumes 100 GB/s of host memory "
        "bandwidth");
  }
  if (options.measure) {
    MeasureOptions mo;
    mo.backend = backend_for(built.device.kind);
    HP_ASSIGN_OR_RETURN(auto m, measure_bandwidth(mo));
    r.h2d = {m.h2d, m.source()};
    r.d2h = {m.d2h, m.source()};
    r.measured = std::move(m);
  }
  if (r.h2d.value <= 0 || r.d2h.value <= 0)
    return Error(Errc::bad_input,
                 fmt::format("no host-link bandwidth for device '{}'", built.device.name),
                 cluster.name,
                 "set h2d_bandwidth/d2h_bandwidth in the cluster or [offload], or pass --measure");
  // State kinds: --offload, else the recipe's [offload] targets, else every kind the mode has.
  r.targets = checked.targets;
  if (r.targets.empty() && rec.offload && !rec.offload->targets.empty()) {
    auto t = parse_targets(rec.offload->targets);
    if (!t) return Error(Errc::bad_input, t.error().message(), r.recipe, t.error().what.hint);
    r.targets = *t;
  }
  if (r.targets.empty())
    r.targets = checked.train ? std::vector<Target>{Target::optimizer, Target::gradients,
                                                    Target::activations, Target::parameters}
                              : std::vector<Target>{Target::kv_cache, Target::parameters};
  r.lookahead = options.lookahead >= -1 ? options.lookahead
                : rec.offload           ? rec.offload->prefetch_lookahead
                                        : -1;

  PolicyOptions po;
  po.budget = r.budget;
  po.targets = r.targets;
  po.lookahead = r.lookahead;
  po.h2d = r.h2d.value;
  po.d2h = r.d2h.value;
  po.host_bandwidth = r.host_bandwidth;
  po.optimizer_ratio = options.optimizer_ratio;
  for (auto& in : built.stages) {
    StageReport s;
    s.timeline = simulate(in);
    s.input = std::move(in);
    if (s.timeline.peak_bytes() > r.budget) {
      auto sched = plan_offload(s.input, s.timeline, po);
      if (!sched) {
        Error e = std::move(sched).error();
        return Error(e.code, e.message(), r.recipe, e.what.hint);
      }
      s.schedule = std::move(*sched);
      r.offloaded = true;
      r.exposed = std::max(r.exposed, s.schedule->exposed);
      if (s.schedule->host_peak > r.host_memory.value && r.host_memory.value > 0)
        r.notes.push_back(fmt::format(
            "stage {} needs {} of host memory, more than the {} available", s.input.stage,
            format_bytes(s.schedule->host_peak), format_bytes(r.host_memory.value)));
    }
    r.stages.push_back(std::move(s));
  }
  r.step_before = built.predicted_step;
  r.step_after = r.step_before + r.exposed;
  if (!r.offloaded)
    r.notes.push_back(
        "every stage fits the budget without offload; offload would only add transfers");

  if (!checked.train) {
    CapacityInput ci = built.capacity;
    ci.budget = r.budget;
    ci.host_memory = r.host_memory.value > 0 ? r.host_memory.value : built.device.memory;
    ci.memory_bandwidth = built.device.memory_bandwidth;
    ci.h2d = r.h2d.value;
    ci.latency_budget = checked.latency;
    r.capacity = capacity(ci);
  }
  r.written = with_offload_section(rec, r);
  if (!options.svg.empty()) HP_TRY(write_file_atomic(options.svg, format_svg(r)));
  if (!options.output.empty()) HP_TRY(recipe::write_recipe(r.written, options.output));
  return r;
}

recipe::Recipe with_offload_section(const recipe::Recipe& in, const OffloadReport& r) {
  recipe::Recipe out = in;
  recipe::Offload o = in.offload.value_or(recipe::Offload{});
  o.enabled = r.offloaded;
  o.targets.clear();
  for (auto t : r.targets) o.targets.push_back(target_name(t));
  o.h2d_bandwidth = r.h2d;
  o.d2h_bandwidth = r.d2h;
  o.host_memory = r.host_memory;
  o.margin = r.margin;
  // Auto lookahead writes the furthest any prefetch was issued, so launch replays the same
  // schedule.
  std::int64_t used = r.lookahead;
  if (used < 0) {
    used = 1;
    for (const auto& s : r.stages)
      if (s.schedule) used = std::max(used, s.schedule->max_lookahead);
  }
  o.prefetch_lookahead = std::max<std::int64_t>(1, used);
  // The budget the schedule was planned for: `hp launch` keeps every rank under it (and the cpu
  // backend enforces it), so the run exercises the schedule this report shows.
  o.device_budget = r.budget;
  out.offload = o;
  return out;
}

}  // namespace hp::offload
