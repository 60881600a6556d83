// Expert layers written as an accumulation (expert_accumulate.h).
#include "expert_accumulate.h"

#include <algorithm>
#include <map>
#include <optional>

namespace hp::train::detail {

namespace {

// Ops a region may hold: elementwise and row-wise ones, the index ops the loop uses to pick a
// token's rows and put them back (NonZero, Gather, ScatterElements), and shape arithmetic.
const std::set<std::string>& region_ops() {
  // clang-format off
  static const std::set<std::string> ops = {
      "Add", "Sub", "Mul", "Div", "Neg", "Pow", "Sqrt", "Exp", "Log", "Erf", "Tanh", "Sigmoid",
      "Relu", "Gelu", "Max", "Min", "Clip", "Where", "Equal", "Less", "Greater", "Not", "And", "Or",
      "Cast", "Identity", "Gemm", "MatMul", "Softmax", "TopK", "ReduceSum", "ReduceMean",
      "ReduceMax", "OneHot", "Transpose", "Gather", "GatherElements", "NonZero", "Split",
      "Squeeze", "Unsqueeze", "Flatten", "Reshape", "Expand", "Slice", "Concat", "Shape",
      "ConstantOfShape", "ScatterElements", "ScatterND", "Range", "Constant"};
  // clang-format on
  return ops;
}

// Whether ConstantOfShape node n fills with zeros (its value absent or zero).
bool zero_fill(const onnx::NodeProto& n) {
  for (const auto& a : n.attribute()) {
    if (a.name() != "value") continue;
    const auto& t = a.t();
    if (!t.float_data().empty()) return t.float_data(0) == 0.0f;
    if (t.data_type() == onnx::TensorProto::FLOAT && t.raw_data().size() == 4) {
      float v = 0;
      std::memcpy(&v, t.raw_data().data(), 4);
      return v == 0.0f;
    }
    return false;
  }
  return true;
}

// What a tensor's values come from: the data (rows of tokens), shapes only, weights only, or
// constants. The region may read from outside only data: a shape-derived scalar or a weight
// gathered over the group would be wrong (or counted once per member).
enum class Origin { constant, weight, shape, data };

std::map<std::string, Origin> origins(const Index& ix) {
  std::map<std::string, Origin> out;
  for (const auto& i : ix.g.input()) out[i.name()] = Origin::data;
  for (const auto& [name, t] : ix.inits)
    out[name] = is_float_type(t->data_type()) ? Origin::weight : Origin::constant;
  for (const auto& n : ix.g.node()) {  // graph order is topological
    Origin o = Origin::constant;
    if (n.op_type() == "Shape" || n.op_type() == "Size") {
      o = Origin::shape;
    } else if (n.op_type() != "Constant") {
      for (const auto& x : n.input())
        if (auto it = out.find(x); !x.empty() && it != out.end()) o = std::max(o, it->second);
    }
    for (const auto& y : n.output())
      if (!y.empty()) out[y] = o;
  }
  return out;
}

// The dims of `t` when it is a float tensor of zeros.
std::optional<std::vector<std::int64_t>> zero_tensor(const onnx::TensorProto& t) {
  // (Weights stored outside the file have no values here: not known to be zeros.)
  if (t.data_type() != onnx::TensorProto::FLOAT || t.data_location() == onnx::TensorProto::EXTERNAL)
    return std::nullopt;
  for (float v : t.float_data())
    if (v != 0.0f) return std::nullopt;
  for (char c : t.raw_data())
    if (c != 0) return std::nullopt;
  return std::vector<std::int64_t>(t.dims().begin(), t.dims().end());
}

// A constant of zeros: an initializer or a Constant node's value.
std::optional<std::vector<std::int64_t>> zero_constant(const Index& ix, const std::string& x) {
  if (auto it = ix.inits.find(x); it != ix.inits.end()) return zero_tensor(*it->second);
  auto p = ix.producer.find(x);
  if (p == ix.producer.end() || ix.g.node(p->second).op_type() != "Constant") return std::nullopt;
  for (const auto& a : ix.g.node(p->second).attribute())
    if (a.name() == "value") return zero_tensor(a.t());
  return std::nullopt;
}

bool float_init(const Index& ix, const std::string& x) {
  auto it = ix.inits.find(x);
  return it != ix.inits.end() && is_float_type(it->second->data_type());
}

// Whether node `n` reduces, normalises or picks along its first input's rows (as far as the shapes
// show: a tensor whose rows NonZero decides is not checked).
bool along_rows(const Index& ix, const onnx::NodeProto& n, const RowChecks& rows) {
  static const std::set<std::string> by_axis = {"Softmax", "LogSoftmax", "TopK",
                                                "ArgMax",  "ArgMin",     "CumSum"};
  const bool reduce = n.op_type().rfind("Reduce", 0) == 0;
  if ((!reduce && !by_axis.count(n.op_type())) || n.input_size() == 0) return false;
  const auto at = rows.rows_axis(n.input(0));
  if (!at) return false;
  const auto [row, rank] = *at;
  auto norm = [rank = rank](std::int64_t a) { return a < 0 ? a + rank : a; };
  if (!reduce) {
    const std::int64_t dflt =
        n.op_type() == "Softmax" || n.op_type() == "LogSoftmax" || n.op_type() == "TopK" ? -1 : 0;
    if (n.op_type() == "CumSum") {
      auto axis = n.input_size() > 1 ? ix.ints(n.input(1)) : std::nullopt;
      return !axis || axis->empty() || norm((*axis)[0]) == row;
    }
    return norm(attr_int(n, "axis", dflt)) == row;
  }
  std::optional<std::vector<std::int64_t>> axes;
  for (const auto& a : n.attribute())
    if (a.name() == "axes") axes = std::vector<std::int64_t>(a.ints().begin(), a.ints().end());
  if (!axes && n.input_size() > 1 && !n.input(1).empty()) axes = ix.ints(n.input(1));
  if (!axes || axes->empty()) return true;  // every axis, the rows' among them
  return std::any_of(axes->begin(), axes->end(), [&](std::int64_t a) { return norm(a) == row; });
}

// The experts of the chain starting at `zeros`: as many leading contributions as pass the test.
std::optional<AccumulatedLayer> layer_from(const Index& ix,
                                           const std::map<std::string, Origin>& origin,
                                           const RowChecks& rows, const std::string& zeros) {
  auto from = [&](const std::string& x) {
    auto it = origin.find(x);
    return it == origin.end() ? Origin::data : it->second;
  };
  AccumulatedLayer l;
  l.start = zeros;
  std::vector<std::string> contrib;
  std::string cur = zeros;
  for (;;) {
    auto r = ix.readers.find(cur);
    if (r == ix.readers.end()) break;
    int next = -1, adds = 0;
    for (int k : r->second)
      if (ix.g.node(k).op_type() == "Add" && ix.g.node(k).input_size() == 2) next = k, ++adds;
    if (adds != 1) break;
    const auto& a = ix.g.node(next);
    const std::string other = a.input(0) == cur ? a.input(1) : a.input(0);
    if (other == cur) break;
    l.adds.push_back(next);
    l.prev.push_back(cur);
    contrib.push_back(other);
    cur = a.output(0);
  }
  // A term that reads the sum's values (the next block, after a residual add) ends the chain.
  const std::set<int> chain(l.adds.begin(), l.adds.end());
  std::vector<std::set<int>> cones;
  for (std::size_t i = 0; i < contrib.size(); ++i) {
    auto cone = ix.ancestors(contrib[i], true);
    if (std::any_of(cone.begin(), cone.end(), [&](int k) { return chain.count(k) > 0; })) {
      contrib.resize(i);
      l.adds.resize(i);
      l.prev.resize(i);
      break;
    }
    cones.push_back(std::move(cone));
  }
  std::map<int, int> count;
  for (const auto& cone : cones)
    for (int k : cone) ++count[k];
  std::set<std::string> taken;  // every expert's weights
  for (std::size_t i = 0; i < contrib.size(); ++i) {
    std::set<int> mine;  // (a Constant is shared by whoever reads it: exporters reuse them)
    for (int k : cones[i])
      if (count[k] == 1 && ix.g.node(k).op_type() != "Constant") mine.insert(k);
    std::vector<std::string> weights;
    bool ok = !mine.empty();
    for (int k : mine) {
      const auto& n = ix.g.node(k);
      for (const auto& x : n.input())
        if (float_init(ix, x)) {
          for (int reader : ix.readers.at(x)) ok = ok && mine.count(reader);
          if (std::find(weights.begin(), weights.end(), x) == weights.end()) weights.push_back(x);
        }
      for (const auto& o : n.output()) {
        if (o.empty()) continue;
        ok = ok && !ix.graph_outputs.count(o);
        if (auto r = ix.readers.find(o); r != ix.readers.end())
          for (int reader : r->second)
            ok = ok && (mine.count(reader) || (o == contrib[i] && reader == l.adds[i]));
      }
    }
    if (!ok || weights.empty()) {  // the chain goes on past the experts (a residual add)
      l.adds.resize(i);
      l.prev.resize(i);
      break;
    }
    l.nodes.emplace_back(mine.begin(), mine.end());
    taken.insert(weights.begin(), weights.end());
    l.weights.push_back(std::move(weights));
  }
  if (l.nodes.size() < 2) return std::nullopt;
  l.sum = ix.g.node(l.adds.back()).output(0);
  // The region: the sum and what only it needs, back to the tokens and the shared weights' readers.
  l.region.insert(l.adds.begin(), l.adds.end());
  for (const auto& n : l.nodes) l.region.insert(n.begin(), n.end());
  const auto made = ix.producer.find(zeros);
  const bool computed =
      made != ix.producer.end() && ix.g.node(made->second).op_type() != "Constant";
  if (computed) {
    l.region.insert(made->second);
    // Zeros of a constant shape (torch.zeros((n, d)) at static shapes): scaled as a folded
    // constant is; a shape computed from constants alone cannot be.
    const auto& shape_in = ix.g.node(made->second).input(0);
    if (from(shape_in) == Origin::constant) {
      auto dims = ix.ints(shape_in);
      if (!dims || dims->empty()) return std::nullopt;
      l.start_dims = *dims;
    }
  } else if (auto dims = zero_constant(ix, zeros); dims && !dims->empty()) {
    l.start_dims = *dims;
  } else {
    return std::nullopt;
  }
  for (bool grew = true; grew;) {
    grew = false;
    for (int k = ix.g.node_size() - 1; k >= 0; --k) {
      if (l.region.count(k)) continue;
      const auto& n = ix.g.node(k);
      if (n.op_type() == "Constant" || n.output_size() == 0) continue;
      bool only = true, read = false;
      for (const auto& x : n.input()) {  // only data, constants and the region's own values
        if (x.empty() || from(x) == Origin::constant) continue;
        auto p = ix.producer.find(x);
        only = only &&
               (from(x) == Origin::data || (p != ix.producer.end() && l.region.count(p->second)));
      }
      for (const auto& o : n.output()) {
        if (o.empty()) continue;
        only = only && !ix.graph_outputs.count(o);
        if (auto r = ix.readers.find(o); r != ix.readers.end())
          for (int reader : r->second) only = only && l.region.count(reader), read = true;
      }
      if (only && read) l.region.insert(k), grew = true;
    }
  }
  for (int k : l.region) {
    const auto& n = ix.g.node(k);
    if (!region_ops().count(n.op_type()) || !(n.domain().empty() || n.domain() == "ai.onnx"))
      return std::nullopt;
    for (const auto& x : n.input()) {
      if (x.empty() || ix.constant(x) || x == zeros) continue;
      // torch.zeros((n, d)): the zeros' shape, from this member's rows, scaled in the partition.
      if (computed && k == made->second && from(x) == Origin::shape &&
          !l.region.count(ix.producer.count(x) ? ix.producer.at(x) : -1)) {
        l.start_shape = x;
        continue;
      }
      if (float_init(ix, x)) {
        if (!taken.count(x)) return std::nullopt;  // a shared weight inside: not this pattern
        continue;
      }
      auto p = ix.producer.find(x);
      if (p != ix.producer.end() && l.region.count(p->second)) continue;
      if (from(x) == Origin::shape && rows.shape_free && rows.shape_free(x))
        continue;                                        // e.g. the hidden size
      if (from(x) != Origin::data) return std::nullopt;  // a shape or a weight from outside
      if (std::find(l.frontier.begin(), l.frontier.end(), x) == l.frontier.end())
        l.frontier.push_back(x);
    }
  }
  if (l.frontier.empty()) return std::nullopt;
  // Only the sum leaves the region: any other of its values, read outside, would be a partial sum
  // over every member's rows there.
  for (int k : l.region)
    for (const auto& o : ix.g.node(k).output()) {
      if (o.empty() || o == l.sum) continue;
      if (ix.graph_outputs.count(o)) return std::nullopt;
      if (auto r = ix.readers.find(o); r != ix.readers.end())
        for (int reader : r->second)
          if (!l.region.count(reader)) return std::nullopt;
    }
  // Row-wise: no softmax, top-k or reduction along the rows, where the shapes show them.
  if (rows.rows_axis)
    for (int k : l.region)
      if (along_rows(ix, ix.g.node(k), rows)) return std::nullopt;
  // What is gathered must have the rows on axis 0, and so must the sum that is reduce-scattered.
  if (rows.rows_first) {
    for (const auto& f : l.frontier)
      if (rows.rows_first(f) == false) return std::nullopt;
    if (rows.rows_first(l.sum) == false) return std::nullopt;
  }
  return l;
}

}  // namespace

std::vector<AccumulatedLayer> find_accumulated_layers(const Index& ix, const RowChecks& rows) {
  std::vector<AccumulatedLayer> out;
  const auto origin = origins(ix);
  for (int k = 0; k < ix.g.node_size(); ++k) {
    const auto& n = ix.g.node(k);
    if (n.op_type() != "ConstantOfShape" || n.output_size() != 1 || !zero_fill(n)) continue;
    if (auto l = layer_from(ix, origin, rows, n.output(0))) out.push_back(std::move(*l));
  }
  // Zeros the exporter folded into a constant (zeros_like at static shapes).
  std::set<std::string> consts;
  for (const auto& [name, t] : ix.inits) consts.insert(name);
  for (const auto& n : ix.g.node())
    if (n.op_type() == "Constant" && n.output_size() == 1) consts.insert(n.output(0));
  for (const auto& c : consts)
    if (zero_constant(ix, c))
      if (auto l = layer_from(ix, origin, rows, c)) out.push_back(std::move(*l));
  // In graph order, so that one layer's reduce-scatter comes before a later layer's gathers.
  std::sort(out.begin(), out.end(), [](const AccumulatedLayer& a, const AccumulatedLayer& b) {
    return a.adds.front() < b.adds.front();
  });
  return out;
}

}  // namespace hp::train::detail
