// Layer discovery: the repeated blocks of a model (transformer layers, MLP layers, MoE blocks),
// what runs before and after them, and the tensors that cross each boundary. The planner assigns
// blocks to pipeline stages, so each carries its own cost.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/model/graph.h"

namespace hp::model {

/// A contiguous part of the forward pass.
struct Block {
  std::string name;        ///< "h.3", "layers.3" from naming, else "block.3"; "prologue"/"epilogue"
  std::vector<int> nodes;  ///< node indices, topological order
  std::int64_t parameters = 0;  ///< float initializer elements first used by this block
  double flops = 0;             ///< total FLOPs of its nodes (one forward at the bound dims)
  double matmul_flops = 0;
  /// Bytes of every activation tensor the block's nodes produce in one forward at the bound dims
  /// (shape arithmetic and constant folding excluded). This is what the block keeps alive for the
  /// backward pass without recomputation: an upper bound, as fused kernels store less.
  std::int64_t activation_bytes = 0;
  bool cost_known = true;  ///< false when some node's shapes were unknown
};

/// The tensors produced before a boundary and consumed after it (what a pipeline stage sends).
struct Cut {
  std::string after;         ///< name of the block before the boundary
  std::string before;        ///< name of the block after it
  std::vector<int> tensors;  ///< tensor indices
  std::int64_t bytes = 0;    ///< their total size (unknown sizes count 0)
};

struct Layering {
  Block prologue;             ///< embeddings, input projection, shared masks/tables
  std::vector<Block> blocks;  ///< the repeated blocks in execution order
  Block epilogue;             ///< final norm, head
  std::vector<Cut> cuts;      ///< prologue|blocks[0], blocks[i]|blocks[i+1], last|epilogue
  /// How the boundaries were found: "structure" (repeated fingerprints between spine tensors),
  /// "names" (no repetition, but names carry layer indices such as "layers.3") or "none" (neither:
  /// everything is in the prologue).
  std::string method = "none";
  int spine_tensors = 0;  ///< single-tensor cut points found on the main path
};

/// Segments `graph` into prologue, repeated blocks and epilogue. Works on anonymous graphs; names
/// only label the blocks.
Layering discover_layers(const Graph& graph);

}  // namespace hp::model
