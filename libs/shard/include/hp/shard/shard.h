// hp shard: HyperShard layouts, sharding propagation and per-rank model partitions (docs/shard.md).
//
//   hp shard RECIPE.toml -o DIR                 one ONNX file per rank + manifest.toml (manifest.h)
//   hp shard RECIPE.toml --explain TENSOR [--json]   a tensor's layout, every rank's slice, and the
//                                               redistributions on its path
//
// The logical mesh of a stage is [dp, tp] (axis names "dp", "tp", or those of the recipe's
// [layouts] meshes, which must all be that mesh); stage k's ranks are the recipe's [[stages]]
// ranks, or k*dp*tp .. (k+1)*dp*tp-1 in row-major mesh order (tp fastest).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "hp/core/expected.h"
#include "hp/core/fs.h"
#include "hp/model/graph.h"
#include "hp/model/layers.h"
#include "hp/model/model.h"
#include "hp/recipe/recipe.h"
#include "hp/shard/manifest.h"
#include "hp/shard/partition.h"
#include "hp/shard/propagate.h"

namespace hp::shard {

struct ShardOptions {
  std::filesystem::path recipe;   ///< recipe to partition
  std::filesystem::path out_dir;  ///< where the per-rank ONNX files and manifest go
  std::string explain;            ///< tensor to explain instead of writing partitions
  bool json = false;              ///< the report (-o) or the explanation (--explain) as JSON
  /// Where the recipe's cluster preset is looked up; when set, the recipe passes the same static
  /// checks as `hp verify --static` (recipe::check_recipe: cluster, ranks on it, model file)
  /// before anything is partitioned.
  std::vector<std::filesystem::path> preset_dirs;
  bool force = false;  ///< -o may replace a directory that is not hp's own output
};

struct ShardReport {
  std::string summary;
  /// -o: one JSON object (dir, dp, tp, pp, files written, layouts, redistributions, comm_nodes,
  /// boundaries, sends, weights_written, weight_bytes, notes) for `hp shard --json`.
  std::string json;
};

/// Everything between the recipe and the files: the model at bound dims, its blocks, the mesh, the
/// propagated layouts and the per-stage node sets. Not movable: the plan points into it.
struct Prepared {
  std::filesystem::path recipe_path, model_path;
  recipe::Recipe recipe;
  recipe::SourceMap where;
  /// The dims the partitions are specialised to: the recipe's, with the batch dims (axis 0 of the
  /// graph inputs) divided by [parallel] micro_batches when the pipeline has several stages.
  std::map<std::string, std::int64_t> dims;
  std::int64_t micro_batches = 1;
  std::set<std::string> batch_dims;  ///< the symbolic axis-0 dims of the graph inputs
  model::Model model;
  model::Graph graph;
  model::Layering layering;
  int dp_axis = 0, tp_axis = 1;
  Propagation prop;
  PartitionPlan plan;

  Prepared() = default;
  Prepared(const Prepared&) = delete;
  Prepared& operator=(const Prepared&) = delete;
};

/// Reads the recipe and its model, resolves layouts and stages, propagates. Errors: bad_input
/// naming the recipe line (a layout naming a missing alias, an indivisible dim, a glob that matches
/// nothing, a mesh whose size is not dp*tp, stages that do not cover the model's blocks, ...).
Expected<std::unique_ptr<Prepared>> prepare(const std::filesystem::path& recipe);
/// The same for a recipe already read and validated (`where` locates its keys): `hp launch` and
/// `hp verify` read the recipe once and partition what they read.
Expected<std::unique_ptr<Prepared>> prepare(const recipe::Recipe& recipe,
                                            const recipe::SourceMap& where,
                                            const std::filesystem::path& recipe_path);

/// Whether hp shard can partition `recipe` (to be written at `recipe_path`): prepare() and nothing
/// written. hp plan checks each plan it is about to write with it
/// (planner::PlanOptions::check_plan), so a recipe hp writes is one hp shards.
Status check_shardable(const recipe::Recipe& recipe, const std::filesystem::path& recipe_path);

/// The manifest of `p` (file names rank<R>.onnx).
Manifest make_manifest(const Prepared& p);

/// Writes every rank's partition and manifest.toml into `out_dir` atomically through
/// replace_output_dir (hp/core/fs.h): a temporary sibling renamed into place, nothing left behind
/// on error. An existing `out_dir` is replaced only when it is an earlier `hp shard` output (its
/// .hp-output marker lists every entry) or `guard.force`; never when it is or holds the model or
/// one of `guard.inputs`. Errc::bad_input naming the foreign entry otherwise.
Expected<ShardReport> write_partitions(const Prepared& p, const std::filesystem::path& out_dir,
                                       const OutputDirOptions& guard = {});

/// The --explain text (or JSON) for one tensor; bad_input when the model has no such tensor.
Expected<std::string> explain(const Prepared& p, const std::string& tensor, bool json);

/// The command: prepare, then explain or write.
Expected<ShardReport> run(const ShardOptions& options);

}  // namespace hp::shard
