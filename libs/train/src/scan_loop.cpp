// scans_to_loops (rewrite.h): every Scan as the Loop that computes the same, so its gradient is
// the Loop's (control_grad.cpp) instead of a second backpropagation through time.
#include <fmt/core.h>

#include "rewrite.h"

namespace hp::train::detail {

namespace {

std::vector<std::int64_t> ints_attr(const onnx::NodeProto& n, const char* name, std::size_t size) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return std::vector<std::int64_t>(a.ints().begin(), a.ints().end());
  return std::vector<std::int64_t>(size, 0);
}

onnx::NodeProto& node(google::protobuf::RepeatedPtrField<onnx::NodeProto>& list,
                      const std::string& op, const std::vector<std::string>& ins,
                      const std::string& out) {
  onnx::NodeProto& n = *list.Add();
  n.set_op_type(op);
  n.set_name(out + "/node");
  for (const auto& i : ins) n.add_input(i);
  n.add_output(out);
  return n;
}

void int_attr(onnx::NodeProto& n, const char* name, std::int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void scalar_init(onnx::GraphProto& g, const std::string& name, std::int64_t v) {
  auto* t = g.add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_int64_data(v);
}

void scalar_value(onnx::ValueInfoProto& v, const std::string& name, std::int32_t elem_type) {
  v.set_name(name);
  v.mutable_type()->mutable_tensor_type()->set_elem_type(elem_type);
  v.mutable_type()->mutable_tensor_type()->mutable_shape();
}

}  // namespace

Status scans_to_loops(onnx::GraphProto& g, std::int64_t opset) {
  int count = 0;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> out;
  for (const auto& n : g.node()) {
    if (n.op_type() != "Scan" || !(n.domain().empty() || n.domain() == "ai.onnx")) {
      *out.Add() = n;
      continue;
    }
    const std::string where =
        fmt::format("node '{}' (Scan)", n.name().empty() ? n.output(0) : n.name());
    if (opset < 9)
      return Error(Errc::bad_input, "a Scan of opset 8 (with sequence_lens) has no gradient rule",
                   where);
    const onnx::GraphProto* body = nullptr;
    std::int64_t m = 0;
    for (const auto& a : n.attribute()) {
      if (a.name() == "body" && a.type() == onnx::AttributeProto::GRAPH) body = &a.g();
      if (a.name() == "num_scan_inputs") m = a.i();
    }
    const int states = n.input_size() - static_cast<int>(m);
    const int scans = n.output_size() - states;
    if (!body || m < 1 || states < 0 || scans < 0 || body->input_size() != n.input_size() ||
        body->output_size() != n.output_size())
      return Error(Errc::bad_input, "the Scan's body does not match its inputs and outputs", where);
    const auto in_axes = ints_attr(n, "scan_input_axes", static_cast<std::size_t>(m));
    const auto in_dirs = ints_attr(n, "scan_input_directions", static_cast<std::size_t>(m));
    const auto out_axes = ints_attr(n, "scan_output_axes", static_cast<std::size_t>(scans));
    const auto out_dirs = ints_attr(n, "scan_output_directions", static_cast<std::size_t>(scans));
    for (auto a : out_axes)
      if (a != 0)
        return Error(Errc::bad_input,
                     "a Scan stacking an output along an axis other than 0 has no gradient rule",
                     where);
    const std::string p = fmt::format("hp_scan{}/", count++);
    // The trip count: the first scan input's length along its scan axis.
    scalar_init(g, p + "axis", in_axes[0]);
    scalar_init(g, p + "one", 1);
    scalar_init(g, p + "minus_one", -1);
    node(out, "Shape", {n.input(states)}, p + "shape");
    node(out, "Gather", {p + "shape", p + "axis"}, p + "trips");
    node(out, "Sub", {p + "trips", p + "one"}, p + "last");

    // The Loop's body: the Scan's, its scan inputs sliced from the outer tensors at the iteration
    // (counted from the end for a reversed input).
    onnx::NodeProto& loop = *out.Add();
    loop.set_op_type("Loop");
    loop.set_name(n.name().empty() ? p + "loop" : n.name());
    loop.add_input(p + "trips");
    loop.add_input("");
    for (int j = 0; j < states; ++j) loop.add_input(n.input(j));
    auto* attr = loop.add_attribute();
    attr->set_name("body");
    attr->set_type(onnx::AttributeProto::GRAPH);
    onnx::GraphProto& lb = *attr->mutable_g();
    lb.set_name(body->name());
    // Both scalars, declared so (shape inference of the slices needs the index's rank).
    scalar_value(*lb.add_input(), p + "iter", onnx::TensorProto::INT64);
    scalar_value(*lb.add_input(), p + "cond", onnx::TensorProto::BOOL);
    for (int j = 0; j < states; ++j) *lb.add_input() = body->input(j);
    *lb.mutable_initializer() = body->initializer();
    for (std::int64_t s = 0; s < m; ++s) {
      const auto k = static_cast<std::size_t>(s);
      std::string index = p + "iter";
      if (in_dirs[k] != 0) {
        index = fmt::format("{}index{}", p, s);
        node(*lb.mutable_node(), "Sub", {p + "last", p + "iter"}, index);
      }
      int_attr(node(*lb.mutable_node(), "Gather", {n.input(states + static_cast<int>(s)), index},
                    body->input(states + static_cast<int>(s)).name()),
               "axis", in_axes[k]);
    }
    for (const auto& bn : body->node()) *lb.add_node() = bn;
    node(*lb.mutable_node(), "Identity", {p + "cond"}, p + "cond_out");
    scalar_value(*lb.add_output(), p + "cond_out", onnx::TensorProto::BOOL);
    for (const auto& o : body->output()) *lb.add_output() = o;

    // Outputs: the final states, and each scan output stacked in iteration order (reversed back
    // for a reversed output).
    for (int j = 0; j < states; ++j) loop.add_output(n.output(j));
    for (int k = 0; k < scans; ++k) {
      const std::string& o = n.output(states + k);
      if (out_dirs[static_cast<std::size_t>(k)] == 0) {
        loop.add_output(o);
        continue;
      }
      const std::string stacked = fmt::format("{}stacked{}", p, k);
      loop.add_output(stacked);
      node(out, "Range", {p + "last", p + "minus_one", p + "minus_one"},
           fmt::format("{}reversed{}", p, k));
      node(out, "Gather", {stacked, fmt::format("{}reversed{}", p, k)}, o);
    }
  }
  g.mutable_node()->Swap(&out);
  return {};
}

}  // namespace hp::train::detail
