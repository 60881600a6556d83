// Expert layers and one member's expert-parallel partition (hp/train/expert_parallel.h).
#include "hp/train/expert_parallel.h"

#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "expert_accumulate.h"
#include "expert_index.h"
#include "graph_parts.h"
#include "hp/core/hp_domain.h"
#include "hp/model/graph.h"

namespace hp::train {

namespace {

namespace dom = hp::domain;
using detail::attr_int;
using detail::Index;

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

// A Constant node of int64 values.
onnx::NodeProto int_constant(const std::string& out, const std::vector<std::int64_t>& v) {
  onnx::NodeProto n;
  n.set_op_type("Constant");
  n.set_name(out);
  n.add_output(out);
  auto* a = n.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  auto* t = a->mutable_t();
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<std::int64_t>(v.size()));
  for (auto x : v) t->add_int64_data(x);
  return n;
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

/// Topological order closest to the given one: each time, the first node (in the given order)
/// whose inputs, captured ones included, are computed. Deterministic in the graph alone, so
/// members whose partitions have the same shape run their collectives in the same order.
/// Errc::internal on a cycle.
Status reorder_after_inputs(google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes) {
  const int count = nodes.size();
  std::map<std::string, int> producer;
  for (int k = 0; k < count; ++k)
    for (const auto& o : nodes.Get(k).output())
      if (!o.empty()) producer[o] = k;
  std::vector<std::vector<int>> readers(static_cast<std::size_t>(count));
  std::vector<int> waiting(static_cast<std::size_t>(count), 0);
  for (int k = 0; k < count; ++k) {
    std::set<std::string> reads = model::outer_reads(nodes.Get(k));  // what subgraphs capture
    reads.insert(nodes.Get(k).input().begin(), nodes.Get(k).input().end());
    std::set<int> from;
    for (const auto& i : reads)
      if (auto p = producer.find(i); p != producer.end() && p->second != k) from.insert(p->second);
    for (int f : from) readers[static_cast<std::size_t>(f)].push_back(k);
    waiting[static_cast<std::size_t>(k)] = static_cast<int>(from.size());
  }
  std::set<int> ready;
  for (int k = 0; k < count; ++k)
    if (waiting[static_cast<std::size_t>(k)] == 0) ready.insert(k);
  google::protobuf::RepeatedPtrField<onnx::NodeProto> sorted;
  while (!ready.empty()) {
    const int k = *ready.begin();
    ready.erase(ready.begin());
    sorted.Add()->Swap(nodes.Mutable(k));
    for (int r : readers[static_cast<std::size_t>(k)])
      if (--waiting[static_cast<std::size_t>(r)] == 0) ready.insert(r);
  }
  if (sorted.size() != count)
    return Error(Errc::internal, "the expert-parallel partition has a cycle");
  nodes.Swap(&sorted);
  return {};
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
                                            int member, bool routed, const model::DimBindings& dims,
                                            bool allow_none) {
  const int p = static_cast<int>(group.size());
  if (p < 1 || member < 0 || member >= p)
    return Error(Errc::internal, fmt::format("member {} of an expert group of {}", member, p));
  const onnx::GraphProto& g = m.proto->graph();
  const auto layers = find_expert_layers(g);
  const Index ix(g);
  const auto summed = detail::find_accumulated_layers(ix, detail::row_checks(m, ix, dims));
  if (layers.empty() && summed.empty() && allow_none) {
    ExpertPartition none;  // layers == 0, no onnx: the caller keeps its model
    none.experts_of.resize(static_cast<std::size_t>(p));
    return none;
  }
  if (layers.empty() && summed.empty())
    return Error(Errc::bad_input,
                 "expert parallelism needs expert layers, and the model has none (experts in a "
                 "ModuleList, each reading the layer's tokens and its own weights, either stacked "
                 "with torch.stack along an axis after the tokens' or added into a zeros_like of "
                 "the tokens, as a Mixtral-style loop of torch.where and index_add_ does)",
                 m.path.string(), "set [parallel] expert_parallel = 1");
  ExpertPartition out;
  out.layers = static_cast<int>(layers.size() + summed.size());
  out.summed = static_cast<int>(summed.size());
  out.experts_of.resize(static_cast<std::size_t>(p));
  std::set<int> drop;             // other members' experts (and, routed, the stacking)
  std::set<std::string> dropped;  // their initializers and values
  std::map<std::pair<int, std::string>, std::string> renamed;  // (node, input) -> what it reads
  std::map<int, onnx::NodeProto> at_concat;  // a node (a Concat, an Add) -> its replacement
  std::map<int, std::vector<onnx::NodeProto>> after;  // node (-1: the start) -> nodes added
  std::set<std::string> gathered;                     // tokens all-gathered already
  auto node = [&](std::string_view op, const std::string& name) {
    onnx::NodeProto n;
    n.set_op_type(std::string(op));
    n.set_domain(std::string(dom::kDomain));
    n.set_name(name);
    set_group(n, group);
    return n;
  };
  auto producer = [&](const std::string& t) {
    auto it = ix.producer.find(t);
    return it == ix.producer.end() ? -1 : it->second;
  };
  // Every member's rows of `t` (axis 0), right after `t` is computed; once per tensor.
  auto gather_rows = [&](const std::string& t) {
    if (!gathered.insert(t).second) return;
    auto ag = node(dom::kAllGather, t + ".ep_dispatch");
    ag.add_input(t);
    ag.add_output(t + ".ep_gathered");
    set_int(ag, dom::kAttrAxis, 0);
    after[producer(t)].push_back(std::move(ag));
  };
  auto unsplit = [&](const char* how, const std::string& where, int e) {
    return Error(Errc::bad_input,
                 fmt::format("the expert layer {} into '{}' has {} experts, which do not split "
                             "over expert_parallel = {}",
                             how, where, e, p),
                 m.path.string(), "make expert_parallel divide the number of experts");
  };
  for (const auto& l : layers) {
    const int e = static_cast<int>(l.nodes.size());
    if (e % p != 0) return unsplit("stacked", l.stacked, e);
    const int per = e / p;
    const std::string indices = routed ? detail::routed_indices(ix, l) : std::string();
    out.routed += !indices.empty();
    // What this member's experts read instead of the layer's tokens: the rows routed to each, or
    // every member's tokens.
    auto source = [&](int x) {
      return indices.empty() ? l.tokens + ".ep_gathered"
                             : fmt::format("{}.ep_rows{}", l.stacked, x - member * per);
    };
    std::vector<std::string> outs;  // this member's experts' outputs, in order
    for (int i = 0; i < e; ++i) {
      const auto x = static_cast<std::size_t>(i);
      const int owner = i / per;
      for (const auto& w : l.weights[x])
        out.experts_of[static_cast<std::size_t>(owner)].push_back(w);
      if (owner != member || !indices.empty()) drop.insert(l.unsqueeze[x]);
      if (owner != member) {
        drop.insert(l.nodes[x].begin(), l.nodes[x].end());
        dropped.insert(l.weights[x].begin(), l.weights[x].end());
        for (int k : l.nodes[x])
          dropped.insert(g.node(k).output().begin(), g.node(k).output().end());
        continue;
      }
      out.varying.insert(out.varying.end(), l.weights[x].begin(), l.weights[x].end());
      for (int k : l.nodes[x]) {
        for (const auto& o : g.node(k).output()) out.varying.push_back(o);
        for (const auto& in : g.node(k).input())
          if (in == l.tokens) renamed[{k, in}] = source(i);
      }
      const auto& u = g.node(l.unsqueeze[x]);
      outs.push_back(indices.empty() ? u.output(0) : u.input(0));
      if (indices.empty()) out.varying.push_back(u.output(0));
    }
    if (indices.empty()) {
      // The dispatch: every member's tokens, in member order, right after they are computed. The
      // combine: this member's experts on every member's tokens, exchanged so that each member
      // gets its own tokens' rows from all experts, in expert order.
      gather_rows(l.tokens);
      onnx::NodeProto concat = g.node(l.concat);
      concat.clear_input();
      for (const auto& o : outs) concat.add_input(o);
      const std::string local = l.stacked + ".ep_local";
      concat.set_output(0, local);
      out.varying.push_back(local);
      auto a2a = node(dom::kAllToAll, l.stacked + ".ep_combine");
      a2a.add_input(local);
      a2a.add_output(l.stacked);
      set_int(a2a, dom::kAttrSplitAxis, 0);
      set_int(a2a, dom::kAttrConcatAxis, l.axis);
      at_concat[l.concat] = std::move(concat);
      after[l.concat].push_back(std::move(a2a));
      continue;
    }
    // Routed: each token's rows go to the members holding its experts, once both the tokens and
    // the router's choice are known, and come back in place of the stack.
    auto d = node(dom::kDispatch, l.stacked + ".ep_dispatch");
    d.add_input(l.tokens);
    d.add_input(indices);
    for (int j = 0; j < per; ++j) {
      d.add_output(source(member * per + j));
      out.varying.push_back(d.output(j));
    }
    set_int(d, dom::kAttrExperts, e);
    after[std::max(producer(l.tokens), producer(indices))].push_back(std::move(d));
    auto c = node(dom::kCombine, l.stacked + ".ep_combine");
    for (const auto& o : outs) c.add_input(o);
    c.add_input(indices);
    c.add_output(l.stacked);
    set_int(c, dom::kAttrExperts, e);
    at_concat[l.concat] = std::move(c);
  }
  // Accumulated layers (expert_accumulate.h): the region on every member's rows, this member's
  // experts added, the partial sums reduce-scattered back into each member's rows.
  for (const auto& l : summed) {
    const int e = static_cast<int>(l.nodes.size());
    if (e % p != 0) return unsplit("summed", l.sum, e);
    const int per = e / p;
    // The zeros the sum starts from, shaped like every member's rows: a ConstantOfShape reading
    // this member's row count from outside gets it times p; a folded constant becomes one.
    std::string start = l.start;
    if (!l.start_shape.empty()) {
      const std::string s = l.start_shape, base = l.sum + ".ep_rows";
      std::vector<onnx::NodeProto> made;
      made.push_back(int_constant(base + ".c0", {0}));
      made.push_back(int_constant(base + ".c1", {1}));
      made.push_back(int_constant(base + ".end", {std::numeric_limits<std::int64_t>::max()}));
      made.push_back(int_constant(base + ".p", {p}));
      auto op = [&](const char* type, std::vector<std::string> in, const std::string& o) {
        onnx::NodeProto n;
        n.set_op_type(type);
        n.set_name(o);
        for (auto& x : in) n.add_input(x);
        n.add_output(o);
        return n;
      };
      made.push_back(op("Slice", {s, base + ".c0", base + ".c1"}, base + ".first"));
      made.push_back(op("Slice", {s, base + ".c1", base + ".end"}, base + ".rest"));
      made.push_back(op("Mul", {base + ".first", base + ".p"}, base + ".all"));
      made.push_back(op("Concat", {base + ".all", base + ".rest"}, base));
      set_int(made.back(), "axis", 0);
      for (auto& n : made) after[producer(s)].push_back(std::move(n));
      renamed[{producer(l.start), s}] = base;
    } else if (!l.start_dims.empty()) {
      std::vector<std::int64_t> dims = l.start_dims;
      dims[0] *= p;
      start = l.start + ".ep_zeros";
      after[-1].push_back(int_constant(start + ".shape", dims));
      onnx::NodeProto z;
      z.set_op_type("ConstantOfShape");
      z.set_name(start);
      z.add_input(start + ".shape");
      z.add_output(start);
      after[-1].push_back(std::move(z));  // float zeros: ConstantOfShape's default value
      for (int k : l.region)
        for (const auto& in : g.node(k).input())
          if (in == l.start) renamed[{k, in}] = start;
    }
    std::set<std::string> varying;
    for (int i = 0; i < e; ++i) {
      const auto x = static_cast<std::size_t>(i);
      const int owner = i / per;
      for (const auto& w : l.weights[x])
        out.experts_of[static_cast<std::size_t>(owner)].push_back(w);
      if (owner == member) {  // its weights and values: no other member has them
        varying.insert(l.weights[x].begin(), l.weights[x].end());
        for (int k : l.nodes[x])
          for (const auto& o : g.node(k).output())
            if (!o.empty()) varying.insert(o);
        continue;
      }
      drop.insert(l.nodes[x].begin(), l.nodes[x].end());
      dropped.insert(l.weights[x].begin(), l.weights[x].end());
      for (int k : l.nodes[x]) dropped.insert(g.node(k).output().begin(), g.node(k).output().end());
      onnx::NodeProto id;  // the sum goes on without this expert's contribution
      id.set_op_type("Identity");
      id.set_name(g.node(l.adds[x]).output(0) + ".ep_skip");
      id.add_input(l.prev[x] == l.start ? start : l.prev[x]);
      id.add_output(g.node(l.adds[x]).output(0));
      at_concat[l.adds[x]] = std::move(id);
    }
    for (const auto& f : l.frontier) {
      gather_rows(f);
      for (int k : l.region)
        for (const auto& in : g.node(k).input())
          if (in == f) renamed[{k, in}] = f + ".ep_gathered";
    }
    // This member's partial sum over every member's rows, then each member's rows of the total.
    const std::string local = l.sum + ".ep_local";
    const int last = l.adds.back();
    if (!at_concat.count(last)) {
      at_concat[last] = g.node(last);
      for (auto& in : *at_concat[last].mutable_input())
        if (auto r = renamed.find({last, in}); r != renamed.end()) in = r->second;
    }
    at_concat[last].set_output(0, local);
    for (int k : l.region) {  // what this member's experts' values flow into
      if (drop.count(k)) continue;
      bool reads = false;
      for (const auto& in : g.node(k).input()) reads = reads || varying.count(in);
      if (reads)
        for (const auto& o : g.node(k).output())
          if (!o.empty()) varying.insert(o);
    }
    varying.erase(l.sum);
    varying.insert(local);
    out.varying.insert(out.varying.end(), varying.begin(), varying.end());
    auto rs = node(dom::kReduceScatter, l.sum + ".ep_combine");
    rs.add_input(local);
    rs.add_output(l.sum);
    set_int(rs, dom::kAttrAxis, 0);
    after[last].push_back(std::move(rs));
  }

  auto proto = std::make_shared<onnx::ModelProto>(*m.proto);
  onnx::GraphProto& ng = *proto->mutable_graph();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  auto insert = [&](int k) {
    if (auto it = after.find(k); it != after.end())
      for (auto& n : it->second) *nodes.Add() = std::move(n);
  };
  insert(-1);
  for (int k = 0; k < g.node_size(); ++k) {
    if (drop.count(k)) continue;
    if (auto c = at_concat.find(k); c != at_concat.end()) {
      *nodes.Add() = std::move(c->second);
    } else {
      onnx::NodeProto* n = nodes.Add();
      *n = g.node(k);
      for (int i = 0; i < n->input_size(); ++i)
        if (auto r = renamed.find({k, n->input(i)}); r != renamed.end()) n->set_input(i, r->second);
    }
    insert(k);
  }
  // A routed dispatch waits for the router, which the export may compute after some expert nodes:
  // those move after it, everything else keeps its place.
  if (out.routed > 0) HP_TRY(reorder_after_inputs(nodes));
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
