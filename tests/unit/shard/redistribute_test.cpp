// Redistribution plans: the "Verified plans" of docs/shard.md (kinds, axes, dims, ordered groups),
// the cases HyperParallel gets wrong, partial resolution ("Partial state"), byte counts
// ("Redistribution cost"), and the property test: every pair of layouts of small tensors on meshes
// of up to 8 ranks, and random larger cases, each plan proven by the data-movement simulator.
#include <catch2/catch.hpp>

#include <functional>
#include <random>
#include <set>

#include "hp/shard/redistribute.h"
#include "hp/shard/simulate.h"

using namespace hp::shard;
using Groups = std::vector<std::vector<std::int64_t>>;

namespace {

Mesh make_mesh(std::vector<std::int64_t> dims, std::vector<std::string> axes,
               std::vector<std::int64_t> ranks = {}) {
  auto m = Mesh::make(std::move(dims), std::move(axes), std::move(ranks));
  REQUIRE(m.ok());
  return *m;
}

Sharding L(std::vector<std::vector<int>> dims, std::vector<PartialAxis> partial = {}) {
  return Sharding{std::move(dims), std::move(partial)};
}

/// Plans and proves; every plan a test looks at is also checked by the simulator.
RedistPlan plan(const Mesh& m, const Sharding& from, const Sharding& to,
                std::vector<std::int64_t> shape) {
  auto p = plan_redistribution(m, from, to, shape, 4);
  INFO(format_sharding(m, from) << " -> " << format_sharding(m, to));
  REQUIRE(p.ok());
  auto proof = prove_plan(m, shape, from, to, *p);
  INFO(p->describe(m));
  if (!proof.ok()) FAIL(proof.error().message());
  return *p;
}

void check_step(const RedistStep& s, StepKind kind, std::vector<int> axes, int dim, Groups groups,
                int concat_dim = -1) {
  CHECK(step_kind_name(s.kind) == std::string(step_kind_name(kind)));
  CHECK(s.axes == axes);
  CHECK(s.dim == dim);
  CHECK(s.concat_dim == concat_dim);
  CHECK(s.groups == groups);
}

const Groups kOverX{{0, 2}, {1, 3}}, kOverY{{0, 1}, {2, 3}};

}  // namespace

TEST_CASE("redistribute: verified plans on mesh (2,2)", "[shard][redistribute]") {
  Mesh m = make_mesh({2, 2}, {"x", "y"});
  SECTION("(x,y) -> (None,None)") {
    RedistPlan p = plan(m, L({{0}, {1}}), L({{}, {}}), {4, 4});
    REQUIRE(p.steps.size() == 2);
    check_step(p.steps[0], StepKind::all_gather, {0}, 0, kOverX);
    check_step(p.steps[1], StepKind::all_gather, {1}, 1, kOverY);
    CHECK_FALSE(p.full_rematerialization);  // the target itself is replicated
  }
  SECTION("(x,None) -> (None,x): one all-to-all") {
    RedistPlan p = plan(m, L({{0}, {}}), L({{}, {0}}), {4, 4});
    REQUIRE(p.steps.size() == 1);
    check_step(p.steps[0], StepKind::all_to_all, {0}, 1, kOverX, 0);
  }
  SECTION("(x,y) -> (y,x)") {
    RedistPlan p = plan(m, L({{0}, {1}}), L({{1}, {0}}), {4, 4});
    REQUIRE(p.steps.size() == 3);
    check_step(p.steps[0], StepKind::all_gather, {0}, 0, kOverX);
    check_step(p.steps[1], StepKind::all_to_all, {1}, 0, kOverY, 1);
    check_step(p.steps[2], StepKind::local_slice, {0}, 1, kOverX);
  }
  SECTION("(x,None) -> ((x,y),None): a local split") {
    RedistPlan p = plan(m, L({{0}, {}}), L({{0, 1}, {}}), {8, 4});
    REQUIRE(p.steps.size() == 1);
    check_step(p.steps[0], StepKind::local_slice, {1}, 0, kOverY);
  }
  SECTION("((x,y),None) -> (x,None): gather the minor axis") {
    RedistPlan p = plan(m, L({{0, 1}, {}}), L({{0}, {}}), {8, 4});
    REQUIRE(p.steps.size() == 1);
    check_step(p.steps[0], StepKind::all_gather, {1}, 0, kOverY);
  }
  SECTION("(x,None) -> (None,y): slice before gathering") {
    RedistPlan p = plan(m, L({{0}, {}}), L({{}, {1}}), {4, 4});
    REQUIRE(p.steps.size() == 2);
    check_step(p.steps[0], StepKind::local_slice, {1}, 1, kOverY);
    check_step(p.steps[1], StepKind::all_gather, {0}, 0, kOverX);
  }
  SECTION("((x,y),None) -> ((y,x),None): one permute instead of the reference's gather + split") {
    // The reference plan (AG over [0,1,2,3], split in order [0,2,1,3]) is proven in simulate_test;
    // hp moves each block once: ranks 1 and 2 swap, 0 and 3 keep theirs.
    RedistPlan p = plan(m, L({{0, 1}, {}}), L({{1, 0}, {}}), {8, 4});
    REQUIRE(p.steps.size() == 1);
    CHECK(p.steps[0].kind == StepKind::permute);
    CHECK(p.steps[0].pairs ==
          std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 0}, {2, 1}, {1, 2}, {3, 3}});
    CHECK(p.steps[0].groups == Groups{{0, 1, 2, 3}});
    CHECK_FALSE(p.full_rematerialization);
  }
  SECTION("((y,x),None) -> (None,None) gathers in member order [0,2,1,3]") {
    RedistPlan p = plan(m, L({{1, 0}, {}}), L({{}, {}}), {8, 4});
    REQUIRE(p.steps.size() == 1);
    check_step(p.steps[0], StepKind::all_gather, {1, 0}, 0, Groups{{0, 2, 1, 3}});
  }
}

TEST_CASE("redistribute: mesh (2,4) (None,mp) -> (mp,None) is one all-to-all",
          "[shard][redistribute]") {
  Mesh m = make_mesh({2, 4}, {"dp", "mp"});
  RedistPlan p = plan(m, L({{}, {1}}), L({{1}, {}}), {8, 8});
  REQUIRE(p.steps.size() == 1);
  check_step(p.steps[0], StepKind::all_to_all, {1}, 0, Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}, 1);
}

TEST_CASE("redistribute: the cases HyperParallel plans wrongly", "[shard][redistribute]") {
  Mesh m = make_mesh({2, 2}, {"x", "y"});
  SECTION("(None,x) -> ((x,y),None): all-to-all over x, then split d0 over y") {
    RedistPlan p = plan(m, L({{}, {0}}), L({{0, 1}, {}}), {8, 4});
    REQUIRE(p.steps.size() == 2);
    check_step(p.steps[0], StepKind::all_to_all, {0}, 0, kOverX, 1);
    check_step(p.steps[1], StepKind::local_slice, {1}, 0, kOverY);
  }
  SECTION("(None,(x,y)) -> (x,y): AG d1 over y, all-to-all over x, split d1 over y") {
    RedistPlan p = plan(m, L({{}, {0, 1}}), L({{0}, {1}}), {4, 8});
    REQUIRE(p.steps.size() == 3);
    check_step(p.steps[0], StepKind::all_gather, {1}, 1, kOverY);
    check_step(p.steps[1], StepKind::all_to_all, {0}, 0, kOverX, 1);
    check_step(p.steps[2], StepKind::local_slice, {1}, 1, kOverY);
    CHECK_FALSE(p.full_rematerialization);
  }
  SECTION("((x,y),None) -> (y,None) never gathers over x alone") {
    RedistPlan p = plan(m, L({{0, 1}, {}}), L({{1}, {}}), {8, 4});
    for (const RedistStep& s : p.steps)
      CHECK_FALSE((s.kind == StepKind::all_gather && s.axes == std::vector<int>{0}));
    // Gather the minor axis y (contiguous blocks), giving (x,None); then move each block once to
    // (y,None) rather than gathering the whole tensor and slicing it again.
    REQUIRE(p.steps.size() == 2);
    check_step(p.steps[0], StepKind::all_gather, {1}, 0, kOverY);
    CHECK(p.steps[1].kind == StepKind::permute);
    CHECK(p.steps[1].pairs ==
          std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 0}, {2, 1}, {1, 2}, {3, 3}});
    CHECK_FALSE(p.full_rematerialization);
  }
}

TEST_CASE("redistribute: partial sums (row-parallel output)", "[shard][redistribute]") {
  Mesh m = make_mesh({2, 2}, {"dp", "mp"});
  Sharding row = L({{0}, {}}, {{1, ReduceOp::sum}});
  SECTION("to (dp,None): all-reduce over mp") {
    RedistPlan p = plan(m, row, L({{0}, {}}), {4, 4});
    REQUIRE(p.steps.size() == 1);
    check_step(p.steps[0], StepKind::all_reduce, {1}, -1, kOverY);
    CHECK(p.steps[0].bytes == 2 * 4 * 4);  // AR: n = the local buffer L
  }
  SECTION("to ((dp,mp),None): reduce-scatter on dim 0") {
    RedistPlan p = plan(m, row, L({{0, 1}, {}}), {4, 4});
    REQUIRE(p.steps.size() == 1);
    check_step(p.steps[0], StepKind::reduce_scatter, {1}, 0, kOverY);
    CHECK(p.steps[0].bytes == 2 * 4 * 4);  // RS: n = input bytes
  }
  SECTION("to (dp,mp): reduce-scatter on dim 1") {
    RedistPlan p = plan(m, row, L({{0}, {1}}), {4, 4});
    REQUIRE(p.steps.size() == 1);
    check_step(p.steps[0], StepKind::reduce_scatter, {1}, 1, kOverY);
  }
  SECTION("keeping a partial axis, resolving another (avg: sum / n)") {
    Sharding both = L({{}, {}}, {{0, ReduceOp::avg}, {1, ReduceOp::avg}});
    RedistPlan p = plan(m, both, L({{}, {}}, {{0, ReduceOp::avg}}), {4, 4});
    REQUIRE(p.steps.size() == 1);
    CHECK(p.steps[0].kind == StepKind::all_reduce);
    CHECK(p.steps[0].op == ReduceOp::avg);
  }
  SECTION("partials resolve ReduceScatters first, then right-most mesh axis first") {
    Mesh m3 = make_mesh({2, 2, 2}, {"a", "b", "c"});
    Sharding p3 = L({{}, {}}, {{0, ReduceOp::sum}, {1, ReduceOp::sum}, {2, ReduceOp::sum}});
    RedistPlan p = plan(m3, p3, L({{1}, {}}), {4, 4});
    REQUIRE(p.steps.size() == 3);
    CHECK(p.steps[0].kind == StepKind::reduce_scatter);
    CHECK(p.steps[0].axes == std::vector<int>{1});
    CHECK(p.steps[1].axes == std::vector<int>{2});
    CHECK(p.steps[2].axes == std::vector<int>{0});
  }
}

TEST_CASE("redistribute: partials created from replicated values", "[shard][redistribute]") {
  Mesh m = make_mesh({2, 2}, {"x", "y"});
  // sum: coordinate 0 of y keeps its copy (ranks 0 and 2), ranks 1 and 3 get zeros; nothing moves.
  RedistPlan sum = plan(m, L({{0}, {}}), L({{0}, {}}, {{1, ReduceOp::sum}}), {4, 4});
  REQUIRE(sum.steps.size() == 1);
  CHECK(sum.steps[0].kind == StepKind::permute);
  CHECK(sum.steps[0].pairs == std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 0}, {2, 2}});
  CHECK(sum.describe(m).find("ranks without a pair zero their copy") != std::string::npos);
  // avg and max of equal copies are the copy: a relabelling, no step.
  CHECK(plan(m, L({{0}, {}}), L({{0}, {}}, {{1, ReduceOp::avg}}), {4, 4}).steps.empty());
  CHECK(plan(m, L({{0}, {1}}), L({{}, {0}}, {{1, ReduceOp::max}}), {4, 4}).steps.size() == 2);
  // A partial(sum) source changing its op: all-reduce, then the new partial is a relabelling.
  RedistPlan change =
      plan(m, L({{}, {}}, {{1, ReduceOp::sum}}), L({{}, {}}, {{1, ReduceOp::max}}), {4, 4});
  REQUIRE(change.steps.size() == 1);
  CHECK(change.steps[0].kind == StepKind::all_reduce);
}

TEST_CASE("redistribute: bytes per step are the alpha-beta n", "[shard][redistribute]") {
  Mesh m = make_mesh({2, 2}, {"x", "y"});
  RedistPlan g = plan(m, L({{0}, {1}}), L({{}, {}}), {4, 4});
  CHECK(g.steps[0].bytes == 2 * (2 * 2 * 4));  // AG: output bytes = p * L
  CHECK(g.steps[1].bytes == 2 * (4 * 2 * 4));
  RedistPlan a = plan(m, L({{0}, {}}), L({{}, {0}}), {4, 4});
  CHECK(a.steps[0].bytes == 2 * 4 * 4);  // A2A: the local send buffer
  RedistPlan s = plan(m, L({{0}, {}}), L({{0, 1}, {}}), {8, 4});
  CHECK(s.steps[0].bytes == 0);  // a local split moves nothing
}

TEST_CASE("redistribute: errors", "[shard][redistribute]") {
  Mesh m = make_mesh({2, 2}, {"x", "y"});
  auto indivisible = plan_redistribution(m, L({{0}, {}}), L({{}, {}}), {5, 4}, 4);
  REQUIRE_FALSE(indivisible.ok());
  CHECK(indivisible.error().code == hp::Errc::bad_input);
  auto create =
      plan_redistribution(m, L({{0}, {}}), L({{0}, {}}, {{1, ReduceOp::prod}}), {4, 4}, 4);
  REQUIRE_FALSE(create.ok());
  CHECK(create.error().message() ==
        "redistribute: cannot create partial(prod) over 'y'; only sum, avg, max and "
        "min partials can be made from replicated values");
  auto mixed = plan_redistribution(m, L({{}, {}}, {{0, ReduceOp::sum}, {1, ReduceOp::max}}),
                                   L({{}, {}}), {4, 4}, 4);
  REQUIRE_FALSE(mixed.ok());
  CHECK(mixed.error().code == hp::Errc::bad_input);
  auto same = plan_redistribution(m, L({{0}, {1}}), L({{0}, {1}}), {4, 4}, 4);
  REQUIRE(same.ok());
  CHECK(same->steps.empty());
  CHECK(same->describe(m) == "no communication: the layouts agree\n");
}

TEST_CASE("redistribute: describe reports a full rematerialization", "[shard][redistribute]") {
  Mesh m = make_mesh({2, 2}, {"x", "y"});
  RedistPlan p = plan(m, L({{0}, {}}), L({{}, {}}), {4, 4});
  CHECK(p.describe(m).find("replicates") == std::string::npos);
  p.full_rematerialization = true;
  CHECK(p.describe(m).find("note: the plan replicates the whole tensor before slicing it again") !=
        std::string::npos);
}

TEST_CASE("redistribute: describe prints one line per step", "[shard][redistribute]") {
  Mesh m = make_mesh({2, 2}, {"x", "y"});
  RedistPlan p = plan(m, L({{0}, {1}}), L({{1}, {0}}), {4, 4});
  CHECK(p.describe(m) ==
        "1. all_gather over x on dim 0: (x, y) -> (None, y); groups [0,2] [1,3]; 32 B per rank\n"
        "2. all_to_all over y: split dim 0, concat dim 1: (None, y) -> (y, None); groups [0,1] "
        "[2,3]; 32 B per rank\n"
        "3. local_slice over x on dim 1: (y, None) -> (y, x); groups [0,2] [1,3]; 0 B per rank\n");
}
