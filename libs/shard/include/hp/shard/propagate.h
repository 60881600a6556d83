// Sharding propagation (issue #5 item 3, shard.md §8): from the layouts of some tensors (parameters and
// graph inputs, given by the recipe or chosen by default) derive the layout of every tensor of the
// graph through per-op rules, and record a redistribution wherever a consumer needs its input laid
// out differently from how the producer left it.
//
// The rules are written against global shapes at the recipe's bound dims; every tensor carries one
// Sharding on one logical mesh (the data-parallel and tensor-parallel axes of one pipeline stage).
// An op without a rule is always correct: its inputs are made whole (replicated, no partial state)
// and its outputs are replicated. So a missing rule costs communication, never wrong numbers.
//
// Default layouts (Megatron-style, found from dataflow, not names): graph inputs split their first
// dim over the data-parallel axis; a weight is laid out by its first matmul consumer: when the
// activation reaching it is split on the contracting dim over the tensor-parallel axis the weight is
// row-parallel (split on its contracting dim, output Partial(sum)), otherwise column-parallel (split on
// its output dim). A column-parallel projection therefore feeds a row-parallel one through elementwise
// ops, head reshapes and attention, and the partial sum is resolved where the residual stream needs it
// whole (AllReduce, or ReduceScatter on the sequence dim with sequence parallelism).
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
  int tensor = -1;          ///< graph tensor index
  int node = -1;            ///< consuming node; -1 for a graph output
  Sharding from, to;
  RedistPlan plan;
};

struct PropagateOptions {
  Mesh mesh;                ///< logical mesh of one stage; rank_list = mesh positions 0..n-1
  int dp_axis = -1;         ///< mesh axis of data parallelism (-1: none)
  int tp_axis = -1;         ///< mesh axis of tensor parallelism (-1: none)
  bool sequence_parallel = false;
  /// Layouts fixed up front (the recipe's [layouts]): tensor index -> sharding, and where it was given.
  std::map<int, Sharding> declared;
  std::map<int, std::string> declared_where;
};

struct Propagation {
  Mesh mesh;
  std::vector<Sharding> layout;        ///< per graph tensor: its layout as produced (or stored)
  std::vector<std::string> origin;     ///< per tensor: "recipe (file:line)", "column-parallel", ...
  /// Per node, per input slot: the layout the node reads (after any redistribution).
  std::vector<std::vector<Sharding>> reads;
  std::vector<Redistribution> redistributions;
  /// Warnings worth showing (a weight left replicated because a dim does not divide, ...).
  std::vector<std::string> notes;
};

/// Propagates layouts through `g`, built from `model` (node attributes are read from its proto; shapes
/// must be known: bind every symbolic dim). Errors (bad_input)
/// name the tensor: a declared layout that does not fit its tensor's shape.
Expected<Propagation> propagate(const model::Model& model, const model::Graph& g,
                                const PropagateOptions& options);

/// Plans from -> to with AllReduce / ReduceScatter for partial axes, AllGather for dropped split axes
/// (minor axis first, so member order is chunk order) and local slices for added ones. Always valid;
/// not always the cheapest (an axis moving between dims is gathered then sliced, not all-to-all'd).
Expected<RedistPlan> plan_steps(const Mesh& mesh, const Sharding& from, const Sharding& to,
                                const std::vector<std::int64_t>& shape, int elem_bytes);

/// Global shape of a tensor at bound dims; empty optional-like (has_shape false) gives {}.
std::vector<std::int64_t> global_shape(const model::Tensor& t);

/// "all_gather dim 1 over tp" ... one line per step.
std::string describe_plan(const Mesh& mesh, const RedistPlan& plan);

}  // namespace hp::shard
