// hp offload-profile: memory timelines, host-pool offload and prefetch schedules (docs/offload.md).
//
// run() reads a recipe with a plan ([parallel] and, for pp > 1, [[stages]]), builds every pipeline
// rank's units from the planner's cost model (libs/planner block_cost: the same bytes and seconds
// `hp plan` predicts with), simulates each rank's memory over one step (timeline.h), and, when the
// budget is below the peak, plans what goes to the host pool and when it moves (policy.h). With
// --mode infer it also finds the longest context and largest batch that fit with and without KV
// offload (capacity.h). --measure replaces the bandwidth table by the backend plugin's probes
// (measure.h). Rendering (text, JSON, SVG) is in render.h; -o writes the [offload] section back.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/offload/capacity.h"
#include "hp/offload/measure.h"
#include "hp/offload/policy.h"
#include "hp/offload/timeline.h"
#include "hp/recipe/recipe.h"

namespace hp::offload {

struct OffloadOptions {
  std::filesystem::path recipe;
  std::string hbm;       ///< device-memory budget ("64GiB"); empty: device memory x (1 - margin)
  bool measure = false;  ///< run the backend's bandwidth probes
  bool json = false;
  // mode, dtype and optimizer: empty = the recipe's [workload], else train / bf16 / adam.
  std::string mode;                  ///< train | infer
  std::vector<std::string> targets;  ///< state kinds that may move; empty: every kind the mode has
  std::string dtype;                 ///< a name or alias parse_dtype knows (hp/core/dtype.h)
  std::string optimizer;             ///< adam | adamw | sgd | none (parse_optimizer)
  std::int64_t lookahead = -2;       ///< slots ahead a fetch is issued; -1 auto; -2: the recipe's
  double optimizer_ratio = -1;       ///< host share of the optimizer step; -1 = choose
  std::int64_t heads = 0, kv_heads = 0;  ///< attention heads and KV heads (GQA); 0 = multi-head
  std::string latency_budget;            ///< --mode infer: decode latency per token, e.g. "50ms"
  std::string svg;                       ///< write the memory-over-time plot here
  std::string output;                    ///< write the recipe with its [offload] section here
  std::vector<std::filesystem::path> preset_dirs;  ///< where cluster presets are looked up
};

/// One pipeline rank's result.
struct StageReport {
  StageInput input;
  Timeline timeline;                      ///< without offload
  std::optional<StageSchedule> schedule;  ///< with offload, when the budget needed it
  double peak_before() const { return timeline.peak_bytes(); }
  double peak_after() const { return schedule ? schedule->peak_bytes : timeline.peak_bytes(); }
};

struct OffloadReport {
  std::string recipe, cluster, device, mode, dtype, optimizer;
  std::int64_t dp = 1, tp = 1, pp = 1, zero = 0, micro_batches = 1, micro_batch_size = 1, seq = 0;
  std::string schedule;
  double device_memory = 0, budget = 0;
  std::string budget_source;  ///< "--hbm" or "device memory x (1 - margin)"
  double margin = 0.1;
  recipe::SourcedValue h2d, d2h, host_memory;
  double host_bandwidth = 0;
  std::vector<Target> targets;
  std::int64_t lookahead = -1;
  std::vector<StageReport> stages;
  bool offloaded = false;  ///< some stage needed a schedule
  double step_before = 0;  ///< predicted step (planner cost model), no offload
  double exposed = 0;      ///< max over stages of the exposed transfer time
  double step_after = 0;   ///< step_before + exposed
  std::optional<BandwidthReport> measured;
  std::optional<CapacityReport> capacity;
  std::vector<std::string> notes;
  recipe::Recipe written;  ///< the recipe with the chosen [offload] section
};

/// The whole command: simulate, plan, and write --svg / -o files (atomically).
Expected<OffloadReport> run(const OffloadOptions& options);

std::string format_text(const OffloadReport& r);
std::string format_json(const OffloadReport& r);
/// Memory over time per stage: before and after offload, the budget line and the transfers.
std::string format_svg(const OffloadReport& r);

/// The recipe with an [offload] section for the report's choice (targets, bandwidths with their
/// provenance, host memory, margin, lookahead).
recipe::Recipe with_offload_section(const recipe::Recipe& in, const OffloadReport& r);

}  // namespace hp::offload
