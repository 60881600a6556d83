// The data-movement simulator itself: the collective semantics of hp_domain.h on small tensors, the
// partial starting states, and that it rejects the known-wrong plans of docs/shard.md, "Plans
// HyperParallel gets wrong" (a proof that cannot fail proves nothing).
#include <catch2/catch.hpp>

#include "hp/shard/simulate.h"

using namespace hp::shard;
using Groups = std::vector<std::vector<std::int64_t>>;

namespace {

Mesh mesh22() {
  auto m = Mesh::make({2, 2}, {"x", "y"});
  REQUIRE(m.ok());
  return *m;
}

Sharding layout(std::vector<std::vector<int>> dims, std::vector<PartialAxis> partial = {}) {
  return Sharding{std::move(dims), std::move(partial)};
}

RedistStep step(StepKind kind, const Mesh& m, std::vector<int> axes, int dim, int concat_dim = -1) {
  RedistStep s;
  s.kind = kind;
  s.dim = dim;
  s.concat_dim = concat_dim;
  s.groups = m.groups(axes);
  s.axes = std::move(axes);
  return s;
}

}  // namespace

TEST_CASE("simulate: global tensor and slices", "[shard][simulate]") {
  SimTensor g = global_tensor({2, 3});
  CHECK(g.values == std::vector<double>{1, 2, 3, 4, 5, 6});
  SimTensor s = slice_tensor(g, {{1, 2}, {1, 3}});
  CHECK(s.shape == std::vector<std::int64_t>{1, 2});
  CHECK(s.values == std::vector<double>{5, 6});
}

TEST_CASE("simulate: partial starting states reduce to the slice", "[shard][simulate]") {
  Mesh m = mesh22();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod}) {
    Sharding from = layout({{0}, {}}, {{1, op}});
    auto state = initial_state(m, {4, 2}, from, 7);
    REQUIRE(state.ok());
    // Ranks 0 and 1 share rows [0:2) over y; their addends differ but reduce to the slice.
    CHECK(state->at(0).values != state->at(1).values);
    RedistPlan plan;
    RedistStep ar = step(StepKind::all_reduce, m, {1}, -1);
    ar.op = op;
    plan.steps.push_back(ar);
    CHECK(prove_plan(m, {4, 2}, from, layout({{0}, {}}), plan, 7).ok());
    // Without the reduction, the data is wrong.
    CHECK(prove_plan(m, {4, 2}, from, layout({{0}, {}}), RedistPlan{}, 7).error().code ==
          hp::Errc::mismatch);
  }
}

TEST_CASE("simulate: all-gather concatenates in member order, not rank order",
          "[shard][simulate]") {
  Mesh m = mesh22();
  // ((y,x),None) -> (None,None): the gather group must be [0,2,1,3].
  RedistPlan plan;
  plan.steps.push_back(step(StepKind::all_gather, m, {1, 0}, 0));
  CHECK(plan.steps[0].groups == Groups{{0, 2, 1, 3}});
  CHECK(prove_plan(m, {8, 4}, layout({{1, 0}, {}}), layout({{}, {}}), plan).ok());
  plan.steps[0].groups = {{0, 1, 2, 3}};  // what a sorted backend group would do
  CHECK_FALSE(prove_plan(m, {8, 4}, layout({{1, 0}, {}}), layout({{}, {}}), plan).ok());
}

TEST_CASE("simulate: the reference's full-rematerialization plan for ((x,y),None) -> ((y,x),None)",
          "[shard][simulate]") {
  Mesh m = mesh22();
  RedistPlan plan;
  plan.steps.push_back(step(StepKind::all_gather, m, {0, 1}, 0));
  plan.steps.push_back(step(StepKind::local_slice, m, {1, 0}, 0));
  CHECK(plan.steps[1].groups == Groups{{0, 2, 1, 3}});
  CHECK(prove_plan(m, {8, 4}, layout({{0, 1}, {}}), layout({{1, 0}, {}}), plan).ok());
}

TEST_CASE("simulate: HyperParallel's known-wrong plans give wrong data", "[shard][simulate]") {
  Mesh m = mesh22();
  SECTION("(None,x) -> ((x,y),None): split d0 by 4, AG d1 over x") {
    RedistPlan plan;
    plan.steps.push_back(step(StepKind::local_slice, m, {0, 1}, 0));
    plan.steps.push_back(step(StepKind::all_gather, m, {0}, 1));
    auto st = prove_plan(m, {8, 4}, layout({{}, {0}}), layout({{0, 1}, {}}), plan);
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().code == hp::Errc::mismatch);
  }
  SECTION("(None,(x,y)) -> (x,y): split d0 over x, AG d1 by 4, split d1 over y") {
    RedistPlan plan;
    plan.steps.push_back(step(StepKind::local_slice, m, {0}, 0));
    plan.steps.push_back(step(StepKind::all_gather, m, {0, 1}, 1));
    plan.steps.push_back(step(StepKind::local_slice, m, {1}, 1));
    auto st = prove_plan(m, {4, 8}, layout({{}, {0, 1}}), layout({{0}, {1}}), plan);
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().code == hp::Errc::mismatch);
  }
  SECTION("((x,y),None) -> (y,None) by all-gather over x") {
    RedistPlan plan;
    plan.steps.push_back(step(StepKind::all_gather, m, {0}, 0));
    CHECK_FALSE(prove_plan(m, {8, 4}, layout({{0, 1}, {}}), layout({{1}, {}}), plan).ok());
  }
}

TEST_CASE("simulate: all-to-all, reduce-scatter and permute semantics", "[shard][simulate]") {
  Mesh m = mesh22();
  RedistPlan a2a;
  a2a.steps.push_back(step(StepKind::all_to_all, m, {0}, 1, 0));  // (x,None) -> (None,x)
  CHECK(prove_plan(m, {4, 4}, layout({{0}, {}}), layout({{}, {0}}), a2a).ok());
  a2a.steps[0].concat_dim = 1;  // concatenated on the wrong dim
  CHECK_FALSE(prove_plan(m, {4, 4}, layout({{0}, {}}), layout({{}, {0}}), a2a).ok());

  RedistPlan rs;
  rs.steps.push_back(step(StepKind::reduce_scatter, m, {1}, 1));  // row-parallel output to (x,y)
  CHECK(
      prove_plan(m, {4, 4}, layout({{0}, {}}, {{1, ReduceOp::sum}}), layout({{0}, {1}}), rs).ok());

  // (x,None) -> (y,None): ranks 1 and 2 swap their blocks; 0 and 3 keep theirs.
  RedistPlan perm;
  RedistStep p;
  p.kind = StepKind::permute;
  p.groups = {{0, 1, 2, 3}};
  p.pairs = {{0, 0}, {2, 1}, {1, 2}, {3, 3}};
  perm.steps.push_back(p);
  CHECK(prove_plan(m, {4, 4}, layout({{0}, {}}), layout({{1}, {}}), perm).ok());
  // A rank in the group with no source gets zeros (hp_domain.h), which is wrong data here.
  perm.steps[0].pairs = {{2, 1}, {1, 2}};
  CHECK_FALSE(prove_plan(m, {4, 4}, layout({{0}, {}}), layout({{1}, {}}), perm).ok());
}

TEST_CASE("simulate: malformed plans are internal errors", "[shard][simulate]") {
  Mesh m = mesh22();
  RedistPlan plan;
  RedistStep s = step(StepKind::all_gather, m, {0}, 0);
  s.groups.pop_back();  // ranks 1 and 3 in no group
  plan.steps.push_back(s);
  auto st = prove_plan(m, {4, 4}, layout({{0}, {}}), layout({{}, {}}), plan);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().code == hp::Errc::internal);
  plan.steps[0] = step(StepKind::local_slice, m, {0, 1}, 0);  // 2 rows do not split 4 ways
  CHECK(prove_plan(m, {4, 4}, layout({{0}, {}}), layout({{}, {}}), plan).error().code ==
        hp::Errc::internal);
}
