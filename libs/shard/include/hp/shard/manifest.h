// manifest.toml: what `hp shard -o DIR` wrote, for the launcher and for people. One file next to
// the per-rank models:
//
//   [manifest]        version = 1, model, recipe, dp, tp, pp, weights (false: shapes only),
//                     device_matrix = [dp, tp], alias_name = ["dp", "tp"], dims = { batch = 8, ...
//                     }
//   [[ranks]]         rank, stage, file ("rank3.onnx", relative to the manifest), dp, tp, pp
//                     (coordinates: dp/tp on the stage's mesh, pp = the stage index)
//   [[groups]]        name ("tp.s0.d1"), kind ("dp" | "tp" | "pp"), members (ordered global ranks:
//                     chunk order of the collectives that name the group)
//   [[stages]]        index, layers (block numbers), ranks (global rank at each mesh position)
//   [[boundaries]]    tensor, from_stage, to_stage, tag (hp.Send/hp.Recv between pipeline stages)
//   [[layouts]]       tensor, shape, tensor_map (per dim: [] or alias list), partial (aliases),
//                     origin ("recipe (r.toml:12:1)", "column-parallel", "propagated", ...)
//   [[redistributions]] tensor, consumer (node name, "" for a graph output), from, to, steps
//   [[inputs]] / [[outputs]]  the graph's inputs and outputs as the partitions hold them, in graph
//                     order: tensor, shape (global, of one micro-batch), tensor_map, partial
//                     (always empty for outputs: they are resolved), origin (the stage that feeds /
//                     holds it), batched (true: axis 0 is the batch, cut into micro_batches;
//                     written when true)
//
// virtual_stages (in [manifest], default 1): with an interleaved schedule every rank holds that
// many model chunks: [[ranks]] lists one entry per (rank, chunk) with stage = chunk * pp + the
// rank's pipeline index and file "rank<R>.c<chunk>.onnx"; [[stages]] lists the pp * virtual_stages
// stages.
//
// micro_batches (in [manifest], default 1): the partitions are specialised to one micro-batch — the
// batch dims (axis 0 of the graph inputs) are bound to dims[batch] / micro_batches — and the
// runtime splits the recipe's batch into that many micro-batches along axis 0 (hp/job/sharded.h).
//
// The launcher reads it with read_manifest(): for each rank the file to run and, for each group,
// the ordered members its communicators must be created over.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "hp/core/expected.h"

namespace hp::shard {

struct ManifestRank {
  std::int64_t rank = 0;
  int stage = 0;
  std::string file;
  std::int64_t dp = 0, tp = 0, pp = 0;
  friend bool operator==(const ManifestRank&, const ManifestRank&) = default;
};

struct ManifestGroup {
  std::string name;
  std::string kind;                   ///< "dp", "tp" or "pp"
  std::vector<std::int64_t> members;  ///< ordered
  friend bool operator==(const ManifestGroup&, const ManifestGroup&) = default;
};

struct ManifestStage {
  int index = 0;
  std::vector<std::int64_t> layers;
  std::vector<std::int64_t> ranks;
  friend bool operator==(const ManifestStage&, const ManifestStage&) = default;
};

struct ManifestBoundary {
  std::string tensor;
  int from_stage = 0, to_stage = 0, tag = 0;
  friend bool operator==(const ManifestBoundary&, const ManifestBoundary&) = default;
};

struct ManifestLayout {
  std::string tensor;
  std::vector<std::int64_t> shape;  ///< global
  std::vector<std::vector<std::string>> tensor_map;
  std::vector<std::string> partial;  ///< aliases holding a pending sum
  std::string origin;
  /// [[inputs]] / [[outputs]] only: axis 0 is the batch, cut into micro_batches blocks of rows.
  bool batched = false;
  friend bool operator==(const ManifestLayout&, const ManifestLayout&) = default;
};

struct ManifestRedistribution {
  std::string tensor, consumer, from, to;
  std::vector<std::string> steps;
  friend bool operator==(const ManifestRedistribution&, const ManifestRedistribution&) = default;
};

struct Manifest {
  int version = 1;
  std::string model, recipe;
  std::int64_t dp = 1, tp = 1, pp = 1;
  std::int64_t micro_batches = 1;
  std::int64_t virtual_stages = 1;  ///< model chunks per pipeline rank (interleaved)
  bool weights = true;
  std::vector<std::int64_t> device_matrix;
  std::vector<std::string> alias_name;
  std::map<std::string, std::int64_t> dims;
  std::vector<ManifestRank> ranks;
  std::vector<ManifestGroup> groups;
  std::vector<ManifestStage> stages;
  std::vector<ManifestBoundary> boundaries;
  std::vector<ManifestLayout> layouts;
  std::vector<ManifestRedistribution> redistributions;
  std::vector<ManifestLayout> inputs, outputs;
  friend bool operator==(const Manifest&, const Manifest&) = default;
};

/// Deterministic TOML; parse_manifest(format_manifest(m)) == m.
std::string format_manifest(const Manifest& m);
/// Parses manifest TOML; bad_input with "file:line:col" for a syntax error, a missing key or a rank
/// whose stage does not exist.
Expected<Manifest> parse_manifest(std::string_view text, const std::string& display_path);
Expected<Manifest> read_manifest(const std::filesystem::path& path);

}  // namespace hp::shard
