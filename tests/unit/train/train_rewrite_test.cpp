// hoist_shape_reads (libs/train/src/rewrite.cpp), on node lists built here: every backward Shape
// node moves next to what it reads (into the forward part for a forward tensor), a Shape of a moved
// Shape follows it, no node is lost and every node still comes after what it reads.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <map>
#include <set>
#include <string>

#include "rewrite.h"

namespace {

void add(onnx::GraphProto& g, const std::string& op, const std::string& in,
         const std::string& out) {
  auto* n = g.add_node();
  n->set_op_type(op);
  if (!in.empty()) n->add_input(in);
  n->add_output(out);
}

std::map<std::string, int> positions(const onnx::GraphProto& g) {
  std::map<std::string, int> at;
  for (int k = 0; k < g.node_size(); ++k) at[g.node(k).output(0)] = k;
  return at;
}

}  // namespace

TEST_CASE("backward Shape nodes move next to what they read, Shapes of Shapes included",
          "[train]") {
  onnx::GraphProto g;
  add(g, "Relu", "x", "f1");  // forward: 2 nodes
  add(g, "Neg", "f1", "f2");
  add(g, "Neg", "f2", "b1");  // backward from here
  add(g, "Relu", "b1", "b2");
  add(g, "Neg", "b2", "b3");
  add(g, "Shape", "f1", "s_f1");  // a forward tensor's shape: into the forward, after f1
  add(g, "Shape", "b1", "s_b1");  // a backward tensor's: after b1
  add(g, "Neg", "b3", "b4");
  add(g, "Shape", "s_b1", "s_s");  // a Shape of a moved Shape: after it, not lost
  add(g, "Shape", "b4", "s_b4");   // already next to its producer: stays
  const int nodes = g.node_size();
  const int forward = hp::train::detail::hoist_shape_reads(g, 2);
  CHECK(forward == 3);  // the forward's two nodes and Shape(f1)
  REQUIRE(g.node_size() == nodes);
  auto at = positions(g);
  CHECK(at.at("s_f1") == at.at("f1") + 1);
  CHECK(at.at("s_b1") == at.at("b1") + 1);
  CHECK(at.at("s_s") == at.at("s_b1") + 1);
  CHECK(at.at("s_b4") == at.at("b4") + 1);
  // Every node after what it reads (x is the graph input).
  for (int k = 0; k < g.node_size(); ++k)
    for (const auto& in : g.node(k).input())
      if (in != "x") CHECK(at.at(in) < k);
}
