// The recipe: the one artifact users read, edit, diff and commit (docs/architecture.md, "The
// flow"). It is versioned, fully explicit and round-trips: parse_recipe(format_recipe(r)) == r.
// Every key is documented, with type, default and meaning, in recipe_keys() (schema_doc.h), the
// source of hp-recipe(5). The shape:
//
//   [recipe]            version = 1, name, model (ONNX path relative to the recipe),
//                       cluster (preset name or cluster file relative to the recipe), nodes = 1
//   [model]             dims = { batch = 8, seq = 2048 }          symbolic input dims
//   [parallel]          dp, tp, pp (required); optimizer_shard =
//   none|optimizer|gradients|parameters
//                       (or 0..3); micro_batch_size; micro_batches; schedule =
//                       gpipe|1f1b|interleaved|zb-h1|zbv; virtual_stages; sequence_parallel;
//                       expert_parallel
//   [[stages]]          index, layers = "0-11" (or [0, 1, ...]), recompute = none|selective|full,
//                       recompute_layers = { full = "4-5" } (per-layer overrides), ranks = "0-7"
//   [layouts."<tensor or glob>"]
//                       device_matrix = [2, 4], alias_name = ["dp", "mp"],
//                       tensor_map = ["None", "mp"] (an entry may be ["dp", "mp"]), rank_list =
//                       [...]
//   [[groups]]          name, ranks = "0-5" (consecutive, after the previous group), module,
//   backend,
//                       inputs = [...], outputs = [...], env = { KEY = "value" }
//   [offload]           enabled, targets = [...], h2d_bandwidth + h2d_bandwidth_source,
//                       d2h_bandwidth + d2h_bandwidth_source, host_memory + host_memory_source,
//                       margin, prefetch_lookahead, device_budget
//   [workload]          mode, dtype, optimizer, global_batch, seq, command (what hp plan planned)
//   [train]             loss, logits, labels, optimizer, lr, betas, eps, weight_decay, momentum,
//                       clip_norm, lr_schedule, warmup_steps, min_lr, steps, seed, frozen
//
// Sources are "table", "user", "unknown" or "measured:<probe> <date>". Sizes and bandwidths may be
// numbers (bytes, bytes/s) or strings with units ("64 GiB", "25 GB/s"). Unknown keys are errors.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hp/core/error.h"
#include "hp/core/expected.h"
#include "hp/recipe/source_map.h"

namespace hp::recipe {

/// The newest recipe version this hp reads and writes.
inline constexpr int kRecipeVersion = 1;

/// zb_h1 and zbv are the zero-bubble schedules (docs/schedules.md, "Split backward"); zbv always
/// runs 2 model chunks per rank, so its recipes carry virtual_stages = 2 (read as 2 when absent).
enum class Schedule { gpipe, one_f_one_b, interleaved, zb_h1, zbv };
enum class Recompute { none, selective, full };
const char* schedule_name(Schedule s);    ///< "gpipe", "1f1b", "interleaved", "zb-h1", "zbv"
const char* recompute_name(Recompute r);  ///< "none", "selective", "full"
/// ZeRO-style optimizer sharding levels 0..3: "none", "optimizer", "gradients", "parameters".
const char* optimizer_shard_name(int level);

struct Parallel {
  std::int64_t dp = 1, tp = 1, pp = 1;
  int optimizer_shard = 0;  ///< 0..3, see optimizer_shard_name()
  std::int64_t micro_batch_size = 1;
  std::int64_t micro_batches = 1;
  Schedule schedule = Schedule::one_f_one_b;
  std::int64_t virtual_stages = 1;  ///< model chunks per pipeline rank (interleaved; zbv: 2)
  bool sequence_parallel = false;
  std::int64_t expert_parallel = 1;  ///< expert-parallel degree (1 = none)
  /// HSDP: ZeRO shards over groups of this many consecutive data-parallel ranks and replicates
  /// across the dp / shard_group groups; 0 = shard over the whole data-parallel group.
  std::int64_t shard_group = 0;
  /// Data parallelism's gradient buckets, in MiB: each is reduced as soon as its gradients are
  /// all in, and under ZeRO-3 it is also the unit the parameters are gathered in (PyTorch DDP's
  /// bucket_cap_mb, FSDP's wrapping unit).
  double bucket_mb = 16;
  /// Expert parallelism in training: send each token only to the members holding the experts its
  /// router chose, where the graph allows it (docs/training.md); false: all-gather every token.
  bool routed_experts = true;
  /// ZeRO-3 in training: a bucket gathered for its first use in a step is kept until the step's
  /// backward is done, so every bucket is gathered once per step ("per-step", PyTorch FSDP's
  /// reshard_after_forward=False) instead of for each forward and backward use of every
  /// micro-batch ("per-use", the default: the parameters whole only during their uses).
  bool zero3_per_step = false;
  friend bool operator==(const Parallel&, const Parallel&) = default;
};

struct Stage {
  std::int64_t index = 0;
  std::vector<std::int64_t> layers;       ///< layer indices (block numbers from layer discovery)
  Recompute recompute = Recompute::none;  ///< the policy of every layer not in recompute_layers
  /// Per-layer overrides (the planner's level 2 chooses recomputation per block): mode -> layers.
  std::map<Recompute, std::vector<std::int64_t>> recompute_layers;
  std::vector<std::int64_t> ranks;  ///< global ranks running this stage; may be empty
  /// The policy of one of the stage's layers: its override, else the stage's `recompute`.
  Recompute recompute_of(std::int64_t layer) const;
  friend bool operator==(const Stage&, const Stage&) = default;
};

/// A tensor layout (docs/shard.md, "Layouts"): a logical device mesh and, per tensor dimension, the
/// mesh axes it is split over (empty = "None", not split; several = a tuple, first axis major).
struct Layout {
  std::vector<std::int64_t> device_matrix;
  std::vector<std::string> alias_name;
  std::vector<std::vector<std::string>> tensor_map;
  std::vector<std::int64_t> rank_list;  ///< empty = 0..prod(device_matrix)-1
  friend bool operator==(const Layout&, const Layout&) = default;
};

/// One MPMD group (an mpirun app context): which ranks run which module on which backend.
struct Group {
  std::string name;
  std::vector<std::int64_t> ranks;
  std::string module;   ///< what the ranks run (a stage program, "scheduler", ...)
  std::string backend;  ///< plugin name: "cpu", "cuda", "ascend"; empty = default
  std::map<std::string, std::string> env;
  std::vector<std::string> inputs, outputs;
  friend bool operator==(const Group&, const Group&) = default;
};

/// A figure with where it came from: "table" (a preset / datasheet), "measured:<probe> <date>",
/// "user", or "unknown".
struct SourcedValue {
  double value = 0;
  std::string source = "unknown";
  friend bool operator==(const SourcedValue&, const SourcedValue&) = default;
};

/// [offload]: host DRAM as a pool behind device memory (docs/offload.md). Written by
/// offload-profile.
struct Offload {
  bool enabled = false;
  std::vector<std::string>
      targets;  ///< "parameters", "gradients", "optimizer", "activations", "kv_cache"
  SourcedValue h2d_bandwidth;           ///< bytes/s
  SourcedValue d2h_bandwidth;           ///< bytes/s
  SourcedValue host_memory;             ///< bytes of host memory hp may pin
  double margin = 0.1;                  ///< fraction of device memory kept free (0..0.5)
  std::int64_t prefetch_lookahead = 1;  ///< ops ahead an H2D copy is issued
  /// Bytes of device memory the schedule keeps each rank under (offload-profile's budget); 0 = the
  /// device's memory x (1 - margin). `hp launch` enforces it on the cpu backend (an arena of that
  /// size).
  double device_budget = 0;
  friend bool operator==(const Offload&, const Offload&) = default;
};

/// [workload]: what the plan was made for, written by hp plan so every later tool prices and runs
/// the same step (offload-profile's dtype, mode and optimizer; verify's batch check) and a reader
/// sees how the recipe was made.
struct Workload {
  std::string mode = "train";      ///< train | infer
  std::string dtype = "bf16";      ///< compute dtype, a name parse_dtype knows (hp/core/dtype.h)
  std::string optimizer = "adam";  ///< adam | adamw | sgd | none (hp/core/optimizer.h)
  std::int64_t global_batch = 0;   ///< sequences (samples) per step; 0 = not recorded
  std::int64_t seq = 0;            ///< planned sequence length; 0 = the model has no sequence axis
  std::string command;             ///< the command line that wrote the recipe
  friend bool operator==(const Workload&, const Workload&) = default;
};

/// [train]: what `hp launch` trains when the recipe has this table (docs/training.md). Written with
/// its defaults by `hp plan --mode train -o`.
struct Train {
  std::string loss = "cross_entropy";  ///< cross_entropy | mse
  std::string logits = "output";       ///< the graph output the loss reads
  std::string labels = "labels";       ///< the data tensor holding labels (targets for mse)
  std::string optimizer = "adamw";     ///< adamw | sgd
  double lr = 1e-3;
  std::vector<double> betas = {0.9, 0.999};  ///< adamw
  double eps = 1e-8;                         ///< adamw
  double weight_decay = 0.01;
  double momentum = 0.0;                 ///< sgd
  double clip_norm = 0.0;                ///< global gradient-norm clipping; 0 = off
  std::string lr_schedule = "constant";  ///< constant | cosine (linear warm-up, cosine decay)
  std::int64_t warmup_steps = 0;
  double min_lr = 0.0;
  std::int64_t steps = 100;
  std::int64_t seed = 0;            ///< data order
  std::vector<std::string> frozen;  ///< initializers not trained (globs)
  friend bool operator==(const Train&, const Train&) = default;
};

struct Recipe {
  int version = kRecipeVersion;
  std::string name;
  std::string model;    ///< ONNX path, relative to the recipe file
  std::string cluster;  ///< preset name or cluster file path relative to the recipe
  std::int64_t nodes = 1;
  std::map<std::string, std::int64_t> dims;  ///< symbolic input dims bound for planning
  Parallel parallel;
  std::vector<Stage> stages;
  std::map<std::string, Layout> layouts;  ///< tensor name or glob -> layout
  std::vector<Group> groups;
  std::optional<Offload> offload;
  std::optional<Workload> workload;
  std::optional<Train> train;

  /// dp * tp * pp.
  std::int64_t ranks() const { return parallel.dp * parallel.tp * parallel.pp; }
  /// The cluster ranks the job occupies: with [[groups]] (MPMD app contexts) the ranks of its
  /// groups, a group on the cpu backend (a scheduler beside accelerator ranks) counted only when
  /// the cluster's ranks are CPUs (`cpu_ranks`); else ranks().
  std::int64_t device_ranks(bool cpu_ranks) const {
    if (groups.empty()) return ranks();
    std::int64_t n = 0;
    for (const auto& g : groups)
      if (cpu_ranks || g.backend != "cpu") n += static_cast<std::int64_t>(g.ranks.size());
    return n;
  }
  friend bool operator==(const Recipe&, const Recipe&) = default;
};

/// A parsed recipe, with key locations and every problem found (empty when valid on its own).
struct RecipeDocument {
  Recipe recipe;
  SourceMap where;
  std::vector<Diagnostic> problems;
  bool syntax_ok = false;  ///< false when the TOML itself did not parse
};

/// Parses and validates recipe TOML text (no file system access; the cluster is not consulted).
RecipeDocument parse_recipe(std::string_view text, const std::string& display_path);

/// Reads a recipe file; fails only when it cannot be read (problems are in the document).
Expected<RecipeDocument> read_recipe(const std::filesystem::path& path);

/// Reads, parses and validates; every problem is in the returned Error (bad_input).
Expected<Recipe> load_recipe(const std::filesystem::path& path);

/// Checks of the recipe on its own (degrees, stages, layouts, groups, offload).
std::vector<Diagnostic> validate_recipe(const Recipe& r, const SourceMap& where);

/// Checks of the recipe against the cluster it runs on (rank counts, rank ids). `cpu_ranks`: the
/// cluster's ranks are CPUs, so cpu groups occupy them too (Recipe::device_ranks).
std::vector<Diagnostic> validate_recipe_on_cluster(const Recipe& r, const SourceMap& where,
                                                   std::int64_t cluster_ranks,
                                                   const std::string& cluster_name,
                                                   bool cpu_ranks = false);

/// Deterministic TOML for `r`: fixed section and key order, layers/ranks as range strings.
std::string format_recipe(const Recipe& r);
/// Writes format_recipe(r) atomically.
Status write_recipe(const Recipe& r, const std::filesystem::path& path);

/// "0-3,8,10-11" for {0,1,2,3,8,10,11}; parse_ranges is its inverse (nullopt when malformed).
std::string format_ranges(const std::vector<std::int64_t>& v);
std::optional<std::vector<std::int64_t>> parse_ranges(std::string_view text);

}  // namespace hp::recipe
