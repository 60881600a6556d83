// A data-movement simulator for redistribution plans: the proof that a plan is right. Every rank
// starts with its exact slice of a global tensor of distinct values (partial layouts: random
// addends whose reduction over the partial group is the true value), each step runs with the
// collective semantics of hp/core/hp_domain.h (per group, chunks in member order), and the result
// on every rank is compared with the slice the target layout says it must hold. It reads only what
// an executor reads (kind, groups, dims, op, pairs), never a step's before/after, so a wrong plan
// cannot vouch for itself.
//
// Values are doubles that stay integers (addends are small random integers; prod uses powers of
// two), so every reduction is exact and equality is bitwise. Even shapes only, like the planner.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "hp/core/expected.h"
#include "hp/shard/layout.h"
#include "hp/shard/redistribute.h"

namespace hp::shard {

/// A dense row-major tensor.
struct SimTensor {
  std::vector<std::int64_t> shape;
  std::vector<double> values;
  friend bool operator==(const SimTensor&, const SimTensor&) = default;
};

/// Each rank's local tensor, by global rank.
using RankTensors = std::map<std::int64_t, SimTensor>;

/// The global tensor used by the proofs: the element at row-major flat index i holds i + 1.
SimTensor global_tensor(const std::vector<std::int64_t>& shape);
/// The block `slice` (one Range per dim) of `t`.
SimTensor slice_tensor(const SimTensor& t, const std::vector<Range>& slice);

/// Every rank's starting tensor under `from`: its exact slice; on partial axes, addends (or
/// factors, or bounded values for max/min) that reduce to the slice. All partial axes must share
/// one op. Errors: bad_input when the layout does not fit the mesh or shape.
Expected<RankTensors> initial_state(const Mesh& mesh, const std::vector<std::int64_t>& shape,
                                    const Sharding& from, std::uint64_t seed);

/// Runs the plan's steps on `state`. Errors (internal): a malformed step — a rank in no group or
/// two, members' shapes that differ, a dim not divisible by the group size.
Expected<RankTensors> simulate_plan(const Mesh& mesh, RankTensors state, const RedistPlan& plan);

/// initial_state + simulate_plan + comparison with slice_of(to) on every rank (when `to` is
/// partial, the reduction over each partial group is compared). Errors: mismatch naming the first
/// wrong rank.
Status prove_plan(const Mesh& mesh, const std::vector<std::int64_t>& shape, const Sharding& from,
                  const Sharding& to, const RedistPlan& plan, std::uint64_t seed = 1);

}  // namespace hp::shard
