// The graph index the expert-layer search works on (expert_parallel.cpp, expert_route.cpp):
// producers, readers, initializers and integer constants of one graph.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph_parts.h"
#include "hp/train/expert_parallel.h"

namespace hp::train::detail {

inline std::vector<std::int64_t> tensor_ints(const onnx::TensorProto& t) {
  std::vector<std::int64_t> v(t.int64_data().begin(), t.int64_data().end());
  if (v.empty() && t.data_type() == onnx::TensorProto::INT64 && t.raw_data().size() % 8 == 0) {
    v.resize(t.raw_data().size() / 8);
    if (!v.empty()) std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
  }
  return v;
}

/// Integer attribute `name` of `n`, or `dflt`.
inline std::int64_t attr_int(const onnx::NodeProto& n, const char* name, std::int64_t dflt) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return dflt;
}

/// What the search needs to know of a graph: producers, readers, initializers, constant values.
struct Index {
  const onnx::GraphProto& g;
  std::map<std::string, int> producer;
  std::map<std::string, std::vector<int>> readers;
  std::map<std::string, const onnx::TensorProto*> inits;
  std::set<std::string> graph_outputs;

  explicit Index(const onnx::GraphProto& graph) : g(graph) {
    for (int k = 0; k < g.node_size(); ++k) {
      for (const auto& o : g.node(k).output())
        if (!o.empty()) producer[o] = k;
      for (const auto& i : g.node(k).input())
        if (!i.empty()) readers[i].push_back(k);
    }
    for (const auto& t : g.initializer()) inits[t.name()] = &t;
    for (const auto& o : g.output()) graph_outputs.insert(o.name());
  }
  /// An integer constant's values (an initializer or a Constant node's output).
  std::optional<std::vector<std::int64_t>> ints(const std::string& t) const {
    if (auto it = inits.find(t); it != inits.end()) return tensor_ints(*it->second);
    auto p = producer.find(t);
    if (p == producer.end() || g.node(p->second).op_type() != "Constant") return std::nullopt;
    for (const auto& a : g.node(p->second).attribute())
      if (a.name() == "value") return tensor_ints(a.t());
    return std::nullopt;
  }
  bool constant(const std::string& t) const {
    if (auto it = inits.find(t); it != inits.end())
      return !detail::is_float_type(it->second->data_type());
    auto p = producer.find(t);
    return p != producer.end() && g.node(p->second).op_type() == "Constant";
  }
  /// Every node `t` depends on; with `values_only`, not through a Shape node's input (a Shape
  /// depends on its input's shape, not its values).
  std::set<int> ancestors(const std::string& t, bool values_only = false) const {
    std::set<int> seen;
    std::vector<std::string> todo{t};
    while (!todo.empty()) {
      const std::string x = todo.back();
      todo.pop_back();
      auto p = producer.find(x);
      if (p == producer.end() || !seen.insert(p->second).second) continue;
      if (values_only && g.node(p->second).op_type() == "Shape") continue;
      for (const auto& i : g.node(p->second).input())
        if (!i.empty()) todo.push_back(i);
    }
    return seen;
  }
};

/// The top-k indices that route layer `l`'s tokens, when dispatching each token only to the experts
/// they name computes what the export computes (expert_route.cpp); "" otherwise.
std::string routed_indices(const Index& ix, const ExpertLayer& l);

}  // namespace hp::train::detail
