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
#include <cstring>
#include <map>
#include <set>

#include "hp/core/hp_domain.h"
#include "partition_weights.h"

namespace hp::shard {
namespace {

namespace dom = hp::domain;

std::vector<std::int64_t> shape_of(const model::Tensor& t) { return global_shape(t); }

std::int64_t prod(const std::vector<std::int64_t>& v) {
  std::int64_t n = 1;
  for (auto d : v) n *= d;
  return n;
}

void add_int_attr(onnx::NodeProto* n, std::string_view name, std::int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(std::string(name));
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void add_ints_attr(onnx::NodeProto* n, std::string_view name, const std::vector<std::int64_t>& v) {
  auto* a = n->add_attribute();
  a->set_name(std::string(name));
  a->set_type(onnx::AttributeProto::INTS);
  for (auto x : v) a->add_ints(x);
}

void add_str_attr(onnx::NodeProto* n, std::string_view name, const std::string& v) {
  auto* a = n->add_attribute();
  a->set_name(std::string(name));
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}

void set_value_info(onnx::ValueInfoProto* v, const std::string& name, std::int32_t elem,
                    const std::vector<std::int64_t>& dims) {
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  auto* sh = tt->mutable_shape();
  for (auto d : dims) sh->add_dim()->set_dim_value(d);
}

onnx::TensorProto int64_tensor(const std::string& name, const std::vector<std::int64_t>& v) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::INT64);
  t.add_dims(static_cast<std::int64_t>(v.size()));
  for (auto x : v) t.add_int64_data(x);
  return t;
}

// Emits one rank's program.
class Builder {
 public:
  Builder(const PartitionPlan& plan, int stage, std::int64_t position)
      : plan_(plan), g_(*plan.graph), prop_(*plan.prop), pg_(plan.model->proto->graph()),
        stage_(plan.stages[static_cast<std::size_t>(stage)]), s_(stage), pos_(position) {}

  Expected<RankPartition> build();

 private:
  std::int64_t rank_of(const StageNodes& st, std::int64_t position) const {
    return st.ranks[static_cast<std::size_t>(position)];
  }
  std::vector<std::int64_t> local(int t, const Sharding& s) const {
    return local_shape(prop_.mesh, s, shape_of(g_.tensor(t)), pos_);
  }
  std::vector<std::int64_t> group_of(const RedistStep& st) const {
    for (const auto& grp : st.groups)
      if (std::find(grp.begin(), grp.end(), pos_) != grp.end()) {
        std::vector<std::int64_t> out;
        for (auto p : grp) out.push_back(rank_of(stage_, p));
        return out;
      }
    return {};
  }
  std::string fresh(const std::string& base) { return fmt::format("{}.hp{}", base, counter_++); }
  Expected<std::string> redistribute(int tensor, const std::string& name, const Redistribution& r);
  Status add_initializer(int t);
  Status vocab_parallel_gather(int i, onnx::NodeProto n);
  Status local_split_sizes(int i, onnx::NodeProto& n);
  std::string scalar(const std::string& base, std::int32_t type, std::int64_t v) {
    std::string name = fresh(base);
    onnx::TensorProto* t = out_->add_initializer();
    t->set_name(name);
    t->set_data_type(type);
    if (type == onnx::TensorProto::INT32) t->add_int32_data(static_cast<std::int32_t>(v));
    else t->add_int64_data(v);
    return name;
  }
  onnx::NodeProto* op(const std::string& type, std::vector<std::string> in, const std::string& out) {
    onnx::NodeProto* n = out_->add_node();
    n->set_op_type(type);
    n->set_name(fresh(out));
    for (auto& x : in) n->add_input(x);
    n->add_output(out);
    return n;
  }

  const PartitionPlan& plan_;
  const model::Graph& g_;
  const Propagation& prop_;
  const onnx::GraphProto& pg_;
  const StageNodes& stage_;
  int s_;
  std::int64_t pos_;
  onnx::GraphProto* out_ = nullptr;
  RankPartition result_;
  int counter_ = 0;
  std::set<int> inits_;
};

Expected<std::string> Builder::redistribute(int tensor, const std::string& name, const Redistribution& r) {
  std::string cur = name;
  const auto& t = g_.tensor(tensor);
  auto gshape = shape_of(t);
  for (const auto& st : r.plan.steps) {
    std::string next = fresh(t.name);
    onnx::NodeProto* n = out_->add_node();
    n->set_name(fresh(t.name + "/" + std::string(step_kind_name(st.kind))));
    n->add_input(cur);
    n->add_output(next);
    if (st.kind == StepKind::local_slice) {
      n->set_op_type("Slice");
      auto before = slice_of(prop_.mesh, st.before, gshape, pos_);
      auto after = slice_of(prop_.mesh, st.after, gshape, pos_);
      std::vector<std::int64_t> starts, ends, axes;
      for (std::size_t d = 0; d < gshape.size(); ++d) {
        if (before[d] == after[d]) continue;
        starts.push_back(after[d].begin - before[d].begin);
        ends.push_back(after[d].end - before[d].begin);
        axes.push_back(static_cast<std::int64_t>(d));
      }
      std::string base = n->name();
      for (auto [suffix, v] : {std::pair{"starts", starts}, {"ends", ends}, {"axes", axes}}) {
        *out_->add_initializer() = int64_tensor(base + "/" + suffix, v);
        n->add_input(base + "/" + suffix);
      }
    } else {
      ++result_.comm_nodes;
      n->set_domain(std::string(dom::kDomain));
      auto group = group_of(st);
      if (group.empty()) return Error(Errc::internal, fmt::format("no group holds mesh position {}", pos_));
      switch (st.kind) {
        case StepKind::all_reduce:
          n->set_op_type(std::string(dom::kAllReduce));
          add_str_attr(n, dom::kAttrOp, reduce_op_name(st.op));
          break;
        case StepKind::all_gather:
          n->set_op_type(std::string(dom::kAllGather));
          add_int_attr(n, dom::kAttrAxis, st.dim);
          break;
        case StepKind::reduce_scatter:
          n->set_op_type(std::string(dom::kReduceScatter));
          add_int_attr(n, dom::kAttrAxis, st.dim);
          add_str_attr(n, dom::kAttrOp, reduce_op_name(st.op));
          break;
        case StepKind::all_to_all:
          n->set_op_type(std::string(dom::kAllToAll));
          add_int_attr(n, dom::kAttrSplitAxis, st.dim);
          add_int_attr(n, dom::kAttrConcatAxis, st.concat_dim);
          break;
        case StepKind::permute: {
          n->set_op_type(std::string(dom::kCollectivePermute));
          std::vector<std::int64_t> pairs;
          for (auto [a, b] : st.pairs) {
            pairs.push_back(rank_of(stage_, a));
            pairs.push_back(rank_of(stage_, b));
          }
          add_ints_attr(n, dom::kAttrPairs, pairs);
          break;
        }
        case StepKind::local_slice: break;
      }
      add_ints_attr(n, dom::kAttrGroup, group);
      // The manifest's name for this group: "<dp|tp>.s<stage>.<index>" (mesh axis 0 is dp, 1 is tp).
      std::size_t gi = 0;
      for (std::size_t q = 0; q < st.groups.size(); ++q)
        if (std::find(st.groups[q].begin(), st.groups[q].end(), pos_) != st.groups[q].end()) gi = q;
      if (st.axes.size() == 1)
        add_str_attr(n, dom::kAttrGroupName, fmt::format("{}.s{}.{}", st.axes[0] == 0 ? "dp" : "tp", s_, gi));
    }
    cur = next;
  }
  return cur;
}

// A Gather from a table split on the gathered axis (vocabulary-parallel embedding): look up the
// indices inside this rank's rows, zero the rest; the consumer's AllReduce adds the ranks' parts.
Status Builder::vocab_parallel_gather(int i, onnx::NodeProto n) {
  const auto& node = g_.node(i);
  int data = node.inputs[0];
  const Sharding& s = prop_.layout[static_cast<std::size_t>(data)];
  auto dshape = shape_of(g_.tensor(data));
  std::int64_t axis = 0;
  for (const auto& a : n.attribute())
    if (a.name() == "axis") axis = a.i();
  if (axis < 0) axis += static_cast<std::int64_t>(dshape.size());
  if (s.dims[static_cast<std::size_t>(axis)].empty()) {
    *out_->add_node() = std::move(n);
    return {};
  }
  if (axis != 0 || dshape.size() != 2)
    return Error(Errc::internal, fmt::format("'{}': only 2-D tables split on rows are gathered in parts", n.name()));
  auto rows = slice_of(prop_.mesh, s, dshape, pos_)[0];
  const auto& idx_t = g_.tensor(node.inputs[1]);
  std::int32_t it = idx_t.elem_type;
  std::string idx = n.input(1), out = n.output(0), base = out + "/vocab";
  std::string lo = scalar(base + "/lo", it, rows.begin), hi = scalar(base + "/hi", it, rows.end);
  std::string zero = scalar(base + "/zero", it, 0);
  op("GreaterOrEqual", {idx, lo}, fresh(base + "/ge"));
  std::string ge = out_->node(out_->node_size() - 1).output(0);
  op("Less", {idx, hi}, fresh(base + "/lt"));
  std::string lt = out_->node(out_->node_size() - 1).output(0);
  std::string in_range = fresh(base + "/in_range");
  op("And", {ge, lt}, in_range);
  std::string shifted = fresh(base + "/shifted");
  op("Sub", {idx, lo}, shifted);
  std::string local = fresh(base + "/local");
  op("Where", {in_range, shifted, zero}, local);
  std::string looked = fresh(base + "/rows");
  n.set_input(1, local);
  n.set_output(0, looked);
  *out_->add_node() = std::move(n);
  std::string mask = fresh(base + "/mask");
  auto* cast = op("Cast", {in_range}, mask);
  auto* to = cast->add_attribute();
  to->set_name("to");
  to->set_type(onnx::AttributeProto::INT);
  to->set_i(g_.tensor(data).elem_type);
  std::string mask3 = fresh(base + "/mask3");
  std::int64_t opset = 17;
  for (const auto& o : plan_.model->proto->opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  auto rank = static_cast<std::int64_t>(idx_t.dims.size());
  if (opset >= 13) {
    std::string axes = fresh(base + "/axes");
    *out_->add_initializer() = int64_tensor(axes, {rank});
    op("Unsqueeze", {mask, axes}, mask3);
  } else {
    auto* u = op("Unsqueeze", {mask}, mask3);
    add_ints_attr(u, "axes", {rank});
  }
  op("Mul", {looked, mask3}, out);
  return {};
}

// A Split whose axis arrives split (a blocked q|k|v tensor): each part is cut to its local size.
Status Builder::local_split_sizes(int i, onnx::NodeProto& n) {
  const auto& node = g_.node(i);
  const auto& read = prop_.reads[static_cast<std::size_t>(i)];
  if (node.inputs.empty() || node.inputs[0] < 0 || read.empty()) return {};
  auto rank = static_cast<std::int64_t>(read[0].dims.size());
  std::int64_t axis = 0;
  for (const auto& a : n.attribute())
    if (a.name() == "axis") axis = a.i();
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank || read[0].dims[static_cast<std::size_t>(axis)].empty()) return {};
  std::vector<std::int64_t> sizes;
  for (int o : node.outputs) {
    if (o < 0) return Error(Errc::internal, fmt::format("split '{}' has an unnamed output", n.name()));
    sizes.push_back(local(o, prop_.layout[static_cast<std::size_t>(o)])[static_cast<std::size_t>(axis)]);
  }
  if (n.input_size() > 1 && !n.input(1).empty()) {
    std::string cname = fresh((n.name().empty() ? g_.tensor(node.outputs[0]).name : n.name()) + "/local_split");
    *out_->add_initializer() = int64_tensor(cname, sizes);
    n.set_input(1, cname);
  }
  for (auto& a : *n.mutable_attribute())
    if (a.name() == "split") {
      a.clear_ints();
      for (auto x : sizes) a.add_ints(x);
    }
  return {};
}

Status Builder::add_initializer(int t) {
  if (!inits_.insert(t).second) return {};
  const auto& tensor = g_.tensor(t);
  const onnx::TensorProto* src = nullptr;
  for (const auto& i : pg_.initializer())
    if (i.name() == tensor.name) src = &i;
  if (!src) return Error(Errc::internal, fmt::format("initializer '{}' not found", tensor.name));
  const Sharding& s = prop_.layout[static_cast<std::size_t>(t)];
  auto gshape = shape_of(tensor);
  auto lshape = local_shape(prop_.mesh, s, gshape, pos_);
  onnx::TensorProto* dst = out_->add_initializer();
  dst->set_name(tensor.name);
  dst->set_data_type(src->data_type());
  for (auto d : lshape) dst->add_dims(d);
  auto bytes = detail::tensor_bytes(*src, plan_.model->path.parent_path());
  if (!bytes) return std::move(bytes).error();
  int elem = model::elem_size(src->data_type());
  if (!bytes->has_value()) {
    // Shapes only: the weights are not there to slice. The file names a data file that is not written.
    result_.weights_written = false;
    dst->set_data_location(onnx::TensorProto::EXTERNAL);
    auto* kv = dst->add_external_data();
    kv->set_key("location");
    kv->set_value("weights-not-written.bin");
    auto* len = dst->add_external_data();
    len->set_key("length");
    len->set_value(std::to_string(prod(lshape) * elem));
    return {};
  }
  if (static_cast<std::int64_t>((*bytes)->size()) != prod(gshape) * elem)
    return Error(Errc::bad_input, fmt::format("initializer '{}' holds {} bytes, its shape needs {}", tensor.name,
                                              (*bytes)->size(), prod(gshape) * elem));
  // A blocked (fused q|k|v) weight holds its piece of every block: contiguous in the held view.
  HeldView v = held_view(prop_, t, gshape);
  std::string data = detail::slice_bytes(**bytes, v.shape, slice_of(prop_.mesh, v.layout, v.shape, pos_), elem);
  if (!s.partial.empty()) {
    std::int64_t n = 1;
    for (const auto& p : s.partial) n *= prop_.mesh.dims[static_cast<std::size_t>(p.axis)];
    HP_TRY(detail::divide_elements(data, src->data_type(), n, tensor.name));
  }
  result_.weight_bytes += static_cast<std::int64_t>(data.size());
  dst->set_raw_data(std::move(data));
  return {};
}

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

  std::set<int> in_stage(stage_.nodes.begin(), stage_.nodes.end());
  // Graph inputs read here.
  std::set<int> used;
  for (int i : stage_.nodes)
    for (int t : g_.node(i).inputs)
      if (t >= 0) used.insert(t);
  for (int t : g_.inputs)
    if (used.count(t)) {
      const auto& tensor = g_.tensor(t);
      set_value_info(out_->add_input(), tensor.name, tensor.elem_type, local(t, prop_.layout[static_cast<std::size_t>(t)]));
    }
  // Activations from earlier stages.
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
    add_ints_attr(n, dom::kAttrShape, local(b.tensor, prop_.layout[static_cast<std::size_t>(b.tensor)]));
    ++result_.recvs;
  }
  // Graph outputs that need their layout changed are renamed where produced.
  std::map<std::string, std::string> rename;
  std::map<int, const Redistribution*> out_redist;
  for (const auto& r : prop_.redistributions)
    if (r.node < 0) {
      out_redist[r.tensor] = &r;
      rename[g_.tensor(r.tensor).name] = g_.tensor(r.tensor).name + ".hp_pre";
    }
  auto renamed = [&](const std::string& s) {
    auto it = rename.find(s);
    return it == rename.end() ? s : it->second;
  };
  std::map<std::pair<int, int>, std::string> redist_done;  // (tensor, redistribution index) -> name
  std::map<int, std::vector<std::size_t>> redist_by_node;
  for (std::size_t k = 0; k < prop_.redistributions.size(); ++k)
    if (prop_.redistributions[k].node >= 0) redist_by_node[prop_.redistributions[k].node].push_back(k);

  for (int i : stage_.nodes) {
    const auto& node = g_.node(i);
    const onnx::NodeProto& pn = pg_.node(i);
    if (pn.op_type() == "Shape" || pn.op_type() == "Size") {
      // The global shape as a constant: shape arithmetic computes what it did unsharded.
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
      continue;
    }
    onnx::NodeProto n = pn;
    // Inputs: redistributed where propagation said so.
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      int t = node.inputs[k];
      if (t < 0) continue;
      const auto& tensor = g_.tensor(t);
      if (tensor.kind == model::TensorKind::initializer) HP_TRY(add_initializer(t));
      std::string name = renamed(pn.input(static_cast<int>(k)));
      for (std::size_t ri : redist_by_node[i]) {
        const auto& r = prop_.redistributions[ri];
        if (r.tensor != t || r.to != prop_.reads[static_cast<std::size_t>(i)][k]) continue;
        auto key = std::pair{t, static_cast<int>(ri)};
        // The same tensor redistributed the same way for another consumer is reused.
        for (const auto& [kk, v] : redist_done)
          if (kk.first == t && prop_.redistributions[static_cast<std::size_t>(kk.second)].to == r.to) key = kk;
        auto it = redist_done.find(key);
        if (it == redist_done.end()) {
          auto made = redistribute(t, name, r);
          if (!made) return std::move(made).error();
          it = redist_done.emplace(key, *made).first;
        }
        name = it->second;
        break;
      }
      n.set_input(static_cast<int>(k), name);
    }
    for (int j = 0; j < n.output_size(); ++j) n.set_output(j, renamed(n.output(j)));
    // Reshape/Expand targets: the local output shape.
    if ((pn.op_type() == "Reshape" || pn.op_type() == "Expand") && node.outputs[0] >= 0 && pn.input_size() > 1) {
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
        g_.tensor(node.inputs[0]).kind == model::TensorKind::initializer) {
      HP_TRY(vocab_parallel_gather(i, n));
      continue;
    }
    *out_->add_node() = std::move(n);
  }
  // Graph outputs produced here, in the layout propagation asked of them.
  for (int t : g_.outputs) {
    const auto& tensor = g_.tensor(t);
    int prod_node = tensor.producer;
    bool here = prod_node < 0 ? used.count(t) > 0 : in_stage.count(prod_node) > 0;
    if (!here) continue;
    Sharding s = prop_.layout[static_cast<std::size_t>(t)];
    auto it = out_redist.find(t);
    if (it != out_redist.end()) {
      auto made = redistribute(t, renamed(tensor.name), *it->second);
      if (!made) return std::move(made).error();
      onnx::NodeProto* id = out_->add_node();
      id->set_op_type("Identity");
      id->set_name(fresh("output"));
      id->add_input(*made);
      id->add_output(tensor.name);
      s = it->second->to;
    }
    set_value_info(out_->add_output(), tensor.name, tensor.elem_type, local(t, s));
  }
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
    if (!listed && !rename.count(tensor.name))
      set_value_info(out_->add_output(), tensor.name, tensor.elem_type,
                     local(b.tensor, prop_.layout[static_cast<std::size_t>(b.tensor)]));
  }
  if (!m.SerializeToString(&result_.onnx))
    return Error(Errc::internal, fmt::format("could not serialize the partition of rank {}", result_.rank));
  return result_;
}

}  // namespace

Expected<RankPartition> build_partition(const PartitionPlan& plan, int stage, std::int64_t position) {
  return Builder(plan, stage, position).build();
}

}  // namespace hp::shard
