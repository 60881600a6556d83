// Expert layers and one member's expert-parallel partition (hp/train/expert_parallel.h).
#include "hp/train/expert_parallel.h"

#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "graph_parts.h"
#include "hp/core/hp_domain.h"

namespace hp::train {

namespace {

namespace dom = hp::domain;

std::vector<std::int64_t> tensor_ints(const onnx::TensorProto& t) {
  std::vector<std::int64_t> v(t.int64_data().begin(), t.int64_data().end());
  if (v.empty() && t.data_type() == onnx::TensorProto::INT64 && t.raw_data().size() % 8 == 0) {
    v.resize(t.raw_data().size() / 8);
    if (!v.empty()) std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
  }
  return v;
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
  /// Every node `t` depends on.
  std::set<int> ancestors(const std::string& t) const {
    std::set<int> seen;
    std::vector<std::string> todo{t};
    while (!todo.empty()) {
      const std::string x = todo.back();
      todo.pop_back();
      auto p = producer.find(x);
      if (p == producer.end() || !seen.insert(p->second).second) continue;
      for (const auto& i : g.node(p->second).input())
        if (!i.empty()) todo.push_back(i);
    }
    return seen;
  }
};

std::int64_t attr_int(const onnx::NodeProto& n, const char* name, std::int64_t dflt) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return dflt;
}

/// The expert layer stacked by Concat node `c`, if it is one.
std::optional<ExpertLayer> expert_layer_at(const Index& ix, int c) {
  const auto& concat = ix.g.node(c);
  const std::int64_t axis = attr_int(concat, "axis", 0);
  const int e = concat.input_size();
  if (axis < 1 || e < 2) return std::nullopt;
  ExpertLayer layer;
  layer.stacked = concat.output(0);
  layer.axis = axis;
  layer.concat = c;
  std::vector<std::string> outs;  // each expert's output, before its Unsqueeze
  for (const auto& in : concat.input()) {
    auto p = ix.producer.find(in);
    if (p == ix.producer.end()) return std::nullopt;
    const auto& u = ix.g.node(p->second);
    if (u.op_type() != "Unsqueeze" || u.input_size() < 2 || ix.readers.at(in).size() != 1)
      return std::nullopt;
    auto axes = ix.ints(u.input(1));
    if (!axes || *axes != std::vector<std::int64_t>{axis}) return std::nullopt;
    layer.unsqueeze.push_back(p->second);
    outs.push_back(u.input(0));
  }
  // Nodes only one expert needs are that expert's; the rest are shared (the tokens' producers).
  std::vector<std::set<int>> cones;
  std::map<int, int> count;
  for (const auto& o : outs) {
    cones.push_back(ix.ancestors(o));
    for (int k : cones.back()) ++count[k];
  }
  for (int i = 0; i < e; ++i) {
    std::vector<int> mine;
    for (int k : cones[static_cast<std::size_t>(i)])
      if (count[k] == 1) mine.push_back(k);
    if (mine.empty()) return std::nullopt;
    const std::set<int> in_branch(mine.begin(), mine.end());
    std::vector<std::string> weights;
    for (int k : mine) {
      const auto& n = ix.g.node(k);
      for (const auto& x : n.input()) {
        if (x.empty()) continue;
        if (auto p = ix.producer.find(x); p != ix.producer.end() && in_branch.count(p->second))
          continue;
        if (auto it = ix.inits.find(x);
            it != ix.inits.end() && detail::is_float_type(it->second->data_type())) {
          for (int r : ix.readers.at(x))
            if (!in_branch.count(r)) return std::nullopt;  // a weight another node reads too
          if (std::find(weights.begin(), weights.end(), x) == weights.end()) weights.push_back(x);
          continue;
        }
        if (ix.constant(x)) continue;
        if (layer.tokens.empty()) layer.tokens = x;
        if (x != layer.tokens) return std::nullopt;  // a second shared input: not experts
      }
      for (const auto& o : n.output()) {
        if (o.empty()) continue;
        if (ix.graph_outputs.count(o)) return std::nullopt;  // an expert's value leaves the graph
        auto r = ix.readers.find(o);
        if (r == ix.readers.end()) continue;
        for (int reader : r->second)
          if (!in_branch.count(reader) && !(o == outs[static_cast<std::size_t>(i)] &&
                                            reader == layer.unsqueeze[static_cast<std::size_t>(i)]))
            return std::nullopt;  // an expert's intermediate read outside it
      }
    }
    if (weights.empty()) return std::nullopt;
    layer.nodes.push_back(std::move(mine));
    layer.weights.push_back(std::move(weights));
  }
  if (layer.tokens.empty() || ix.constant(layer.tokens)) return std::nullopt;
  return layer;
}

onnx::AttributeProto* add_attr(onnx::NodeProto& n, std::string_view name) {
  auto* a = n.add_attribute();
  a->set_name(std::string(name));
  return a;
}

void set_group(onnx::NodeProto& n, const std::vector<int>& group) {
  auto* a = add_attr(n, dom::kAttrGroup);
  a->set_type(onnx::AttributeProto::INTS);
  for (int r : group) a->add_ints(r);
}

void set_int(onnx::NodeProto& n, std::string_view name, std::int64_t v) {
  auto* a = add_attr(n, name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

}  // namespace

std::vector<ExpertLayer> find_expert_layers(const onnx::GraphProto& g) {
  const Index ix(g);
  std::vector<ExpertLayer> layers;
  for (int k = 0; k < g.node_size(); ++k)
    if (g.node(k).op_type() == "Concat" && g.node(k).output_size() == 1)
      if (auto l = expert_layer_at(ix, k)) layers.push_back(std::move(*l));
  return layers;
}

Expected<ExpertPartition> partition_experts(const model::Model& m, const std::vector<int>& group,
                                            int member) {
  const int p = static_cast<int>(group.size());
  if (p < 1 || member < 0 || member >= p)
    return Error(Errc::internal, fmt::format("member {} of an expert group of {}", member, p));
  const onnx::GraphProto& g = m.proto->graph();
  const auto layers = find_expert_layers(g);
  if (layers.empty())
    return Error(Errc::bad_input,
                 "expert parallelism needs expert layers, and the model has none (experts in a "
                 "ModuleList, each reading the layer's tokens and its own weights, stacked with "
                 "torch.stack along an axis after the tokens')",
                 m.path.string(), "set [parallel] expert_parallel = 1");
  ExpertPartition out;
  out.layers = static_cast<int>(layers.size());
  out.experts_of.resize(static_cast<std::size_t>(p));
  const Index ix(g);
  std::set<int> drop;                       // other members' experts
  std::set<std::string> dropped;            // their initializers and values
  std::map<int, std::string> reads_tokens;  // a local expert node -> the tokens it reads
  std::map<int, const ExpertLayer*> at_concat;
  std::map<int, std::vector<std::string>> gather_after;  // node (-1: the start) -> tokens
  for (const auto& l : layers) {
    const int e = static_cast<int>(l.nodes.size());
    if (e % p != 0)
      return Error(Errc::bad_input,
                   fmt::format("the expert layer stacked into '{}' has {} experts, which do not "
                               "split over expert_parallel = {}",
                               l.stacked, e, p),
                   m.path.string(), "make expert_parallel divide the number of experts");
    const int per = e / p;
    for (int i = 0; i < e; ++i) {
      const auto x = static_cast<std::size_t>(i);
      const int owner = i / per;
      for (const auto& w : l.weights[x])
        out.experts_of[static_cast<std::size_t>(owner)].push_back(w);
      if (owner != member) {
        drop.insert(l.nodes[x].begin(), l.nodes[x].end());
        drop.insert(l.unsqueeze[x]);
        dropped.insert(l.weights[x].begin(), l.weights[x].end());
        for (int k : l.nodes[x])
          dropped.insert(g.node(k).output().begin(), g.node(k).output().end());
        continue;
      }
      out.varying.insert(out.varying.end(), l.weights[x].begin(), l.weights[x].end());
      for (int k : l.nodes[x]) {
        for (const auto& o : g.node(k).output()) out.varying.push_back(o);
        for (const auto& in : g.node(k).input())
          if (in == l.tokens) reads_tokens[k] = l.tokens;
      }
      out.varying.push_back(g.node(l.unsqueeze[x]).output(0));
    }
    auto prod = ix.producer.find(l.tokens);
    auto& after = gather_after[prod == ix.producer.end() ? -1 : prod->second];
    if (std::find(after.begin(), after.end(), l.tokens) == after.end()) after.push_back(l.tokens);
    at_concat[l.concat] = &l;
  }

  auto proto = std::make_shared<onnx::ModelProto>(*m.proto);
  onnx::GraphProto& ng = *proto->mutable_graph();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  // The dispatch: every member's tokens, in member order, right after they are computed.
  auto dispatch = [&](int after) {
    auto it = gather_after.find(after);
    if (it == gather_after.end()) return;
    for (const auto& tokens : it->second) {
      onnx::NodeProto* ag = nodes.Add();
      ag->set_op_type(std::string(dom::kAllGather));
      ag->set_domain(std::string(dom::kDomain));
      ag->set_name(tokens + ".ep_dispatch");
      ag->add_input(tokens);
      ag->add_output(tokens + ".ep_gathered");
      set_group(*ag, group);
      set_int(*ag, dom::kAttrAxis, 0);
    }
  };
  dispatch(-1);
  for (int k = 0; k < g.node_size(); ++k) {
    if (drop.count(k)) continue;
    onnx::NodeProto* n = nodes.Add();
    *n = g.node(k);
    if (auto it = reads_tokens.find(k); it != reads_tokens.end())
      for (int i = 0; i < n->input_size(); ++i)
        if (n->input(i) == it->second) n->set_input(i, it->second + ".ep_gathered");
    if (auto c = at_concat.find(k); c != at_concat.end()) {
      // The combine: this member's experts on every member's tokens, exchanged so that each
      // member gets its own tokens' rows from all experts, in expert order.
      n->clear_input();
      for (int u : c->second->unsqueeze)
        if (!drop.count(u)) n->add_input(g.node(u).output(0));
      const std::string local = c->second->stacked + ".ep_local";
      n->set_output(0, local);
      out.varying.push_back(local);
      onnx::NodeProto* a2a = nodes.Add();
      a2a->set_op_type(std::string(dom::kAllToAll));
      a2a->set_domain(std::string(dom::kDomain));
      a2a->set_name(c->second->stacked + ".ep_combine");
      a2a->add_input(local);
      a2a->add_output(c->second->stacked);
      set_group(*a2a, group);
      set_int(*a2a, dom::kAttrSplitAxis, 0);
      set_int(*a2a, dom::kAttrConcatAxis, c->second->axis);
    }
    dispatch(k);
  }
  ng.mutable_node()->Swap(&nodes);
  google::protobuf::RepeatedPtrField<onnx::TensorProto> inits;
  for (auto& t : *ng.mutable_initializer())
    if (!dropped.count(t.name())) inits.Add()->Swap(&t);
  ng.mutable_initializer()->Swap(&inits);
  google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> infos;
  for (auto& v : *ng.mutable_value_info())
    if (!dropped.count(v.name())) infos.Add()->Swap(&v);
  ng.mutable_value_info()->Swap(&infos);
  bool has_hp = false;
  for (const auto& o : proto->opset_import()) has_hp = has_hp || o.domain() == dom::kDomain;
  if (!has_hp) {
    auto* o = proto->add_opset_import();
    o->set_domain(std::string(dom::kDomain));
    o->set_version(dom::kOpsetVersion);
  }
  if (!proto->SerializeToString(&out.onnx))
    return Error(Errc::internal, "could not serialize the expert-parallel partition");
  return out;
}

}  // namespace hp::train
