// Building one rank's partition: its stage's nodes in topological order, with
//   - hp.Recv for activations an earlier stage produced and hp.Send for those a later stage reads,
//   - the redistributions propagation recorded, as hp-domain collectives (or a local ONNX Slice)
//     right before the node that reads the tensor,
//   - Shape/Size replaced by constants of the global shape, Reshape/Expand targets by local shapes,
//   - each weight cut to the rank's slice (a Partial(sum) weight, Gemm's bias under a row-parallel
//     weight, stores its slice divided by the partial size; a blocked fused q|k|v weight stores its
//     piece of every block, propagate.h),
//   - a Split whose axis arrives split (a blocked q|k|v tensor) given its local part sizes.
#include "hp/shard/partition.h"

#include <fmt/core.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "partition_builder.h"

namespace hp::shard {
namespace detail {

Expected<RankPartition> Builder::build() {
  onnx::ModelProto m;
  const auto& src = *plan_.model->proto;
  m.set_ir_version(std::max<std::int64_t>(src.ir_version(), 8));
  m.set_producer_name("hp shard");
  for (const auto& op : src.opset_import())
    if (op.domain() != dom::kDomain) *m.add_opset_import() = op;
  auto* hp_op = m.add_opset_import();
  hp_op->set_domain(std::string(dom::kDomain));
  hp_op->set_version(dom::kOpsetVersion);
  out_ = m.mutable_graph();
  result_.stage = s_;
  result_.position = pos_;
  result_.rank = rank_of(stage_, pos_);
  out_->set_name(fmt::format("{}.rank{}", pg_.name().empty() ? "hp" : pg_.name(), result_.rank));

  in_stage_ = std::set<int>(stage_.nodes.begin(), stage_.nodes.end());
  for (int i : stage_.nodes) {
    for (int t : g_.node(i).inputs)
      if (t >= 0) used_.insert(t);
    // What a subgraph reads counts too: a graph input only an If branch reads is still an input.
    for (const auto& name : model::outer_reads(pg_.node(i)))
      if (int t = g_.find_tensor(name); t >= 0) used_.insert(t);
  }
  add_inputs_and_recvs();
  plan_renames();
  for (int i : stage_.nodes) {
    const std::string& type = pg_.node(i).op_type();
    const auto& in = g_.node(i).inputs;
    if ((type == "Shape" || type == "Size") && !in.empty() && in[0] >= 0 &&
        static_shape(g_.tensor(in[0])))
      add_shape_constant(i);
    else
      HP_TRY(add_node(i));
  }
  HP_TRY(add_outputs());
  add_sends();
  find_varying();
  if (!m.SerializeToString(&result_.onnx))
    return Error(Errc::internal,
                 fmt::format("could not serialize the partition of rank {}", result_.rank));
  return result_;
}

void Builder::add_inputs_and_recvs() {
  for (int t : g_.inputs)
    if (used_.count(t)) {
      const auto& tensor = g_.tensor(t);
      set_value_info(out_->add_input(), tensor.name, tensor.elem_type,
                     local(t, prop_.layout[static_cast<std::size_t>(t)]));
    }
  for (const auto& b : plan_.boundaries) {
    if (b.to_stage != s_) continue;
    const auto& tensor = g_.tensor(b.tensor);
    const auto& from = plan_.stages[static_cast<std::size_t>(b.from_stage)];
    onnx::NodeProto* n = out_->add_node();
    n->set_op_type(std::string(dom::kRecv));
    n->set_domain(std::string(dom::kDomain));
    n->set_name(fmt::format("recv/{}", tensor.name));
    n->add_output(tensor.name);
    add_int_attr(n, dom::kAttrPeer, rank_of(from, pos_));
    add_int_attr(n, dom::kAttrTag, b.tag);
    add_int_attr(n, dom::kAttrDtype, tensor.elem_type);
    add_ints_attr(n, dom::kAttrShape,
                  local(b.tensor, prop_.layout[static_cast<std::size_t>(b.tensor)]));
    ++result_.recvs;
  }
}

void Builder::plan_renames() {
  for (const auto& r : prop_.redistributions)
    if (r.node < 0) {
      out_redist_[r.tensor] = &r;
      rename_[g_.tensor(r.tensor).name] = g_.tensor(r.tensor).name + ".hp_pre";
    }
  for (std::size_t k = 0; k < prop_.redistributions.size(); ++k)
    if (prop_.redistributions[k].node >= 0)
      redist_by_node_[prop_.redistributions[k].node].push_back(k);
}

void Builder::add_shape_constant(int i) {
  // The global shape as a constant: shape arithmetic computes what it did unsharded.
  const auto& node = g_.node(i);
  const onnx::NodeProto& pn = pg_.node(i);
  const auto& x = g_.tensor(node.inputs[0]);
  auto gs = shape_of(x);
  std::vector<std::int64_t> v;
  if (pn.op_type() == "Size") {
    v = {prod(gs)};
  } else {
    auto r = static_cast<std::int64_t>(gs.size());
    std::int64_t start = 0, end = r;
    for (const auto& a : pn.attribute()) {
      if (a.name() == "start") start = a.i();
      if (a.name() == "end") end = a.i();
    }
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = std::clamp<std::int64_t>(start, 0, r);
    end = std::clamp<std::int64_t>(end, start, r);
    v.assign(gs.begin() + start, gs.begin() + end);
  }
  onnx::NodeProto* n = out_->add_node();
  n->set_op_type("Constant");
  n->set_name(pn.name().empty() ? fresh("shape") : pn.name());
  n->add_output(renamed(pn.output(0)));
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  *a->mutable_t() = int64_tensor("", v);
  if (pn.op_type() == "Size") a->mutable_t()->clear_dims();
}

Status Builder::add_node(int i) {
  const auto& node = g_.node(i);
  const onnx::NodeProto& pn = pg_.node(i);
  onnx::NodeProto n = pn;
  // Inputs: redistributed where propagation said so.
  for (std::size_t k = 0; k < node.inputs.size(); ++k) {
    int t = node.inputs[k];
    if (t < 0) continue;
    const auto& tensor = g_.tensor(t);
    if (tensor.kind == model::TensorKind::initializer) HP_TRY(add_initializer(t));
    std::string name = renamed(pn.input(static_cast<int>(k)));
    for (std::size_t ri : redist_by_node_[i]) {
      const auto& r = prop_.redistributions[ri];
      if (r.tensor != t || r.to != prop_.reads[static_cast<std::size_t>(i)][k]) continue;
      auto key = std::pair{t, static_cast<int>(ri)};
      // The same tensor redistributed the same way for another consumer is reused.
      for (const auto& [kk, v] : redist_done_)
        if (kk.first == t && prop_.redistributions[static_cast<std::size_t>(kk.second)].to == r.to)
          key = kk;
      auto it = redist_done_.find(key);
      if (it == redist_done_.end()) {
        HP_ASSIGN_OR_RETURN(auto made, redistribute(t, name, r));
        it = redist_done_.emplace(key, made).first;
      }
      name = it->second;
      break;
    }
    n.set_input(static_cast<int>(k), name);
  }
  HP_TRY(add_captured(n));
  for (int j = 0; j < n.output_size(); ++j) n.set_output(j, renamed(n.output(j)));
  // Reshape/Expand targets: the local output shape.
  if ((pn.op_type() == "Reshape" || pn.op_type() == "Expand") && node.outputs[0] >= 0 &&
      pn.input_size() > 1 && static_shape(g_.tensor(node.outputs[0]))) {
    int o = node.outputs[0];
    auto ls = local(o, prop_.layout[static_cast<std::size_t>(o)]);
    std::string cname = fresh((pn.name().empty() ? g_.tensor(o).name : pn.name()) + "/local_shape");
    *out_->add_initializer() = int64_tensor(cname, ls);
    n.set_input(1, cname);
    for (auto& a : *n.mutable_attribute())
      if (a.name() == "allowzero") a.set_i(0);
  }
  if (pn.op_type() == "Split") HP_TRY(local_split_sizes(i, n));
  if (pn.op_type() == "Gather" && node.inputs[0] >= 0 &&
      g_.tensor(node.inputs[0]).kind == model::TensorKind::initializer)
    return vocab_parallel_gather(i, n);
  *out_->add_node() = std::move(n);
  return {};
}

Status Builder::add_captured(onnx::NodeProto& n) {
  const std::string where = n.name().empty() ? n.op_type() : n.name();
  std::map<std::string, std::string> names;
  for (const auto& name : model::outer_reads(n)) {
    const int t = g_.find_tensor(name);
    if (t < 0) continue;
    const Sharding& s = prop_.layout[static_cast<std::size_t>(t)];
    bool whole = s.partial.empty();
    for (const auto& d : s.dims) whole = whole && d.empty();
    const int producer = g_.tensor(t).producer;
    if (!whole || (producer >= 0 && !in_stage_.count(producer)))
      return Error(Errc::not_implemented,
                   fmt::format("node '{}' ({}): its subgraph reads '{}', which this plan {}; a "
                               "subgraph reads the values around it whole, on its own stage",
                               where, n.op_type(), name,
                               whole ? "computes on another pipeline stage" : "splits"),
                   where, "keep the tensors a control-flow node reads replicated and on its stage");
    if (g_.tensor(t).kind == model::TensorKind::initializer) HP_TRY(add_initializer(t));
    if (renamed(name) != name) names[name] = renamed(name);
  }
  if (names.empty()) return {};
  // Outer values renamed in the partition are read under their new names, at any depth (the
  // node's own inputs are the caller's).
  std::function<void(onnx::NodeProto&)> rename_inside = [&](onnx::NodeProto& node) {
    auto rename = [&](std::string& s) {
      if (auto it = names.find(s); it != names.end()) s = it->second;
    };
    auto graph = [&](onnx::GraphProto& g) {
      for (auto& inner : *g.mutable_node()) {
        for (auto& in : *inner.mutable_input()) rename(in);
        rename_inside(inner);
      }
      for (auto& o : *g.mutable_output()) rename(*o.mutable_name());
    };
    for (auto& a : *node.mutable_attribute()) {
      if (a.has_g()) graph(*a.mutable_g());
      for (auto& sg : *a.mutable_graphs()) graph(sg);
    }
  };
  rename_inside(n);
  return {};
}

Status Builder::add_outputs() {
  for (int t : g_.outputs) {
    const auto& tensor = g_.tensor(t);
    int prod_node = tensor.producer;
    bool here = prod_node < 0 ? used_.count(t) > 0 : in_stage_.count(prod_node) > 0;
    if (!here) continue;
    Sharding s = prop_.layout[static_cast<std::size_t>(t)];
    auto it = out_redist_.find(t);
    if (it != out_redist_.end()) {
      HP_ASSIGN_OR_RETURN(auto made, redistribute(t, renamed(tensor.name), *it->second));
      onnx::NodeProto* id = out_->add_node();
      id->set_op_type("Identity");
      id->set_name(fresh("output"));
      id->add_input(made);
      id->add_output(tensor.name);
      s = it->second->to;
    }
    set_value_info(out_->add_output(), tensor.name, tensor.elem_type, local(t, s));
  }
  return {};
}

void Builder::find_varying() {
  // Weights, graph inputs and received activations by their layout; a node's outputs follow its
  // inputs, except a redistribution's, which have the layout it redistributes to (an all-gather
  // over tp makes a tensor the same everywhere, a local slice makes it differ).
  std::set<std::string> v;
  for (std::size_t t = 0; t < g_.tensors.size(); ++t)
    if (varies_on_last_axis(prop_.mesh, prop_.layout[t]))
      v.insert(g_.tensor(static_cast<int>(t)).name);
  for (const auto& n : out_->node()) {
    if (n.input_size() == 0) continue;  // Recv, Constant
    bool any = false;
    for (const auto& i : n.input()) any = any || v.count(i);
    for (const auto& o : n.output()) {
      auto r = redist_varying_.find(o);
      if (r != redist_varying_.end() ? r->second : any)
        v.insert(o);
      else
        v.erase(o);
    }
  }
  result_.varying.assign(v.begin(), v.end());
}

void Builder::add_sends() {
  // Activations later stages read: sent, and also returned (a stage's result for inspection).
  for (const auto& b : plan_.boundaries) {
    if (b.from_stage != s_) continue;
    const auto& tensor = g_.tensor(b.tensor);
    const auto& to = plan_.stages[static_cast<std::size_t>(b.to_stage)];
    onnx::NodeProto* n = out_->add_node();
    n->set_op_type(std::string(dom::kSend));
    n->set_domain(std::string(dom::kDomain));
    n->set_name(fmt::format("send/{}/s{}", tensor.name, b.to_stage));
    n->add_input(renamed(tensor.name));
    add_int_attr(n, dom::kAttrPeer, rank_of(to, pos_));
    add_int_attr(n, dom::kAttrTag, b.tag);
    ++result_.sends;
    bool listed = false;
    for (const auto& o : out_->output()) listed = listed || o.name() == tensor.name;
    if (!listed && !rename_.count(tensor.name))
      set_value_info(out_->add_output(), tensor.name, tensor.elem_type,
                     local(b.tensor, prop_.layout[static_cast<std::size_t>(b.tensor)]));
  }
}

}  // namespace detail

Expected<RankPartition> build_partition(const PartitionPlan& plan, int stage,
                                        std::int64_t position) {
  return detail::Builder(plan, stage, position).build();
}

}  // namespace hp::shard
