// control_flow_grad (control_grad.h): the backward of If and Loop, each subgraph differentiated by
// build_grad_graph as a model of its own.
#include "control_grad.h"

#include <fmt/core.h>

#include <map>
#include <set>

#include "graph_parts.h"

namespace hp::train::detail {

namespace {

onnx::GraphProto* graph_attr(onnx::NodeProto& n, const char* name) {
  for (auto& a : *n.mutable_attribute())
    if (a.name() == name && a.type() == onnx::AttributeProto::GRAPH) return a.mutable_g();
  return nullptr;
}

/// A node drawing random values, anywhere in `g`: recomputing it would draw other values.
const onnx::NodeProto* random_node(const onnx::GraphProto& g) {
  static const std::set<std::string> random = {
      "Dropout",           "RandomNormal", "RandomNormalLike", "RandomUniform",
      "RandomUniformLike", "Bernoulli",    "Multinomial"};
  for (const auto& n : g.node()) {
    if (random.count(n.op_type())) return &n;
    for (const auto& a : n.attribute()) {
      if (a.has_g())
        if (const auto* r = random_node(a.g())) return r;
      for (const auto& sg : a.graphs())
        if (const auto* r = random_node(sg)) return r;
    }
  }
  return nullptr;
}

/// Every name `g` defines at any depth (its own inputs only below the top).
void collect_defined(const onnx::GraphProto& g, bool top, std::set<std::string>& out) {
  if (!top)
    for (const auto& v : g.input()) out.insert(v.name());
  for (const auto& t : g.initializer()) out.insert(t.name());
  for (const auto& n : g.node()) {
    for (const auto& o : n.output())
      if (!o.empty()) out.insert(o);
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_defined(a.g(), false, out);
      for (const auto& sg : a.graphs()) collect_defined(sg, false, out);
    }
  }
}

/// Renames every occurrence of the map's names in `g` and its subgraphs, and prefixes node names
/// (a subgraph copied twice, as the forward and inside its backward, keeps names unique).
void substitute(onnx::GraphProto& g, const std::map<std::string, std::string>& m,
                const std::string& prefix) {
  auto sub = [&](std::string& s) {
    auto it = m.find(s);
    if (it != m.end()) s = it->second;
  };
  for (auto& v : *g.mutable_input()) sub(*v.mutable_name());
  for (auto& v : *g.mutable_output()) sub(*v.mutable_name());
  for (auto& t : *g.mutable_initializer()) sub(*t.mutable_name());
  g.clear_value_info();
  for (auto& n : *g.mutable_node()) {
    for (auto& i : *n.mutable_input()) sub(i);
    for (auto& o : *n.mutable_output()) sub(o);
    n.set_name(prefix + n.name());
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) substitute(*a.mutable_g(), m, prefix);
      for (auto& sg : *a.mutable_graphs()) substitute(sg, m, prefix);
    }
  }
}

void declare(onnx::ValueInfoProto& v, const std::string& name, std::int32_t elem_type) {
  v.set_name(name);
  v.mutable_type()->mutable_tensor_type()->set_elem_type(elem_type);
}

onnx::NodeProto& add_node(onnx::GraphProto& g, GraphWriter& w, const std::string& op,
                          const std::vector<std::string>& ins,
                          const std::vector<std::string>& outs) {
  onnx::NodeProto& n = *g.add_node();
  n.set_op_type(op);
  n.set_name(w.fresh(op));
  for (const auto& i : ins) n.add_input(i);
  for (const auto& o : outs) n.add_output(o);
  return n;
}

/// A subgraph input as a model input: its name in the subgraph, the tensor it reads where the
/// backward runs, its dtype and the outer tensor whose dims it has ("" for a scalar).
struct SubInput {
  std::string name, value;
  std::int32_t elem_type = 0;
  std::string like;
};

/// A subgraph output with a gradient: its name, the tensor holding that gradient where the backward
/// runs, and its declared type (may be null).
struct SubOutput {
  std::string name, seed;
  const onnx::ValueInfoProto* type = nullptr;
};

/// The backward of one subgraph: nodes and initializers that compute the gradient of each `wrt`
/// name (among the inputs) into `grads`, reading outer tensors only.
struct SubGrad {
  onnx::GraphProto g;
  std::vector<std::string> grads;
};

Expected<SubGrad> subgraph_grad(GraphWriter& w, const ControlContext& cx,
                                const onnx::GraphProto& body, const std::vector<SubInput>& inputs,
                                const std::vector<SubOutput>& outputs,
                                const std::vector<std::string>& wrt, const std::string& where) {
  auto mp = std::make_shared<onnx::ModelProto>();
  mp->set_ir_version(cx.model->proto->ir_version());
  *mp->mutable_opset_import() = cx.model->proto->opset_import();
  onnx::GraphProto& g = *mp->mutable_graph();
  g.set_name(body.name().empty() ? "subgraph" : body.name());
  for (const auto& in : inputs) {
    auto* v = g.add_input();
    v->set_name(in.name);
    if (in.like.empty())
      v->mutable_type()->mutable_tensor_type()->mutable_shape();
    else
      w.declare_like(*v, in.elem_type, in.like);
    v->mutable_type()->mutable_tensor_type()->set_elem_type(in.elem_type);
  }
  *g.mutable_initializer() = body.initializer();
  *g.mutable_node() = body.node();
  GradSpec s;
  s.logits.clear();
  s.frozen = {"*"};  // the outer weights are inputs here; the subgraph's own constants stay
  s.dims = cx.spec->dims;
  s.input_grads = wrt;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    // An Identity per output: two outputs may be one tensor, or an input passed through.
    const std::string o = fmt::format("hp_ctl_out_{}", k);
    add_node(g, w, "Identity", {outputs[k].name}, {o});
    auto* v = g.add_output();
    if (outputs[k].type) *v = *outputs[k].type;
    v->set_name(o);
    s.output_grads.push_back(o);
  }
  model::Model sm = *cx.model;
  sm.proto = mp;
  auto gg = build_grad_graph(sm, s);
  if (!gg) {
    Error e = gg.error();
    std::vector<Diagnostic> all;
    for (auto d : e.all()) {
      d.message = fmt::format("in the subgraph '{}': {}{}", g.name(),
                              d.where.empty() ? "" : d.where + ": ", d.message);
      d.where = where;
      all.push_back(std::move(d));
    }
    return collect_errors(e.code, std::move(all));
  }
  const onnx::GraphProto& rg = gg->model.proto->graph();
  std::set<std::string> defined;
  collect_defined(rg, true, defined);
  const std::string prefix = w.fresh("ctl") + "/";
  std::map<std::string, std::string> m;
  for (const auto& d : defined) m[d] = prefix + d;
  for (const auto& in : inputs) m[in.name] = in.value;
  for (std::size_t k = 0; k < outputs.size(); ++k) m[gg->output_grad_inputs[k]] = outputs[k].seed;
  SubGrad out;
  std::set<std::string> reads;
  for (int i : needed_nodes(rg, gg->input_grad_outputs, {})) {
    *out.g.add_node() = rg.node(i);
    collect_reads(rg.node(i), reads);
  }
  for (const auto& t : rg.initializer())
    if (reads.count(t.name())) *out.g.add_initializer() = t;
  substitute(out.g, m, prefix);
  for (const auto& name : gg->input_grad_outputs) {
    auto it = m.find(name);
    out.grads.push_back(it == m.end() ? name : it->second);
  }
  return out;
}

onnx::AttributeProto& graph_attribute(onnx::NodeProto& n, const char* name) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::GRAPH);
  return *a;
}

/// The outer tensors a subgraph reads that take a gradient, sorted.
void wanted_reads(const GraphWriter& w, const ControlContext& cx, const onnx::GraphProto& g,
                  std::set<std::string>& out) {
  for (const auto& name : model::outer_reads(g))
    if (cx.requires_grad(name) && is_float_type(w.elem_type(name))) out.insert(name);
}

Expected<std::vector<Contribution>> if_grad(GraphWriter& w, onnx::NodeProto& n,
                                            const std::vector<std::string>& douts,
                                            const ControlContext& cx, const std::string& where) {
  onnx::GraphProto* branch[2] = {graph_attr(n, "then_branch"), graph_attr(n, "else_branch")};
  if (!branch[0] || !branch[1])
    return Error(Errc::bad_input, "If needs its then_branch and else_branch graphs", where);
  std::set<std::string> wanted;
  for (auto* b : branch) wanted_reads(w, cx, *b, wanted);
  if (wanted.empty()) return std::vector<Contribution>{};
  const std::vector<std::string> wrt(wanted.begin(), wanted.end());
  std::vector<std::string> outs;
  for (const auto& t : wrt) outs.push_back(w.fresh("If_grad"));
  onnx::NodeProto* node = w.graph->add_node();
  node->set_op_type("If");
  node->set_name(w.fresh("If"));
  node->add_input(cx.renamed(n.input(0)));
  for (const auto& o : outs) node->add_output(o);
  const char* attr[2] = {"then_branch", "else_branch"};
  for (int b = 0; b < 2; ++b) {
    std::set<std::string> reads = model::outer_reads(*branch[b]);
    reads.insert(wrt.begin(), wrt.end());
    std::vector<SubInput> inputs;
    for (const auto& name : reads)
      inputs.push_back({name, cx.renamed(name), w.elem_type(name), name});
    std::vector<SubOutput> seeds;
    for (int j = 0; j < branch[b]->output_size() && j < static_cast<int>(douts.size()); ++j)
      if (!douts[static_cast<std::size_t>(j)].empty())
        seeds.push_back({branch[b]->output(j).name(), douts[static_cast<std::size_t>(j)],
                         &branch[b]->output(j)});
    HP_ASSIGN_OR_RETURN(SubGrad sg, subgraph_grad(w, cx, *branch[b], inputs, seeds, wrt, where));
    onnx::GraphProto& g = *graph_attribute(*node, attr[b]).mutable_g();
    g = std::move(sg.g);
    g.set_name(w.fresh(std::string(attr[b]) + "_grad"));
    for (std::size_t c = 0; c < wrt.size(); ++c)
      declare(*g.add_output(), sg.grads[c], w.elem_type(wrt[c]));
  }
  std::vector<Contribution> out;
  for (std::size_t c = 0; c < wrt.size(); ++c) {
    w.types[outs[c]] = w.elem_type(wrt[c]);
    w.made[outs[c]] = node;
    out.emplace_back(wrt[c], outs[c]);
  }
  return out;
}

Expected<std::vector<Contribution>> loop_grad(GraphWriter& w, onnx::NodeProto& n,
                                              const std::vector<std::string>& douts,
                                              const ControlContext& cx, const std::string& where) {
  onnx::GraphProto* fb = graph_attr(n, "body");
  const int carried = n.input_size() - 2;
  if (!fb || carried < 0 || fb->input_size() != carried + 2 ||
      fb->output_size() != n.output_size() + 1)
    return Error(Errc::bad_input, "Loop's body does not match its inputs and outputs", where);
  const int scans = n.output_size() - carried;
  const onnx::GraphProto body = *fb;  // before the stacks are added
  for (int j = 0; j < carried; ++j) {
    const int t = w.fwd->find_tensor(n.input(2 + j));
    if (body.input(2 + j).type().has_sequence_type() || (t >= 0 && w.fwd->tensor(t).sequence))
      return Error(Errc::bad_input,
                   fmt::format("carried value '{}' is a sequence, whose gradient is not "
                               "differentiated through a Loop",
                               n.input(2 + j)),
                   where,
                   "stack the values in a tensor (a scan output, or torch.stack outside the "
                   "loop) instead of appending to a list");
  }
  std::vector<int> floats;  // carried values that carry a gradient
  for (int j = 0; j < carried; ++j)
    if (is_float_type(w.elem_type(n.input(2 + j)))) floats.push_back(j);
  std::set<std::string> wanted;
  wanted_reads(w, cx, body, wanted);
  bool any = !wanted.empty();
  for (int j : floats) any = any || cx.requires_grad(n.input(2 + j));
  if (!any) return std::vector<Contribution>{};
  const std::vector<std::string> captured(wanted.begin(), wanted.end());

  // The forward stacks the iteration numbers (their count is the trip count) and every carried
  // value as extra scan outputs.
  auto stack = [&](const std::string& value, std::int32_t et) {
    const std::string inner = w.fresh("loop_state");
    add_node(*fb, w, "Identity", {value}, {inner});
    declare(*fb->add_output(), inner, et);
    const std::string outer = w.fresh("loop_states");
    n.add_output(outer);
    w.types[outer] = et;
    return outer;
  };
  const std::string iters = stack(body.input(0).name(), onnx::TensorProto::INT64);
  std::vector<std::string> states;
  for (int j = 0; j < carried; ++j)
    states.push_back(stack(body.input(2 + j).name(), w.elem_type(n.input(2 + j))));

  const std::int32_t i64 = onnx::TensorProto::INT64;
  const std::string trips = w.emit("Squeeze", {w.shape_of(iters), w.i64s({0})}, 1)[0];
  const std::string last = w.emit("Sub", {trips, w.scalar(1, i64)}, 1)[0];
  const std::string yes =
      w.emit("Cast", {w.scalar(1, i64)}, 1, {{"to", std::int64_t{onnx::TensorProto::BOOL}}})[0];
  auto zeros_like = [&](const std::string& t) {
    return w.emit("Expand", {w.scalar(0.0, w.elem_type(t)), w.shape_of(cx.renamed(t))}, 1)[0];
  };
  std::vector<std::string> loop_in = {trips, yes};
  for (int j : floats) {
    const std::string& d = douts[static_cast<std::size_t>(j)];
    loop_in.push_back(d.empty() ? zeros_like(n.output(j)) : d);
  }
  for (const auto& c : captured) loop_in.push_back(zeros_like(c));

  // The backward body: iteration i = trips-1-it reads the forward's iteration i.
  onnx::GraphProto g;
  g.set_name(w.fresh("body_grad"));
  const std::string it = w.fresh("it"), cond = w.fresh("cond");
  declare(*g.add_input(), it, i64);
  declare(*g.add_input(), cond, onnx::TensorProto::BOOL);
  std::vector<std::string> dv, acc;
  for (int j : floats) {
    dv.push_back(w.fresh("dv"));
    declare(*g.add_input(), dv.back(), w.elem_type(n.input(2 + j)));
  }
  for (const auto& c : captured) {
    acc.push_back(w.fresh("acc"));
    declare(*g.add_input(), acc.back(), w.elem_type(c));
  }
  const std::string i = w.fresh("i");
  add_node(g, w, "Sub", {last, it}, {i});
  auto at_i = [&](const std::string& stacked) {
    const std::string o = w.fresh("at_i");
    add_node(g, w, "Gather", {stacked, i}, {o});
    return o;
  };
  std::vector<SubInput> inputs = {{body.input(0).name(), i, i64, ""},
                                  {body.input(1).name(), cond, onnx::TensorProto::BOOL, ""}};
  for (int j = 0; j < carried; ++j)
    inputs.push_back({body.input(2 + j).name(), at_i(states[static_cast<std::size_t>(j)]),
                      w.elem_type(n.input(2 + j)), n.input(2 + j)});
  std::set<std::string> body_inputs;
  for (const auto& v : body.input()) body_inputs.insert(v.name());
  for (const auto& name : model::outer_reads(body))
    if (!body_inputs.count(name))
      inputs.push_back({name, cx.renamed(name), w.elem_type(name), name});
  std::vector<SubOutput> seeds;
  std::vector<std::string> wrt;
  for (std::size_t f = 0; f < floats.size(); ++f) {
    const int j = floats[f];
    seeds.push_back({body.output(1 + j).name(), dv[f], &body.output(1 + j)});
    wrt.push_back(body.input(2 + j).name());
  }
  for (int s = 0; s < scans; ++s) {
    const std::string& d = douts[static_cast<std::size_t>(carried + s)];
    if (!d.empty())
      seeds.push_back(
          {body.output(1 + carried + s).name(), at_i(d), &body.output(1 + carried + s)});
  }
  wrt.insert(wrt.end(), captured.begin(), captured.end());
  HP_ASSIGN_OR_RETURN(SubGrad sg, subgraph_grad(w, cx, body, inputs, seeds, wrt, where));
  for (auto& node : *sg.g.mutable_node()) *g.add_node() = std::move(node);
  for (auto& t : *sg.g.mutable_initializer()) *g.add_initializer() = std::move(t);
  const std::string cond_out = w.fresh("cond_out");
  add_node(g, w, "Identity", {cond}, {cond_out});
  declare(*g.add_output(), cond_out, onnx::TensorProto::BOOL);
  for (std::size_t f = 0; f < floats.size(); ++f)
    declare(*g.add_output(), sg.grads[f], w.elem_type(n.input(2 + floats[f])));
  for (std::size_t c = 0; c < captured.size(); ++c) {
    const std::string sum = w.fresh("acc_out");
    add_node(g, w, "Add", {acc[c], sg.grads[floats.size() + c]}, {sum});
    declare(*g.add_output(), sum, w.elem_type(captured[c]));
  }

  onnx::NodeProto* node = w.graph->add_node();
  node->set_op_type("Loop");
  node->set_name(w.fresh("Loop"));
  for (const auto& x : loop_in) node->add_input(x);
  *graph_attribute(*node, "body").mutable_g() = std::move(g);
  std::vector<Contribution> out;
  auto result = [&](const std::string& of) {
    const std::string o = w.fresh("Loop_grad");
    node->add_output(o);
    w.types[o] = w.elem_type(of);
    w.made[o] = node;
    return o;
  };
  for (int j : floats) {
    const std::string o = result(n.input(2 + j));
    if (cx.requires_grad(n.input(2 + j))) out.emplace_back(n.input(2 + j), o);
  }
  for (const auto& c : captured) out.emplace_back(c, result(c));
  return out;
}

}  // namespace

Expected<std::vector<Contribution>> control_flow_grad(GraphWriter& w, int k,
                                                      const std::vector<std::string>& douts,
                                                      const ControlContext& cx) {
  onnx::NodeProto& n = *w.graph->mutable_node(k);
  const std::string where =
      fmt::format("node '{}' ({})", n.name().empty() ? n.output(0) : n.name(), n.op_type());
  for (const auto& a : n.attribute())
    if (a.has_g())
      if (const auto* r = random_node(a.g()))
        return Error(
            Errc::bad_input,
            fmt::format("its subgraph draws random values ({} '{}'): the backward "
                        "recomputes the subgraph and would draw other ones",
                        r->op_type(), r->name()),
            where,
            "export the model in eval mode for the op, or move it out of the " + n.op_type());
  if (n.op_type() == "If") return if_grad(w, n, douts, cx, where);
  return loop_grad(w, n, douts, cx, where);
}

}  // namespace hp::train::detail
