// Sharding propagation (docs/shard.md, "Propagation"): from the layouts of some tensors (parameters
// and graph inputs, given by the recipe or chosen by default) derive the layout of every tensor of
// the graph through per-op rules, and record a redistribution wherever a consumer needs its input
// laid out differently from how the producer left it.
//
// The rules are written against global shapes at the recipe's bound dims; every tensor carries one
// Sharding on one logical mesh (the data-parallel and tensor-parallel axes of one pipeline stage).
// An op without a rule is always correct: its inputs are made whole (replicated, no partial state)
// and its outputs are replicated. So a missing rule costs communication, never wrong numbers.
//
// Default layouts (Megatron-style, found from dataflow, not names): graph inputs split their first
// dim over the data-parallel axis; a weight is laid out by its first matmul consumer: when the
// activation reaching it is split on the contracting dim over the tensor-parallel axis the weight
// is row-parallel (split on its contracting dim, output Partial(sum)), otherwise column-parallel
// (split on its output dim). A column-parallel projection therefore feeds a row-parallel one
// through elementwise ops, head reshapes and attention, and the partial sum is resolved where the
// residual stream needs it whole (AllReduce, or ReduceScatter on the sequence dim with sequence
// parallelism).
//
// Fused projections (GPT-2's c_attn, ViT's qkv: one MatMul to k*n columns, then a Split into k
// equal parts or a Reshape to [.., k, heads, head_dim]) are split Megatron's "blocked" way: the
// output dim is k equal blocks (q | k | v) and each block is split over the axis on its own, so a
// rank holds its 1/tp of q's columns, of k's and of v's, and the Split (or head Reshape) runs
// locally with each part split on its heads: attention stays head-parallel with no gather before
// the Split. Propagation records this in Propagation::blocked; the tensor's Sharding then describes
// the *blocked order* of the dim (block b's i-th chunk before block b+1's), so every layout tool
// (slice_of, local_shape, redistribution) works on the held_view() of the tensor, in which the dim
// is [k, n/k] with the split on the minor: a reshape, so row-major bytes and flat indices are those
// of the tensor itself. Partitioning cuts the weight's k pieces (held_view) and gives Split its
// local sizes; the manifest's layout origin says "(blocked: k blocks on dim d)". Only the pattern
// above is made blocked, decided from the MatMul's consumers before the weight is fixed; if a
// blocked tensor then met a consumer or a redistribution that does not know blocks, propagation
// runs again with that weight not fused.
//
// GQA and other head reshapes the split cannot survive (kv heads fewer than the tp degree: a column
// split of k_proj would cut a head): the column-parallel weight whose output a head Reshape would
// have to gather is replicated instead (each rank computes all kv heads, no collective; after
// repeat_kv the heads it needs are sliced locally), with a note saying so.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/graph.h"
#include "hp/shard/layout.h"
#include "hp/shard/redistribute.h"

namespace hp::shard {

/// A consumer reading a tensor in another layout than it was produced in.
struct Redistribution {
  int tensor = -1;  ///< graph tensor index
  int node = -1;    ///< consuming node; -1 for a graph output
  Sharding from, to;
  RedistPlan plan;
};

struct PropagateOptions {
  Mesh mesh;         ///< logical mesh of one stage; rank_list = mesh positions 0..n-1
  int dp_axis = -1;  ///< mesh axis of data parallelism (-1: none)
  int tp_axis = -1;  ///< mesh axis of tensor parallelism (-1: none)
  bool sequence_parallel = false;
  /// Layouts fixed up front (the recipe's [layouts]): tensor index -> sharding, and where it was
  /// given.
  std::map<int, Sharding> declared;
  std::map<int, std::string> declared_where;
};

/// A dim made of `blocks` equal blocks, each split by the tensor's layout of that dim on its own.
struct BlockedDim {
  int dim = -1;
  std::int64_t blocks = 1;
  friend bool operator==(const BlockedDim&, const BlockedDim&) = default;
};

struct Propagation {
  Mesh mesh;
  /// Tensors whose layout is blocked on one dim (fused q|k|v projections and their biases,
  /// outputs).
  std::map<int, BlockedDim> blocked;
  std::vector<Sharding> layout;     ///< per graph tensor: its layout as produced (or stored)
  std::vector<std::string> origin;  ///< per tensor: "recipe (file:line)", "column-parallel", ...
  /// Per node, per input slot: the layout the node reads (after any redistribution).
  std::vector<std::vector<Sharding>> reads;
  std::vector<Redistribution> redistributions;
  /// Warnings worth showing (a weight left replicated because a dim does not divide, ...).
  std::vector<std::string> notes;
};

/// Propagates layouts through `g`, built from `model` (node attributes are read from its proto;
/// shapes must be known: bind every symbolic dim). Errors (bad_input) name the tensor: a declared
/// layout that does not fit its tensor's shape.
Expected<Propagation> propagate(const model::Model& model, const model::Graph& g,
                                const PropagateOptions& options);

/// The tensor as its ranks hold it: `shape` and `layout`, except that a blocked dim d of size n
/// becomes two dims [k, n/k] with d's axes on the minor one. Contiguous slices of the view
/// (slice_of) are what each rank holds; the view's row-major order is the tensor's.
struct HeldView {
  std::vector<std::int64_t> shape;
  Sharding layout;
};
HeldView held_view(const std::vector<std::int64_t>& shape, const Sharding& layout,
                   const BlockedDim* blocked);
HeldView held_view(const Propagation& p, int tensor, const std::vector<std::int64_t>& shape);

/// The plan propagation inserts: plan_redistribution (which moves a split between dims with one
/// all-to-all) when some axis of `from` splits another dim in `to`, else plan_steps.
Expected<RedistPlan> plan_for_consumer(const Mesh& mesh, const Sharding& from, const Sharding& to,
                                       const std::vector<std::int64_t>& shape, int elem_bytes);

/// Plans from -> to with AllReduce / ReduceScatter for partial axes, AllGather for dropped split
/// axes (minor axis first, so member order is chunk order) and local slices for added ones. Always
/// valid; not always the cheapest (an axis moving between dims is gathered then sliced:
/// plan_for_consumer uses the all-to-all of plan_redistribution there).
Expected<RedistPlan> plan_steps(const Mesh& mesh, const Sharding& from, const Sharding& to,
                                const std::vector<std::int64_t>& shape, int elem_bytes);

/// Global shape of a tensor at bound dims; empty optional-like (has_shape false) gives {}.
std::vector<std::int64_t> global_shape(const model::Tensor& t);

/// "all_gather dim 1 over tp" ... one line per step.
std::string describe_plan(const Mesh& mesh, const RedistPlan& plan);

}  // namespace hp::shard
