// Redistribution planning (docs/shard.md, "Partial state", "Redistribution" and "Redistribution
// cost"): the collectives that turn one layout of a tensor into another on the same mesh, with
// explicit ordered rank groups, and their alpha-beta cost.
//
// Contract shared by the planner of plans, the data-movement simulator (tests prove every plan with
// it), propagation (which inserts plans where producer and consumer disagree) and partitioning
// (which writes each step as "hp"-domain nodes, hp/core/hp_domain.h, or as a local ONNX Slice).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hp/core/expected.h"
#include "hp/shard/layout.h"

namespace hp::topology {
class Topology;
}

namespace hp::shard {

enum class StepKind { local_slice, all_gather, reduce_scatter, all_reduce, all_to_all, permute };
const char* step_kind_name(StepKind k);  ///< "local_slice", "all_gather", ...

/// One step, the same on every rank (each rank takes part through the group holding it).
struct RedistStep {
  StepKind kind = StepKind::local_slice;
  std::vector<int> axes;        ///< mesh axes the step runs over (first major)
  int dim = -1;                 ///< gathered / scattered / sliced dim; all_to_all: the split dim
  int concat_dim = -1;          ///< all_to_all only: the dim received chunks are concatenated on
  ReduceOp op = ReduceOp::sum;  ///< all_reduce / reduce_scatter
  /// Ordered member lists, one per disjoint group (chunk order = member order); permute: one group
  /// of all ranks involved.
  std::vector<std::vector<std::int64_t>> groups;
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;  ///< permute: (src, dst) global ranks
  Sharding before, after;
  std::int64_t bytes = 0;  ///< the alpha-beta n of the step (shard_cost.h), per rank
};

struct RedistPlan {
  std::vector<RedistStep> steps;  ///< empty when the layouts agree
  /// True when the plan replicates the whole tensor on some rank before slicing it again
  /// (GSPMD's "involuntary full rematerialization"); reported to the user.
  bool full_rematerialization = false;
  std::string describe(const Mesh& mesh) const;  ///< one line per step, for --explain
};

/// Plans `from` -> `to` for a tensor of `shape` with `elem_bytes`-byte elements. Partial axes of
/// `from` are resolved first (docs/shard.md, "Partial state"). Partial axes of `to` are kept where
/// `from` has them with the same op, else created at the end from the replicated values:
/// avg/max/min by relabelling (no step), sum by a permute in which only coordinate 0 of the axis
/// keeps its copy (the others get zeros); prod cannot be created. All partial axes of one layout
/// must share an op. Errors: bad_input when shapes or layouts do not fit the mesh (indivisible dims
/// included: plans are for even layouts).
Expected<RedistPlan> plan_redistribution(const Mesh& mesh, const Sharding& from, const Sharding& to,
                                         const std::vector<std::int64_t>& shape, int elem_bytes);

}  // namespace hp::shard
