// Alpha-beta cost of redistribution plans against the formulas of docs/shard.md, "Redistribution
// cost", on a two-tier cluster built in code (2 ranks per node: groups inside a node use the node
// tier, others the scale-out tier).
#include <catch2/catch.hpp>

#include <cmath>

#include "hp/shard/shard_cost.h"

using namespace hp;
using namespace hp::shard;

namespace {

constexpr double kIntraBw = 100e9, kInterBw = 10e9, kIntraLat = 2e-6, kInterLat = 10e-6;

topology::Topology cluster(std::int64_t nodes) {
  recipe::Cluster c;
  c.name = "test";
  c.nodes = nodes;
  c.rank_device = "gpu";
  recipe::DeviceType d;
  d.name = "gpu";
  d.kind = recipe::DeviceKind::gpu;
  d.per_node = 2;
  d.memory = 1e9;
  d.memory_bandwidth = 1e12;
  d.peak_flops.fp32 = 1e12;
  c.device_types = {d};
  c.tiers = {{"node", 2, kIntraBw, kIntraLat}, {"scale-out", 0, kInterBw, kInterLat}};
  auto t = topology::Topology::from_cluster(c);
  if (!t) FAIL(t.error().str());
  return *t;
}

Mesh mesh22() {
  auto m = Mesh::make({2, 2}, {"x", "y"});
  REQUIRE(m.ok());
  return *m;
}

RedistPlan plan(const Mesh& m, Sharding from, Sharding to, std::vector<std::int64_t> shape) {
  auto p = plan_redistribution(m, from, to, shape, 4);
  REQUIRE(p.ok());
  return *p;
}

}  // namespace

TEST_CASE("shard cost: all-gathers inside and across nodes", "[shard][cost]") {
  topology::Topology t = cluster(2);
  Mesh m = mesh22();
  // (x,y) -> (None,None): AG over x ([0,2]: across nodes, n = 32 B), then over y ([0,1]: in a node,
  // 64 B).
  RedistPlan p = plan(m, {{{0}, {1}}, {}}, {{{}, {}}, {}}, {4, 4});
  auto c = plan_cost(t, p);
  REQUIRE(c.ok());
  REQUIRE(c->step_seconds.size() == 2);
  CHECK(c->step_seconds[0] == Approx(kInterLat + 0.5 * 32 / kInterBw));
  CHECK(c->step_seconds[1] == Approx(kIntraLat + 0.5 * 64 / kIntraBw));
  CHECK(c->seconds == Approx(c->step_seconds[0] + c->step_seconds[1]));
}

TEST_CASE("shard cost: reductions include gamma; all-reduce ring and recursive doubling",
          "[shard][cost]") {
  topology::Topology t = cluster(2);
  Mesh m = mesh22();
  Sharding partial{{{}, {}}, {{0, ReduceOp::sum}, {1, ReduceOp::sum}}};
  const double gamma = 1e-12;
  // To (y,None): reduce-scatter over y (in a node, n = 64 B), then all-reduce over x (across, n =
  // 32 B).
  RedistPlan p = plan(m, partial, {{{1}, {}}, {}}, {4, 4});
  REQUIRE(p.steps.size() == 2);
  REQUIRE(p.steps[1].kind == StepKind::all_reduce);
  auto ring = plan_cost(t, p, {gamma, AllReduceAlgo::ring});
  REQUIRE(ring.ok());
  CHECK(ring->step_seconds[0] == Approx(kIntraLat + 0.5 * 64 * (1 / kIntraBw + gamma)));
  CHECK(ring->step_seconds[1] ==
        Approx(2 * kInterLat + 2 * 0.5 * 32 / kInterBw + 0.5 * 32 * gamma));
  auto rd = plan_cost(t, p, {gamma, AllReduceAlgo::recursive_doubling});
  REQUIRE(rd.ok());
  CHECK(rd->step_seconds[1] == Approx(1 * (kInterLat + 32 / kInterBw + 32 * gamma)));
  auto best = plan_cost(t, p, {gamma, AllReduceAlgo::best});
  REQUIRE(best.ok());
  CHECK(best->step_seconds[1] == Approx(std::min(ring->step_seconds[1], rd->step_seconds[1])));
  // Default gamma: 3 / memory bandwidth of the rank device.
  auto derived = step_time(t, p.steps[0]);
  REQUIRE(derived.ok());
  CHECK(*derived == Approx(kIntraLat + 0.5 * 64 * (1 / kIntraBw + 3 / 1e12)));
}

TEST_CASE("shard cost: all-to-all, permute and local slices", "[shard][cost]") {
  topology::Topology t = cluster(2);
  Mesh m = mesh22();
  RedistPlan a2a =
      plan(m, {{{0}, {}}, {}}, {{{}, {0}}, {}}, {4, 4});  // over x: across nodes, n = 32 B
  CHECK(*step_time(t, a2a.steps[0]) == Approx(kInterLat + 0.5 * 32 / kInterBw));
  RedistPlan perm =
      plan(m, {{{0, 1}, {}}, {}}, {{{1, 0}, {}}, {}}, {8, 4});  // ranks 1 <-> 2 swap 32 B
  REQUIRE(perm.steps[0].kind == StepKind::permute);
  CHECK(*step_time(t, perm.steps[0]) == Approx(kInterLat + 32 / kInterBw));
  RedistPlan slice = plan(m, {{{0}, {}}, {}}, {{{0, 1}, {}}, {}}, {8, 4});
  CHECK(*step_time(t, slice.steps[0]) == 0.0);
}

TEST_CASE("shard cost: a group outside the cluster is an error", "[shard][cost]") {
  topology::Topology t = cluster(1);  // 2 ranks, the mesh has 4
  Mesh m = mesh22();
  RedistPlan p = plan(m, {{{0}, {1}}, {}}, {{{}, {}}, {}}, {4, 4});
  auto c = plan_cost(t, p);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().code == Errc::bad_input);
}
