// The Builder's rewrites of single nodes and tensors (partition_builder.h): a recorded
// redistribution as hp-domain collectives or a local Slice, the vocabulary-parallel Gather, Split
// sizes of a split axis, and a weight's slice for this rank.
#include <fmt/core.h>

#include <algorithm>

#include "partition_builder.h"
#include "partition_weights.h"

namespace hp::shard::detail {

Expected<std::string> Builder::redistribute(int tensor, const std::string& name,
                                            const Redistribution& r) {
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
      if (group.empty())
        return Error(Errc::internal, fmt::format("no group holds mesh position {}", pos_));
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
      // The manifest's name for this group: "<dp|tp>.s<stage>.<index>" (mesh axis 0 is dp, 1 is
      // tp).
      std::size_t gi = 0;
      for (std::size_t q = 0; q < st.groups.size(); ++q)
        if (std::find(st.groups[q].begin(), st.groups[q].end(), pos_) != st.groups[q].end()) gi = q;
      if (st.axes.size() == 1)
        add_str_attr(n, dom::kAttrGroupName,
                     fmt::format("{}.s{}.{}", st.axes[0] == 0 ? "dp" : "tp", s_, gi));
    }
    redist_varying_[next] = varies_on_last_axis(prop_.mesh, st.after);
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
    return Error(
        Errc::internal,
        fmt::format("'{}': only 2-D tables split on rows are gathered in parts", n.name()));
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
    if (o < 0)
      return Error(Errc::internal, fmt::format("split '{}' has an unnamed output", n.name()));
    sizes.push_back(
        local(o, prop_.layout[static_cast<std::size_t>(o)])[static_cast<std::size_t>(axis)]);
  }
  if (n.input_size() > 1 && !n.input(1).empty()) {
    std::string cname =
        fresh((n.name().empty() ? g_.tensor(node.outputs[0]).name : n.name()) + "/local_split");
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
  HP_ASSIGN_OR_RETURN(auto bytes, detail::tensor_bytes(*src, plan_.model->path.parent_path()));
  int elem = model::elem_size(src->data_type());
  if (!bytes.has_value()) {
    // Shapes only: the weights are not there to slice. The file names a data file that is not
    // written.
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
  if (static_cast<std::int64_t>(bytes->size()) != prod(gshape) * elem)
    return Error(Errc::bad_input, fmt::format("initializer '{}' holds {} bytes, its shape needs {}",
                                              tensor.name, bytes->size(), prod(gshape) * elem));
  // A blocked (fused q|k|v) weight holds its piece of every block: contiguous in the held view.
  HeldView v = held_view(prop_, t, gshape);
  std::string data =
      detail::slice_bytes(*bytes, v.shape, slice_of(prop_.mesh, v.layout, v.shape, pos_), elem);
  if (!s.partial.empty()) {
    std::int64_t n = 1;
    for (const auto& p : s.partial) n *= prop_.mesh.dims[static_cast<std::size_t>(p.axis)];
    HP_TRY(detail::divide_elements(data, src->data_type(), n, tensor.name));
  }
  result_.weight_bytes += static_cast<std::int64_t>(data.size());
  dst->set_raw_data(std::move(data));
  return {};
}

}  // namespace hp::shard::detail
