// fold_weight_transposes, hoist_shape_reads and batch_norm_buffers (rewrite.h).
#include "rewrite.h"

#include <functional>
#include <map>
#include <set>
#include <string>

namespace hp::train::detail {

namespace {

onnx::NodeProto make(const std::string& op, std::vector<std::string> ins, std::string out,
                     const std::string& name) {
  onnx::NodeProto n;
  n.set_op_type(op);
  n.set_name(name);
  for (auto& i : ins) n.add_input(i);
  n.add_output(std::move(out));
  return n;
}

void add_i64(onnx::GraphProto& g, const std::string& name, std::vector<std::int64_t> v) {
  auto* t = g.add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<std::int64_t>(v.size()));
  for (auto x : v) t->add_int64_data(x);
}

}  // namespace

int fold_weight_transposes(onnx::GraphProto& g) {
  std::map<std::string, const onnx::TensorProto*> weights2d;
  for (const auto& t : g.initializer())
    if (t.dims_size() == 2 &&
        (t.data_type() == onnx::TensorProto::FLOAT || t.data_type() == onnx::TensorProto::DOUBLE))
      weights2d[t.name()] = &t;
  // Transposes of a 2-D weight: output -> weight.
  std::map<std::string, std::string> transposed;
  for (const auto& n : g.node()) {
    if (n.op_type() != "Transpose" || n.input_size() != 1 || !weights2d.count(n.input(0))) continue;
    bool swap = true;
    for (const auto& a : n.attribute())
      if (a.name() == "perm") swap = a.ints_size() == 2 && a.ints(0) == 1 && a.ints(1) == 0;
    if (swap) transposed[n.output(0)] = n.input(0);
  }
  if (transposed.empty()) return 0;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> out;
  int rewritten = 0;
  std::set<std::string> shapes_added;
  for (const auto& n : g.node()) {
    auto it = n.op_type() == "MatMul" && n.domain().empty() && n.input_size() == 2
                  ? transposed.find(n.input(1))
                  : transposed.end();
    if (it == transposed.end()) {
      *out.Add() = n;
      continue;
    }
    const onnx::TensorProto& w = *weights2d.at(it->second);
    const std::int64_t nrows = w.dims(0), k = w.dims(1);
    const std::string base = "hp_fold/" + std::to_string(rewritten++) + "/";
    const std::string rows = "hp_fold/rows_" + std::to_string(k);
    if (shapes_added.insert(rows).second) add_i64(g, rows, {-1, k});
    const std::string ncol = "hp_fold/n_" + std::to_string(nrows);
    if (shapes_added.insert(ncol).second) add_i64(g, ncol, {nrows});
    if (shapes_added.insert("hp_fold/zero").second) {
      add_i64(g, "hp_fold/zero", {0});
      add_i64(g, "hp_fold/minus_one", {-1});
    }
    *out.Add() = make("Shape", {n.input(0)}, base + "shape", base + "Shape");
    *out.Add() = make("Slice", {base + "shape", "hp_fold/zero", "hp_fold/minus_one"}, base + "lead",
                      base + "Slice");
    onnx::NodeProto cat =
        make("Concat", {base + "lead", ncol}, base + "out_shape", base + "Concat");
    auto* ax = cat.add_attribute();
    ax->set_name("axis");
    ax->set_type(onnx::AttributeProto::INT);
    ax->set_i(0);
    *out.Add() = cat;
    *out.Add() = make("Reshape", {n.input(0), rows}, base + "x2", base + "Reshape_in");
    onnx::NodeProto gemm = make("Gemm", {base + "x2", it->second}, base + "y2",
                                n.name().empty() ? base + "Gemm" : n.name());
    auto* tb = gemm.add_attribute();
    tb->set_name("transB");
    tb->set_type(onnx::AttributeProto::INT);
    tb->set_i(1);
    *out.Add() = gemm;
    *out.Add() =
        make("Reshape", {base + "y2", base + "out_shape"}, n.output(0), base + "Reshape_out");
  }
  g.mutable_node()->Swap(&out);
  return rewritten;
}

int hoist_shape_reads(onnx::GraphProto& g, int forward_nodes) {
  std::map<std::string, int> producer;
  for (int k = 0; k < g.node_size(); ++k)
    for (const auto& o : g.node(k).output())
      if (!o.empty()) producer[o] = k;
  std::map<int, std::vector<int>> after;  ///< producer (-1: input or weight) -> hoisted nodes
  std::vector<bool> hoisted(static_cast<std::size_t>(g.node_size()), false);
  for (int k = forward_nodes; k < g.node_size(); ++k) {
    const auto& n = g.node(k);
    if (n.op_type() != "Shape" || !n.domain().empty() || n.input_size() != 1) continue;
    auto it = producer.find(n.input(0));
    const int from = it == producer.end() ? -1 : it->second;
    if (from >= forward_nodes && from == k - 1) continue;  // next to its producer already
    after[from].push_back(k);
    hoisted[static_cast<std::size_t>(k)] = true;
  }
  if (after.empty()) return forward_nodes;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> order;
  // Recursive: a hoisted Shape node may itself be the input of another (Shape of a Shape).
  std::function<void(int)> place = [&](int from) {
    auto it = after.find(from);
    if (it == after.end()) return;
    for (int h : it->second) {
      order.Add()->Swap(g.mutable_node(h));
      place(h);
    }
  };
  place(-1);
  for (int k = 0; k < g.node_size(); ++k) {
    if (hoisted[static_cast<std::size_t>(k)]) continue;
    order.Add()->Swap(g.mutable_node(k));
    place(k);
  }
  int moved = 0;  // into the forward part
  for (const auto& [from, nodes] : after)
    if (from < forward_nodes) moved += static_cast<int>(nodes.size());
  g.mutable_node()->Swap(&order);
  return forward_nodes + moved;
}

std::vector<std::pair<std::string, std::string>> batch_norm_buffers(
    const onnx::GraphProto& g, int forward_nodes, std::map<std::string, std::string>& untrained) {
  std::set<std::string> inits, done;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  std::vector<std::pair<std::string, std::string>> stats;
  for (int k = 0; k < forward_nodes && k < g.node_size(); ++k) {
    const auto& n = g.node(k);
    if (n.op_type() != "BatchNormalization" || !(n.domain().empty() || n.domain() == "ai.onnx"))
      continue;
    bool training = false;
    for (const auto& a : n.attribute())
      training = training || (a.name() == "training_mode" && a.i());
    for (int j = 3; j < 5 && j < n.input_size(); ++j) {
      if (!inits.count(n.input(j))) continue;
      untrained.emplace(n.input(j), "a BatchNormalization running statistic (a buffer)");
      if (training && j - 2 < n.output_size() && !n.output(j - 2).empty() &&
          done.insert(n.input(j)).second)
        stats.emplace_back(n.input(j), n.output(j - 2));
    }
  }
  return stats;
}

}  // namespace hp::train::detail
