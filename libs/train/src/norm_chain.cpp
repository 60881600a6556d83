// The layer norm PyTorch exports as primitives, found so autodiff differentiates it as one op
// (rewrite.h).
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "hp/model/graph.h"
#include "rewrite.h"

namespace hp::train::detail {

namespace {

/// A ReduceMean's axes (the attribute, or the second input from opset 18) when it keeps its dims.
std::optional<std::vector<std::int64_t>> mean_axes(const GraphWriter& w, const onnx::NodeProto& n) {
  if (n.op_type() != "ReduceMean" || !(n.domain().empty() || n.domain() == "ai.onnx") ||
      n.output_size() != 1)
    return std::nullopt;
  std::optional<std::vector<std::int64_t>> axes;
  for (const auto& a : n.attribute()) {
    if (a.name() == "keepdims" && a.i() == 0) return std::nullopt;
    if (a.name() == "axes") axes = std::vector<std::int64_t>(a.ints().begin(), a.ints().end());
  }
  if (!axes && n.input_size() >= 2 && !n.input(1).empty()) axes = w.const_ints(n.input(1));
  return axes;
}

}  // namespace

std::map<int, onnx::NodeProto> find_layer_norm_chains(
    const GraphWriter& w, int forward_nodes, const std::vector<std::set<std::string>>& reads) {
  std::map<int, onnx::NodeProto> tails;
  const auto& g = *w.graph;
  std::map<std::string, int> readers;
  for (int k = 0; k < forward_nodes; ++k)
    for (const auto& i : reads[static_cast<std::size_t>(k)]) ++readers[i];
  for (const auto& o : g.output()) ++readers[o.name()];
  // The nodes among the forward's that read `t` (each once).
  auto readers_of = [&](const std::string& t) {
    std::vector<int> r;
    for (int k = 0; k < forward_nodes; ++k)
      if (reads[static_cast<std::size_t>(k)].count(t)) r.push_back(k);
    return r;
  };
  auto sole_reader = [&](const std::string& t) -> const onnx::NodeProto* {
    if (readers[t] != 1) return nullptr;
    auto r = readers_of(t);
    return r.size() == 1 ? &g.node(r[0]) : nullptr;
  };
  // A constant the chain reads: a Constant node's output of rank 0 or 1. An initializer would be
  // trained as a parameter of its own, which LayerNormalization's eps cannot be.
  std::set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  auto constant = [&](const std::string& t) -> std::optional<double> {
    auto dims = w.static_shape(t);
    if (inits.count(t) || !dims || dims->size() > 1) return std::nullopt;
    return w.const_scalar(t);
  };
  auto is = [](const onnx::NodeProto* n, const char* op, int inputs) {
    return n && n->op_type() == op && (n->domain().empty() || n->domain() == "ai.onnx") &&
           n->input_size() == inputs && n->output_size() == 1;
  };
  for (int k = 0; k < forward_nodes; ++k) {
    const auto& mean_node = g.node(k);
    auto axes = mean_axes(w, mean_node);
    if (!axes || axes->empty() || mean_node.input_size() < 1) continue;
    const std::string& x = mean_node.input(0);
    const int rank = w.rank(x);
    const int xi = w.fwd->find_tensor(w.original(x));
    if (rank < 1 || xi < 0) continue;
    // The normalised axes must be the last ones: LayerNormalization's axis and all after it.
    std::vector<std::int64_t> ax = *axes;
    for (auto& a : ax) a = a < 0 ? a + rank : a;
    std::sort(ax.begin(), ax.end());
    bool suffix = true;
    for (std::size_t j = 0; j < ax.size(); ++j)
      suffix = suffix && ax[j] == rank - static_cast<std::int64_t>(ax.size() - j);
    if (!suffix) continue;
    std::vector<std::int64_t> normalised;
    for (std::int64_t d = ax.front(); d < rank; ++d) {
      const auto& dim = w.fwd->tensor(xi).dims[static_cast<std::size_t>(d)];
      if (!dim.known()) suffix = false;
      normalised.push_back(dim.value);
    }
    if (!suffix) continue;
    // mean -> Sub(x, mean) -> Pow(d, 2) -> ReduceMean -> Add eps -> Sqrt -> Div(d, .) -> Mul gamma
    // [-> Add beta], every intermediate read by the chain alone (d by the Pow and the Div).
    const onnx::NodeProto* sub = sole_reader(mean_node.output(0));
    if (!is(sub, "Sub", 2) || sub->input(0) != x || sub->input(1) != mean_node.output(0)) continue;
    const std::string& d = sub->output(0);
    auto dr = readers_of(d);
    if (readers[d] != 2 || dr.size() != 2) continue;
    const onnx::NodeProto* pow = &g.node(dr[0]);
    const onnx::NodeProto* div = &g.node(dr[1]);
    if (pow->op_type() == "Div") std::swap(pow, div);
    auto two =
        is(pow, "Pow", 2) && pow->input(0) == d ? constant(pow->input(1)) : std::optional<double>();
    if (!two || *two != 2.0) continue;
    const onnx::NodeProto* var = sole_reader(pow->output(0));
    if (!var || mean_axes(w, *var) != axes || var->input(0) != pow->output(0)) continue;
    const onnx::NodeProto* add = sole_reader(var->output(0));
    if (!is(add, "Add", 2)) continue;
    const std::string& eps_name = add->input(0) == var->output(0) ? add->input(1) : add->input(0);
    auto eps = constant(eps_name);
    if (!eps || *eps < 0) continue;
    const onnx::NodeProto* sqrt = sole_reader(add->output(0));
    if (!is(sqrt, "Sqrt", 1) || sole_reader(sqrt->output(0)) != div) continue;
    if (!is(div, "Div", 2) || div->input(0) != d || div->input(1) != sqrt->output(0)) continue;
    const onnx::NodeProto* mul = sole_reader(div->output(0));
    if (!is(mul, "Mul", 2)) continue;
    const std::string& gamma = mul->input(0) == div->output(0) ? mul->input(1) : mul->input(0);
    if (gamma == div->output(0) || w.static_shape(gamma) != normalised) continue;
    const onnx::NodeProto* tail = mul;
    std::string beta;
    if (const onnx::NodeProto* bias = sole_reader(mul->output(0)); is(bias, "Add", 2)) {
      beta = bias->input(0) == mul->output(0) ? bias->input(1) : bias->input(0);
      if (w.static_shape(beta) == normalised && beta != mul->output(0))
        tail = bias;
      else
        beta.clear();
    }
    int t = -1;  // the tail's index (a repeated field's elements keep their addresses)
    for (int j = k + 1; j < forward_nodes && t < 0; ++j)
      if (&g.node(j) == tail) t = j;
    if (t < 0) continue;
    onnx::NodeProto ln;
    ln.set_op_type("LayerNormalization");
    ln.set_name(tail->name());
    ln.add_input(x);
    ln.add_input(gamma);
    if (!beta.empty()) ln.add_input(beta);
    ln.add_output(tail->output(0));
    auto* axis = ln.add_attribute();
    axis->set_name("axis");
    axis->set_type(onnx::AttributeProto::INT);
    axis->set_i(ax.front() - rank);
    auto* e = ln.add_attribute();
    e->set_name("epsilon");
    e->set_type(onnx::AttributeProto::FLOAT);
    e->set_f(static_cast<float>(*eps));
    tails[t] = std::move(ln);
  }
  return tails;
}

}  // namespace hp::train::detail
