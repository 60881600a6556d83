// Parts of one graph (graph_parts.h). A part keeps the source's names, so a tensor one part writes
// and another reads is passed under its own name, and a weight keeps its initializer name in every
// part that reads it (the trainer's set_weight then reaches each copy by the same name).
#include "graph_parts.h"

#include <algorithm>

namespace hp::train::detail {

void collect_reads(const onnx::NodeProto& n, std::set<std::string>& out) {
  for (const auto& i : n.input())
    if (!i.empty()) out.insert(i);
  for (const auto& a : n.attribute()) {
    std::vector<const onnx::GraphProto*> subs;
    if (a.has_g()) subs.push_back(&a.g());
    for (const auto& g : a.graphs()) subs.push_back(&g);
    for (const auto* g : subs)
      for (const auto& sn : g->node()) collect_reads(sn, out);
  }
}

TensorInfo::TensorInfo(const model::Model& m, const model::Graph* fg) {
  const onnx::GraphProto& g = m.proto->graph();
  for (const auto& t : g.initializer()) types_[t.name()] = t.data_type();
  for (const auto* list : {&g.input(), &g.output(), &g.value_info()})
    for (const auto& v : *list)
      if (v.type().has_tensor_type() && v.type().tensor_type().elem_type() != 0)
        types_.emplace(v.name(), v.type().tensor_type().elem_type());
  if (fg) {
    for (const auto& t : fg->tensors) {
      if (t.elem_type != 0) types_[t.name] = t.elem_type;
      if (t.has_shape && !t.sequence) dims_[t.name] = t.dims;
    }
  }
  for (const auto& n : g.node()) {
    std::int32_t from = 0;
    for (const auto& i : n.input()) {
      auto it = types_.find(i);
      if (it != types_.end() && is_float_type(it->second)) {
        from = it->second;
        break;
      }
    }
    for (const auto& o : n.output())
      if (!o.empty() && from != 0) types_.emplace(o, from);
  }
}

void TensorInfo::declare(onnx::ValueInfoProto& v, const std::string& name) const {
  v.set_name(name);
  auto t = types_.find(name);
  if (t == types_.end()) return;
  auto* tt = v.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(t->second);
  auto d = dims_.find(name);
  if (d == dims_.end()) return;
  auto* sh = tt->mutable_shape();
  for (const auto& dim : d->second) {
    auto* sd = sh->add_dim();
    if (dim.known())
      sd->set_dim_value(dim.value);
    else if (!dim.symbol.empty() && dim.symbol.rfind("unk__", 0) != 0)
      sd->set_dim_param(dim.symbol);
  }
}

std::vector<std::string> outside_reads(const onnx::GraphProto& g, const std::vector<int>& nodes) {
  std::set<std::string> written, seen;
  for (int k : nodes)
    for (const auto& o : g.node(k).output()) written.insert(o);
  std::vector<std::string> out;
  for (int k : nodes) {
    std::set<std::string> r;
    collect_reads(g.node(k), r);
    // collect_reads sorts; the node's own input order is the first-reading order.
    std::vector<std::string> ordered(g.node(k).input().begin(), g.node(k).input().end());
    for (const auto& x : r)
      if (std::find(ordered.begin(), ordered.end(), x) == ordered.end()) ordered.push_back(x);
    for (const auto& x : ordered)
      if (!x.empty() && !written.count(x) && seen.insert(x).second) out.push_back(x);
  }
  return out;
}

model::Model part_model(const model::Model& src, const PartSpec& part, const TensorInfo& info,
                        const std::string& name) {
  const onnx::ModelProto& sp = *src.proto;
  const onnx::GraphProto& sg = sp.graph();
  auto p = std::make_shared<onnx::ModelProto>();
  p->set_ir_version(sp.ir_version());
  *p->mutable_opset_import() = sp.opset_import();
  p->set_producer_name(sp.producer_name());
  p->set_producer_version(sp.producer_version());
  p->set_domain(sp.domain());
  p->set_model_version(sp.model_version());
  *p->mutable_metadata_props() = sp.metadata_props();
  *p->mutable_functions() = sp.functions();
  onnx::GraphProto& g = *p->mutable_graph();
  g.set_name(name);
  std::set<std::string> reads, written;
  for (int k : part.nodes) {
    *g.add_node() = sg.node(k);
    collect_reads(sg.node(k), reads);
    for (const auto& o : sg.node(k).output()) written.insert(o);
  }
  for (const auto& t : sg.initializer())
    if (reads.count(t.name())) *g.add_initializer() = t;
  std::map<std::string, const onnx::ValueInfoProto*> src_in, src_out;
  for (const auto& v : sg.input()) src_in[v.name()] = &v;
  for (const auto& v : sg.output()) src_out[v.name()] = &v;
  for (const auto& i : part.inputs) {
    auto it = src_in.find(i);
    if (it != src_in.end())
      *g.add_input() = *it->second;
    else
      info.declare(*g.add_input(), i);
  }
  for (const auto& o : part.outputs) {
    auto it = src_out.find(o);
    if (it != src_out.end())
      *g.add_output() = *it->second;
    else
      info.declare(*g.add_output(), o);
  }
  for (const auto& v : sg.value_info())
    if (written.count(v.name())) *g.add_value_info() = v;
  model::Model m = src;
  m.proto = p;
  return m;
}

std::vector<int> needed_nodes(const onnx::GraphProto& g, const std::vector<std::string>& targets,
                              const std::set<std::string>& stops) {
  std::set<std::string> live(targets.begin(), targets.end());
  std::vector<int> out;
  for (int k = g.node_size() - 1; k >= 0; --k) {
    const auto& n = g.node(k);
    bool used = false;
    for (const auto& o : n.output())
      used = used || (!o.empty() && live.count(o) && !stops.count(o));
    if (!used) continue;
    out.push_back(k);
    collect_reads(n, live);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace hp::train::detail
