// Topology: links between ranks, the effective link of a group, and collective costs checked
// against hand-computed values.
#include <catch2/catch.hpp>

#include <vector>

#include "hp/recipe/presets.h"
#include "hp/topology/collectives.h"
#include "hp/topology/topology.h"

using namespace hp;
using namespace hp::topology;

namespace {

Topology preset(const std::string& name, std::int64_t nodes) {
  auto c = recipe::load_cluster_ref(name, {}, recipe::preset_dirs({}, HP_SOURCE_DIR));
  if (!c) FAIL(c.error().str());
  auto scaled = recipe::scale_cluster(*c, nodes);
  if (!scaled) FAIL(scaled.error().str());
  auto t = Topology::from_cluster(*scaled);
  if (!t) FAIL(t.error().str());
  return *t;
}

Link must(Expected<Link> l) {
  if (!l) FAIL(l.error().str());
  return *l;
}

// A cluster built in code: nodes of g ranks, intra-node B_intra, inter-node B_inter, zero latency.
Topology two_tier(std::int64_t g, std::int64_t nodes, double intra, double inter,
                  double alpha = 0) {
  recipe::Cluster c;
  c.name = "test";
  c.nodes = nodes;
  c.rank_device = "gpu";
  recipe::DeviceType d;
  d.name = "gpu";
  d.kind = recipe::DeviceKind::gpu;
  d.per_node = g;
  d.memory = 1e9;
  d.memory_bandwidth = 1e12;
  d.peak_flops.fp32 = 1e12;
  c.device_types = {d};
  c.tiers = {{"node", g, intra, alpha}, {"scale-out", 0, inter, alpha}};
  auto t = Topology::from_cluster(c);
  if (!t) FAIL(t.error().str());
  return *t;
}

}  // namespace

TEST_CASE("topology: the link between two ranks is the innermost tier holding both", "[topology]") {
  Topology t = preset("dgx-h100", 4);
  CHECK(t.ranks() == 32);
  CHECK(t.node_of(9) == 1);
  Link l = must(t.link(0, 7));
  CHECK(l.tier == "node");
  CHECK(l.bandwidth == 450e9);
  CHECK(l.latency == Approx(3e-6));
  l = must(t.link(7, 8));
  CHECK(l.tier == "scale-out");
  CHECK(l.bandwidth == 50e9);
  l = must(t.link(3, 3));
  CHECK(l.tier == "self");
  CHECK(l.level == -1);
  CHECK(l.latency == 0);
  CHECK(!t.link(0, 32).ok());
  CHECK(!t.link(-1, 0).ok());
}

TEST_CASE("topology: CloudMatrix384 tiers die, node, supernode, scale-out", "[topology]") {
  Topology t = preset("cloudmatrix384", 96);  // two supernodes
  CHECK(t.ranks() == 1536);
  CHECK(must(t.link(0, 1)).tier == "die");
  CHECK(must(t.link(0, 1)).bandwidth == 270e9);
  CHECK(must(t.link(1, 2)).tier == "node");
  CHECK(must(t.link(1, 2)).bandwidth == 196e9);
  CHECK(must(t.link(15, 16)).tier == "supernode");
  CHECK(must(t.link(15, 16)).bandwidth == 190e9);
  CHECK(must(t.link(767, 768)).tier == "scale-out");
  CHECK(must(t.link(767, 768)).bandwidth == 25e9);
  CHECK(t.unit_of(767, 2) == 0);
  CHECK(t.unit_of(768, 2) == 1);
}

TEST_CASE("topology: a group's link is the slowest tier it spans", "[topology]") {
  Topology t = preset("dgx-h100", 2);
  std::vector<std::int64_t> tp_group{0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(must(t.group_link(tp_group)).tier == "node");
  std::vector<std::int64_t> dp_group{0, 8};
  CHECK(must(t.group_link(dp_group)).tier == "scale-out");
  std::vector<std::int64_t> mixed{6, 7, 8, 9};  // two ranks in each of two nodes
  Link l = must(t.group_link(mixed));
  CHECK(l.tier == "scale-out");
  CHECK(l.bandwidth == 50e9);
  CHECK(l.latency == Approx(5e-6));
  std::vector<std::int64_t> one{5};
  CHECK(must(t.group_link(one)).tier == "self");
  std::vector<std::int64_t> dup{1, 1};
  CHECK(!t.group_link(dup).ok());
  CHECK(!t.group_link({}).ok());
}

TEST_CASE("topology: an inner tier slower than an outer one bounds the group", "[topology]") {
  recipe::Cluster c;
  c.name = "odd";
  c.rank_device = "x";
  recipe::DeviceType d;
  d.name = "x";
  d.per_node = 4;
  d.memory = 1;
  d.peak_flops.fp32 = 1;
  c.device_types = {d};
  c.tiers = {{"pair", 2, 10e9, 1e-6}, {"node", 4, 100e9, 2e-6}};
  auto t = Topology::from_cluster(c);
  REQUIRE(t.ok());
  Link l = must(t->link(0, 3));
  CHECK(l.tier == "node");
  CHECK(l.bandwidth == 10e9);  // the pair link is on the way
  CHECK(l.latency == 2e-6);
}

TEST_CASE("topology: an invalid cluster is refused", "[topology]") {
  recipe::Cluster c;
  c.name = "bad";
  auto t = Topology::from_cluster(c);
  REQUIRE(!t.ok());
  CHECK(t.error().code == Errc::bad_input);
}

TEST_CASE("collectives: alpha-beta costs match hand-computed values", "[topology]") {
  Link nv{"node", 0, 450e9, 3e-6};
  // Ring all-reduce of 1 GB over 8 ranks: 2*7/8 * 1e9/450e9 + 14 * 3e-6.
  CHECK(all_reduce_time(nv, 8, 1e9) == Approx(2.0 * 7 / 8 * 1e9 / 450e9 + 14 * 3e-6));
  CHECK(all_reduce_time(nv, 8, 1e9) == Approx(3.930889e-3));
  Link ib{"scale-out", 1, 50e9, 5e-6};
  // All-gather of a 1 GB result over 4 ranks: 3/4 * 1e9/50e9 + 3 * 5e-6 = 15.015 ms.
  CHECK(all_gather_time(ib, 4, 1e9) == Approx(0.015015));
  CHECK(reduce_scatter_time(ib, 4, 1e9) == Approx(0.015015));
  // All-to-all, 256 MB per rank over 8 ranks: 7/8 * 2.56e8/50e9 + 7 * 5e-6 = 4.515 ms.
  CHECK(all_to_all_time(ib, 8, 2.56e8) == Approx(4.515e-3));
  // Send/recv of 100 MB: 1e8/50e9 + 5e-6 = 2.005 ms.
  CHECK(send_recv_time(ib, 1e8) == Approx(2.005e-3));
  // Broadcast of 1 GB to 8 ranks: 1e9/50e9 + 3 * 5e-6.
  CHECK(broadcast_time(ib, 8, 1e9) == Approx(0.020015));
  CHECK(broadcast_time(ib, 5, 1e9) == Approx(0.02 + 3 * 5e-6));
  // Nothing to do for one rank.
  CHECK(all_reduce_time(nv, 1, 1e9) == 0);
  CHECK(all_gather_time(nv, 1, 1e9) == 0);
  CHECK(all_to_all_time(nv, 1, 1e9) == 0);
  CHECK(broadcast_time(nv, 1, 1e9) == 0);
}

TEST_CASE("collectives: worked example, flat ring vs hierarchical", "[topology]") {
  // S = 1 GB, g = 8 per node, N = 32 ranks, B_intra = 150 GB/s, B_inter = 25 GB/s, no latency.
  Topology t = two_tier(8, 4, 150e9, 25e9);
  std::vector<std::int64_t> all(32);
  for (int i = 0; i < 32; ++i) all[static_cast<std::size_t>(i)] = i;
  Link flat = must(t.group_link(all));
  CHECK(flat.bandwidth == 25e9);
  CHECK(all_reduce_time(flat, 32, 1e9) == Approx(0.0775));  // 77.5 ms
  std::vector<std::int64_t> node0{0, 1, 2, 3, 4, 5, 6, 7};
  Link inner = must(t.group_link(node0));
  CHECK(reduce_scatter_time(inner, 8, 1e9) == Approx(5.8333e-3));  // 5.83 ms
  // The reference computes the inter-node step at the per-GPU bandwidth: 2*3/4 * (1e9/8)/25e9 = 7.5
  // ms.
  CHECK(all_reduce_time(flat, 4, 1e9 / 8) == Approx(7.5e-3));
  CHECK(hierarchical_all_reduce_time(inner, flat, 8, 4, 1e9) ==
        Approx(0.0191667).epsilon(1e-4));  // 19.2 ms
}
