// The node-level offload schedule (the policy `hp launch` replays on a rank's executor): replaying
// its moves keeps every node under the budget with every tensor a node reads on the device;
// eviction is Belady (furthest next use first); activations are written back once; a budget below a
// node's own need is infeasible and names the node and the need.
#include <catch2/catch.hpp>

#include <set>

#include "hp/offload/node_schedule.h"

using namespace hp::offload;

namespace {

// A chain of `layers` nodes, each reading its own 100-byte weight and the previous node's 10-byte
// activation; node 0 also writes an activation read again by the last node (a long-lived residual).
NodeTrace chain(int layers) {
  NodeTrace tr;
  tr.base.assign(static_cast<std::size_t>(layers), 5.0);
  for (int k = 0; k < layers; ++k) {
    tr.tensors.push_back({"w" + std::to_string(k), 100, -1, k, {k}, false});
    if (k + 1 < layers)
      tr.tensors.push_back({"a" + std::to_string(k), 10, k, k + 1, {k + 1}, true});
  }
  tr.tensors.push_back({"residual", 50, 0, layers - 1, {layers - 1}, true});
  return tr;
}

// Replays the schedule independently: residency, on-host copies, memory per node.
void replay(const NodeTrace& tr, const NodeSchedule& s, double budget) {
  std::set<std::size_t> res, host;
  for (std::size_t t = 0; t < tr.tensors.size(); ++t)
    if (tr.tensors[t].created < 0) host.insert(t);
  for (std::size_t k = 0; k < tr.base.size(); ++k) {
    for (const NodeMove& m : s.before[k]) {
      if (m.to_device) {
        REQUIRE(host.count(m.tensor));
        res.insert(m.tensor);
      } else {
        REQUIRE(res.count(m.tensor));
        if (m.writeback) host.insert(m.tensor);
        if (tr.tensors[m.tensor].dirty) REQUIRE(host.count(m.tensor));
        res.erase(m.tensor);
      }
    }
    double mem = tr.base[k];
    for (std::size_t t = 0; t < tr.tensors.size(); ++t) {
      const NodeTensor& x = tr.tensors[t];
      if (x.created == static_cast<std::int64_t>(k)) res.insert(t);
      for (auto u : x.uses)
        if (u == static_cast<std::int64_t>(k)) REQUIRE(res.count(t));
    }
    for (std::size_t t : res) mem += tr.tensors[t].bytes;
    CHECK(mem <= budget);
    CHECK(mem == Approx(s.memory[k]));
    for (std::size_t t = 0; t < tr.tensors.size(); ++t)
      if (tr.tensors[t].last <= static_cast<std::int64_t>(k)) res.erase(t);
  }
}

}  // namespace

TEST_CASE("offload node schedule: a budget above the peak moves each weight in once",
          "[offload][node]") {
  NodeTrace tr = chain(6);
  auto s = plan_node_offload(tr, 1e9, 1);
  REQUIRE(s.ok());
  CHECK(s->evictions == 0);
  CHECK(s->fetches == 6);
  CHECK(s->fetched_bytes == 600);
  replay(tr, *s, 1e9);
}

TEST_CASE("offload node schedule: below the un-offloaded peak every node stays under the budget",
          "[offload][node]") {
  NodeTrace tr = chain(6);
  auto loose = plan_node_offload(tr, 1e9, 0);
  REQUIRE(loose.ok());
  // Without offload all six weights sit on the device: 5 + 600 + residual 50 + one or two
  // activations.
  CHECK(loose->unplanned_peak >= 655);
  const double budget = 5 + 100 + 100 + 50 + 10 + 10;  // room for two weights beside the rest
  auto s = plan_node_offload(tr, budget, 2);
  REQUIRE(s.ok());
  CHECK(s->peak_bytes <= budget);
  CHECK(s->peak_bytes < s->unplanned_peak);
  CHECK(s->prefetches > 0);  // the next weight comes in while the current node runs
  CHECK(s->max_lookahead == 1);
  replay(tr, *s, budget);
}

TEST_CASE("offload node schedule: the residual is evicted (written back once) before the weights",
          "[offload][node]") {
  NodeTrace tr = chain(6);
  const double budget =
      5 + 100 + 10 + 50;  // node 0's own need: one weight at a time, no room for the residual
  auto s = plan_node_offload(tr, budget, 1);
  REQUIRE(s.ok());
  CHECK(s->writebacks == 1);
  CHECK(s->written_bytes == 50);
  replay(tr, *s, budget);
  // Belady: the residual (next used at the last node) goes before anything used sooner.
  bool first_eviction_is_residual = false;
  for (const auto& moves : s->before)
    for (const NodeMove& m : moves)
      if (!m.to_device) {
        first_eviction_is_residual = tr.tensors[m.tensor].name == "residual";
        goto done;
      }
done:
  CHECK(first_eviction_is_residual);
}

TEST_CASE(
    "offload node schedule: a budget below one node's own need is infeasible and says the need",
    "[offload][node]") {
  NodeTrace tr = chain(4);
  tr.node_names = {"mm0", "mm1", "mm2", "mm3"};
  auto s = plan_node_offload(tr, 100, 1);
  REQUIRE(!s.ok());
  CHECK(s.error().code == hp::Errc::infeasible);
  CHECK_THAT(s.error().message(),
             Catch::Contains("node 'mm0'") && Catch::Contains("100 B") && Catch::Contains("needs"));
}

TEST_CASE("offload node schedule: a malformed trace is an internal error, not a crash",
          "[offload][node]") {
  NodeTrace tr;
  tr.base = {0, 0};
  tr.tensors.push_back({"x", 8, 1, 1, {0}, true});  // read before it is written
  auto s = plan_node_offload(tr, 100, 1);
  REQUIRE(!s.ok());
  CHECK(s.error().code == hp::Errc::internal);
}
