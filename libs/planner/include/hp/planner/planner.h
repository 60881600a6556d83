// `hp plan`: the two-level H2O planner (docs/planner.md). run() loads the model's shapes, profiles
// its blocks, searches level 1 (degrees, micro-batching, schedule, placement of the axes onto
// topology tiers) pruned by lower bounds, runs level 2 (stage assignment and per-block
// recomputation) on the survivors, and returns the ranked plans. Rendering and recipe writing are
// separate so tests can check each; run_command is the whole command. Pricing one given
// configuration without a search is planner::predict (hp/planner/predict.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/summary.h"
#include "hp/planner/cost.h"
#include "hp/planner/options.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/recipe.h"
#include "hp/topology/topology.h"

namespace hp::planner {

/// One ranked plan: a level-1 configuration with its level-2 stages and prediction.
struct Plan {
  Config config;
  std::vector<StagePlan> stages;  ///< one per pipeline rank
  Prediction predicted;
  AxisLinks links;  ///< the tier each axis's groups talk over under the placement
};

/// Counters of one search.
struct SearchStats {
  double seconds = 0;
  std::int64_t evaluated = 0;      ///< level-1 configurations bounded
  std::int64_t pruned_memory = 0;  ///< dropped by the model-state memory lower bound
  std::int64_t pruned_time = 0;    ///< dropped by the time lower bound against the k-th best
  std::int64_t level2 = 0;         ///< configurations that ran level 2
  std::int64_t level2_infeasible = 0;
  std::int64_t duplicates = 0;  ///< plans dropped as equivalent to a ranked one
};

/// The smallest memory any candidate needed when nothing fits.
struct Shortfall {
  double need = 0;  ///< bytes per device at the best candidate
  double states = 0, activations = 0;
  Config config;
};

/// What --fix KEY=VALUE pins; unset fields are searched.
struct Fixed {
  std::optional<std::int64_t> dp, tp, pp, ep, micro_batch_size, micro_batches, virtual_stages;
  std::optional<std::int64_t> shard_group;  ///< ranks ZeRO shards over (dp = no HSDP)
  std::optional<int> optimizer_shard;
  std::optional<recipe::Schedule> schedule;
  std::optional<bool> sequence_parallel;
  std::optional<recipe::Recompute> recompute;
  /// Whether `c` agrees with every pinned value (recompute is applied, not matched).
  bool admits(const Config& c) const;
};

/// Parses --fix arguments: keys dp, tp, pp, ep, shard_group (HSDP), optimizer_shard (0..3 or
/// none|optimizer|gradients|parameters, the recipe's scale), micro_batch_size, micro_batches,
/// schedule (gpipe|1f1b|interleaved|zb-h1; zbv is refused, not modelled), virtual_stages,
/// sequence_parallel (true|false), recompute (none|selective|full). Aliases: data / data_parallel
/// (dp), tensor / tensor_parallel (tp), pipeline / pipeline_parallel (pp), expert / expert_parallel
/// (ep), zero / zero_stage (optimizer_shard), mbs, sp, hsdp (shard_group); '-' reads as '_'.
/// Unknown keys, malformed values and a key given twice (under any of its names) with different
/// values are Errc::usage.
Expected<Fixed> parse_fixes(const std::vector<std::string>& args);

/// Checks pinned values against the cluster and the model before searching: the degrees' product
/// against the rank count, pp against the blocks, tp against the attention heads, ep against the
/// experts and dp, micro_batch_size against the global batch. Each mismatch is Errc::bad_input
/// naming both sides.
Status check_fixes(const Fixed& f, std::int64_t ranks, const ModelProfile& m,
                   std::int64_t global_batch);

struct SearchLimits {
  std::int64_t top_k = 3;
  Fixed fixed;
  /// Megatron TP splits whole attention heads, so tp must divide the head count. Operator-level
  /// sharding (the D-Rec baseline) may split any dimension and clears this.
  bool whole_heads = true;
  /// Keep the best plan of each of the fastest structures beside the top k (same_structure), to
  /// report different structures first and explain the best against one. The baselines of
  /// --compare want the best plan alone and clear this.
  bool alternatives = true;
};

/// Everything the search needs besides the model.
struct SearchInput {
  const ModelProfile& model;
  const topology::Topology& topo;
  Workload work;
  Machine machine;
  SearchLimits limits;
};

/// "dp2 tp2 pp1 mbs2x1 sp": a configuration in one short line (warnings, why-lines).
std::string short_config(const Config& c);

/// A plan's structure: dp, tp, pp, ep, the ZeRO level and the schedule. Virtual stages, the
/// micro-batching, sequence parallelism, the HSDP group, placement, stage assignment and
/// recomputation refine one structure; `hp plan --top-k` lists different structures first.
bool same_structure(const Config& a, const Config& b);

/// The most structures whose best plans search() keeps beside the top k (at least 2, so the why
/// line can name a different structure; at most top_k and this many).
inline constexpr std::size_t kMaxAlternatives = 5;

struct SearchResult {
  /// At most top_k rows: the best plan; then the best plan of each other structure among the
  /// fastest min(top_k, kMaxAlternatives) structures, fastest first; then the remaining fastest
  /// plans (refinements). Empty when nothing fits.
  std::vector<Plan> plans;
  /// With SearchLimits::alternatives: the best plan of a structure other than the best's (absent
  /// when no such plan fits), and the second-fastest plan of any structure (absent when only the
  /// best fits). Both are exact, whatever top_k is.
  std::optional<Plan> rival, runner_up;
  SearchStats stats;
  Shortfall shortfall;  ///< meaningful when plans is empty
};

/// Level 1 + level 2 over every configuration of in.topo.ranks() devices.
SearchResult search(const SearchInput& in);

/// Level 2 alone for one configuration (stage assignment + recomputation); empty when it cannot
/// fit.
std::vector<StagePlan> assign_stages(const ModelProfile& m, const Config& c, const Workload& w,
                                     const Machine& mc, const AxisLinks& links);

/// One pipeline rank holding `blocks` with the given recompute choice per block: the cost level 2
/// minimises over (public so tests can enumerate every assignment and recompute set against it).
StagePlan stage_plan(const ModelProfile& m, const Config& c, const Workload& w, const Machine& mc,
                     const AxisLinks& links, std::int64_t stage, std::vector<std::int64_t> blocks,
                     std::vector<recipe::Recompute> recompute);

/// The profile of a summarised model (bound at batch 1 and the planned seq) in the planned dtype.
Expected<ModelProfile> profile_model(const model::ModelSummary& s, std::int64_t seq,
                                     double dtype_bytes);

/// A baseline planner's best plan for the same problem (--compare).
struct Baseline {
  std::string name;  ///< "dp-tp-only" | "greedy-expert"
  std::string description;
  std::optional<Plan> plan;    ///< empty when nothing in its space fits
  std::int64_t evaluated = 0;  ///< configurations it looked at
  double speedup = 0;          ///< its iteration time / the best plan's - 1 (0.2 = 20% faster)
};

/// The two baselines of the H2O paper, each searched under the same cost model:
///  dp-tp-only: DP x TP degrees and the micro-batch size only (no pipeline, no optimizer sharding,
///    no recomputation, no SP) - the D-Rec-style planner H2O compares against; its operator-level
///    sharding may split any dimension, so tp need not divide the heads, and expert dims may be
///    split;
///  greedy-expert: one axis at a time (tp, pp, ZeRO level, micro-batch size, one recompute policy
///    for every block), each set to its best value with the others held, until nothing changes -
///    how an expert tunes by hand. It starts from tp = pp = 1, ZeRO-3, micro-batch 1, full
///    recompute.
std::vector<Baseline> run_baselines(const SearchInput& in, const Plan& best);

/// What `hp plan` reports.
struct PlanReport {
  std::string model;        ///< path as given
  std::string cluster;      ///< cluster name
  std::string cluster_ref;  ///< as given on the command line (preset name or file)
  std::int64_t nodes = 1, ranks = 1;
  std::string device;
  double device_memory = 0;
  double usable_memory = 0;  ///< what a plan may use: device memory less the transient margin
  std::int64_t global_batch = 0, seq = 0;
  bool sequence = true;  ///< false: the model has no sequence axis (seq 1; samples/s, not tokens/s)
  /// Where the global batch and sequence length came from when the command line did not give them
  /// ("default: one per rank", "the model's static batch", "the model's static length"); empty =
  /// given.
  std::string batch_note, seq_note;
  /// The recipe's [model] dims: --dim bindings, then the model's own batch dim (whatever its name)
  /// at the global batch and its sequence dim at the planned length.
  std::map<std::string, std::int64_t> dims;
  std::string dtype, mode, optimizer;
  std::string command;  ///< the command line that asked for the plan (PlanOptions::command)
  std::vector<std::string> outputs;  ///< the model's graph outputs, in order
  bool train_table = false;          ///< plan_to_recipe writes [train] (PlanOptions::train_table)
  double parameters = 0;
  std::int64_t blocks = 0;
  std::vector<Plan> plans;  ///< top-k, best first (never empty in a returned report)
  SearchStats stats;
  std::string why;  ///< why the best plan wins
  std::vector<std::string> warnings;
  std::vector<Baseline> baselines;  ///< with --compare
};

/// Plans opts.model on `cluster` (already scaled to its node count). No feasible plan is
/// Errc::infeasible naming the smallest memory any candidate needed and what dominated it.
Expected<PlanReport> run(const PlanOptions& opts, const recipe::Cluster& cluster);

/// The FLOPs convention, as printed with every report.
const char* flops_convention();

/// A readable table of the top-k plans with breakdowns and the reason the best wins.
std::string format_plan_text(const PlanReport& r);
/// One JSON object: best.parallel, best.predicted, best.stages, candidates, search, ...
std::string format_plan_json(const PlanReport& r);

/// One --sweep axis: "nodes", "global-batch" or "seq", and its values in the order given.
struct SweepAxis {
  std::string key;
  std::vector<std::int64_t> values;
};

/// Parses --sweep AXIS=V1,V2,... arguments, one axis each (global_batch is read as global-batch).
/// An unknown axis, an empty list or value, a value that is not a positive integer, a value given
/// twice and an axis swept twice are Errc::usage.
Expected<std::vector<SweepAxis>> parse_sweeps(const std::vector<std::string>& specs);

/// What a sweep prints, and which of its points no plan fits.
struct SweepResult {
  std::string text;  ///< CSV with a header, or JSON lines
  std::int64_t points = 0;
  std::vector<std::string> infeasible;  ///< the infeasible points, "nodes=1 seq=2048"
};

/// Runs the planner once per point of the cartesian product of opts.sweep's axes (the first axis
/// outermost, values in the order given; nodes scales `cluster`, global-batch and seq set the
/// workload) and renders one CSV row per point after a header, or one JSON object per line with
/// opts.json. Identical inputs give identical bytes: search_seconds appears only with opts.timing.
/// A point where nothing fits is a row with status "infeasible" and the reason in `error`; any
/// other error stops the sweep, naming the point. A malformed spec is Errc::usage.
Expected<SweepResult> run_sweep(const PlanOptions& opts, const recipe::Cluster& cluster);

/// The best plan's pipeline schedule as an SVG picture: one row per pipeline rank over one
/// iteration, forward, backward, recomputation and send/recv boxes from the cost model; the gaps
/// are bubbles. Interleaved plans are drawn as 1F1B over m * v micro-batch chunks of 1/v the work.
std::string schedule_svg(const PlanReport& r);

/// The best plan as a complete recipe whose model and cluster paths are relative to `recipe_path`.
/// With r.train_table it has a [train] table of defaults: the loss on the model's first output,
/// SGD when the plan was priced for SGD and AdamW otherwise.
recipe::Recipe plan_to_recipe(const PlanReport& r, const std::filesystem::path& recipe_path,
                              std::size_t plan = 0);

/// What `hp plan --summary` reports: the model's summary and the cluster it would be planned on.
struct SummaryReport {
  model::ModelSummary model;
  std::optional<recipe::Cluster> cluster;  ///< when --cluster was given
};
/// The model summary's table, after a "cluster" line when there is one.
std::string format_summary_text(const SummaryReport& r);
/// The model summary's JSON object with a "cluster" entry (name, nodes, ranks, rank_device) when
/// there is one.
std::string format_summary_json(const SummaryReport& r);

/// What `hp plan` prints and writes, rendered as the options asked.
struct PlanOutput {
  std::string model;  ///< the model summarised or planned (the bundled one when none was named)
  std::vector<std::string> warnings;  ///< about that model, to report before `text`
  std::string text;  ///< for standard output: the plan table or JSON, the sweep rows or the
                     ///< summary (empty when -o takes the summary)
  struct File {
    std::filesystem::path path;
    std::string contents;
  };
  std::vector<File> files;  ///< to write after printing, in order (--schedule-svg, then -o)
  /// Reported after printing and writing: the command's outcome when it has output worth keeping
  /// yet fails (a sweep with infeasible points, Errc::infeasible, unless opts.allow_infeasible).
  std::optional<Error> failure;
};

/// `hp plan` in one call. Resolves the options (--dim bindings, --cluster scaled to --nodes, the
/// bundled model from opts.model_dirs when opts.model is empty), then with opts.summary summarises
/// the model; else plans on the cluster (local-cpu when none is named), once per value with
/// opts.sweep (run_sweep) or once (run), rendered as text or JSON, with the schedule SVG and the
/// best plan's recipe as files. Errors come in the order the options are resolved: --dim, the
/// cluster
/// (--nodes without --cluster is Errc::usage), the bundled model, then the summary's, the sweep's
/// (--sweep with -o, --schedule-svg or --compare is Errc::usage) or the plan's.
Expected<PlanOutput> run_command(const PlanOptions& opts);

}  // namespace hp::planner
