// Executor preparation: everything decided before the first node runs.
//
//  1. Topological order (Kahn's algorithm over tensor names; ties keep file order, so an already
//     sorted graph keeps its order). A cycle or a read of a tensor nothing produces is bad_input.
//  2. Op support: a node is runnable when the primary or the cpu backend implements its op type
//     (supports_op with NULL dtypes: dtypes of intermediate tensors are only known when running),
//     or it is an "hp"-domain node and a CommOps handles it. Every unsupported node is collected,
//     then one error lists them all.
//  3. Attributes become hp_op_attr records once (tensor attributes decoded to host tensors).
//  4. Initializers are decoded (inline or external data) and kept on the host until the run places
//     them.
//  5. Lifetimes: for each tensor its last reader; graph outputs are never released early.
//  6. Fusion (exec_fuse.cpp): node chains one kernel does in a pass, e.g. the exported exact GELU.
//  7. Constant folding across runs: a node whose inputs are all weights or outputs of such nodes
//     (exporters emit many: Constant, ConstantOfShape, Range, the Trilu of a causal mask, ...) and
//     the Shape/Size nodes (their output depends only on dims) are "cached": their outputs persist
//     between runs, like the weights, and they rerun only when an input changed (exec_run.cpp).
//     With static input shapes the exporter's Shape -> Gather -> Concat -> Reshape-target
//     arithmetic then runs once.
#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "exec_internal.h"
#include "proto_tensor.h"

namespace hp::exec {

int Executor::Impl::id_of(const std::string& name) {
  auto [it, added] = tensor_ids.emplace(name, static_cast<int>(tensor_names.size()));
  if (added) tensor_names.push_back(name);
  return it->second;
}

GraphIO graph_io_of(const onnx::ValueInfoProto& v) {
  GraphIO io;
  io.name = v.name();
  const onnx::TypeProto* type = &v.type();
  if (type->has_sequence_type() && type->sequence_type().elem_type().has_tensor_type()) {
    io.sequence = true;
    type = &type->sequence_type().elem_type();
  }
  if (type->has_tensor_type()) {
    const auto& tt = type->tensor_type();
    io.onnx_type = tt.elem_type();
    io.dtype = dtype_from_onnx(tt.elem_type());
    if (tt.has_shape()) {
      io.has_shape = true;
      for (const auto& d : tt.shape().dim())
        io.dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
    }
  }
  return io;
}

ModelIO model_io(const model::Model& m) {
  ModelIO io;
  const auto& g = m.proto->graph();
  std::set<std::string> init;
  for (const auto& t : g.initializer()) init.insert(t.name());
  for (const auto& v : g.input())
    if (!init.count(v.name())) io.inputs.push_back(graph_io_of(v));
  for (const auto& v : g.output()) io.outputs.push_back(graph_io_of(v));
  return io;
}

namespace {

/// Kahn's algorithm; returns node indices in a valid order.
Expected<std::vector<int>> topo_order(const onnx::GraphProto& g,
                                      const std::function<bool(const std::string&)>& available) {
  const int n = g.node_size();
  std::map<std::string, int> producer;
  for (int i = 0; i < n; ++i)
    for (const auto& o : g.node(i).output())
      if (!o.empty()) producer[o] = i;
  std::vector<int> pending(static_cast<std::size_t>(n), 0);
  std::vector<std::vector<int>> readers(static_cast<std::size_t>(n));
  std::vector<Diagnostic> missing;
  for (int i = 0; i < n; ++i) {
    std::set<int> deps;
    for (const auto& in : node_reads(g.node(i))) {
      if (in.empty() || (!producer.count(in) && available(in))) continue;
      auto it = producer.find(in);
      if (it == producer.end()) {
        missing.push_back(
            {g.node(i).name(),
             fmt::format("reads tensor '{}', which no node, input or weight provides", in), ""});
        continue;
      }
      deps.insert(it->second);
    }
    pending[static_cast<std::size_t>(i)] = static_cast<int>(deps.size());
    for (int d : deps) readers[static_cast<std::size_t>(d)].push_back(i);
  }
  if (!missing.empty()) return collect_errors(Errc::bad_input, std::move(missing));
  std::set<int> ready;
  for (int i = 0; i < n; ++i)
    if (pending[static_cast<std::size_t>(i)] == 0) ready.insert(i);
  std::vector<int> order;
  while (!ready.empty()) {
    int i = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(i);
    for (int r : readers[static_cast<std::size_t>(i)])
      if (--pending[static_cast<std::size_t>(r)] == 0) ready.insert(r);
  }
  if (static_cast<int>(order.size()) != n)
    return Error(Errc::bad_input, "the graph has a cycle", "", "an onnx graph must be acyclic");
  return order;
}

Status convert_attrs(const onnx::NodeProto& np, PreparedNode& n, const std::filesystem::path& dir) {
  for (const auto& a : np.attribute()) {
    hp_op_attr r{};
    r.name = n.store_strings.emplace_back(a.name()).c_str();
    switch (a.type()) {
      case onnx::AttributeProto::INT:
        r.kind = HP_ATTR_INT;
        r.i = a.i();
        break;
      case onnx::AttributeProto::FLOAT:
        r.kind = HP_ATTR_FLOAT;
        r.f = a.f();
        break;
      case onnx::AttributeProto::STRING:
        r.kind = HP_ATTR_STRING;
        r.s = n.store_strings.emplace_back(a.s()).c_str();
        break;
      case onnx::AttributeProto::STRINGS: {
        r.kind = HP_ATTR_STRINGS;
        std::string packed;
        for (const auto& v : a.strings()) packed.append(v).push_back('\0');
        r.s = n.store_strings.emplace_back(std::move(packed)).c_str();
        r.n = a.strings_size();
        break;
      }
      case onnx::AttributeProto::INTS: {
        r.kind = HP_ATTR_INTS;
        auto& v = n.store_ints.emplace_back(a.ints().begin(), a.ints().end());
        r.ints = v.data();
        r.n = static_cast<std::int64_t>(v.size());
        break;
      }
      case onnx::AttributeProto::FLOATS: {
        r.kind = HP_ATTR_FLOATS;
        auto& v = n.store_floats.emplace_back(a.floats().begin(), a.floats().end());
        r.floats = v.data();
        r.n = static_cast<std::int64_t>(v.size());
        break;
      }
      case onnx::AttributeProto::TENSOR: {
        HP_ASSIGN_OR_RETURN(auto t,
                            tensor_from_proto(a.t(), dir, n.name.empty() ? n.op_type : n.name));
        HostTensor& h = n.store_tensors.emplace_back(std::move(t));
        hp_tensor_desc& d = n.store_descs.emplace_back();
        d.dtype = h.dtype;
        d.rank = static_cast<std::int32_t>(h.dims.size());
        if (d.rank > HP_MAX_RANK)
          return Error(Errc::bad_input, "attribute tensor rank too large", n.name);
        for (std::size_t k = 0; k < h.dims.size(); ++k) d.dims[k] = h.dims[k];
        d.data = h.data.data();
        r.kind = HP_ATTR_TENSOR;
        r.tensor = &d;
        break;
      }
      default: continue;  // graphs, sparse tensors, type protos: no supported op reads them
    }
    n.attrs.push_back(r);
  }
  return {};
}

/// Ops whose outputs are a function of their inputs and attributes (the random ones are not).
bool deterministic(const std::string& op) {
  return op.rfind("Random", 0) != 0 && op != "Bernoulli" && op != "Multinomial";
}

bool runnable(const ExecOptions& o, const PreparedNode& n) {
  if (n.domain == "hp") return o.comm && o.comm->handles(n.op_type);
  const char* dom = n.domain.c_str();
  if (o.backend && o.backend->supports_op_type(0, n.op_type.c_str(), dom, n.opset)) return true;
  return o.cpu->supports_op_type(0, n.op_type.c_str(), dom, n.opset);
}

}  // namespace

int Scope::lookup(const Executor::Impl& im, const std::string& name) const {
  if (main) {
    auto it = im.tensor_ids.find(name);
    return it == im.tensor_ids.end() ? -1 : it->second;
  }
  if (auto it = names.find(name); it != names.end()) return it->second;
  return parent ? parent->lookup(im, name) : -1;
}

Status prepare_nodes(Executor::Impl& im, const onnx::GraphProto& g, const model::Model& model,
                     const Scope& scope, std::deque<PreparedNode>& out,
                     std::vector<Diagnostic>& unsupported,
                     const std::function<int(const std::string&)>& resolve,
                     const std::function<int(const std::string&)>& define) {
  const std::filesystem::path dir = model.path.parent_path();
  auto order = topo_order(g, [&](const std::string& name) { return scope.lookup(im, name) >= 0; });
  if (!order) return std::move(order).error();

  for (int i : *order) {
    const onnx::NodeProto& np = g.node(i);
    PreparedNode& n = out.emplace_back();
    n.name = np.name();
    n.op_type = np.op_type();
    n.domain = np.domain() == "ai.onnx" ? "" : np.domain();
    auto os = model.opsets.find(n.domain);
    n.opset = os == model.opsets.end() ? 0 : os->second;
    for (const auto& in : np.input()) n.inputs.push_back(in.empty() ? -1 : resolve(in));
    for (const auto& o : np.output()) n.outputs.push_back(o.empty() ? -1 : define(o));
    n.comm = n.domain == "hp";
    n.builtin = builtin_of(n.domain, n.op_type);
    if (n.builtin != Builtin::none) {
      HP_TRY(prepare_bodies(im, np, n, scope, model, unsupported));
    } else if (!runnable(im.opts, n)) {
      std::string label = n.domain.empty() ? n.op_type : n.domain + "." + n.op_type;
      unsupported.push_back(
          {n.name.empty() ? fmt::format("node #{}", i) : fmt::format("node '{}'", n.name),
           fmt::format("op {} is not supported by any loaded backend", label),
           n.comm ? "hp-domain communication ops run under 'hp launch RECIPE.toml' (the comm layer)"
                  : "see 'hp devices' for the backends found"});
      continue;
    }
    if (n.comm) {
      n.comm_node = {n.name,
                     n.op_type,
                     {np.input().begin(), np.input().end()},
                     {np.output().begin(), np.output().end()},
                     {}};
      // Attributes as text: strings as is, ints in decimal, int lists comma-separated ("0,2,1,3").
      for (const auto& a : np.attribute()) {
        std::string v;
        if (a.type() == onnx::AttributeProto::STRING)
          v = a.s();
        else if (a.type() == onnx::AttributeProto::INTS)
          v = fmt::format("{}", fmt::join(a.ints(), ","));
        else
          v = std::to_string(a.i());
        n.comm_node.attrs.emplace_back(a.name(), std::move(v));
      }
    }
    HP_TRY(convert_attrs(np, n, dir));
  }
  return {};
}

void plan_lifetimes(Executor::Impl& im) {
  for (Slot& s : im.slots) s.persistent = false;
  // Weights persist, except those a weight source lends for their uses (exec_gather.cpp).
  for (const auto& [id, h] : im.weights)
    if (!gathered_weight(im, id)) im.slots[static_cast<std::size_t>(id)].persistent = true;
  for (PreparedNode& n : im.nodes) {
    n.cached = n.memo_valid = n.donate_input0 = false;
    n.release_after.clear();
    if (n.dead || n.comm || n.builtin != Builtin::none || !deterministic(n.op_type)) continue;
    bool all_const = true;
    if (n.domain.empty() && (n.op_type == "Shape" || n.op_type == "Size")) {
      all_const = true;  // depends on its input's dims only
    } else {
      for (int t : n.inputs)
        if (t >= 0 && !im.slots[static_cast<std::size_t>(t)].persistent) all_const = false;
    }
    if (!all_const) continue;
    n.cached = true;
    for (int t : n.outputs)
      if (t >= 0) im.slots[static_cast<std::size_t>(t)].persistent = true;
  }

  // Lifetimes: the last node reading each tensor releases it; persistent tensors are never
  // released.
  std::vector<int> last(im.tensor_names.size(), -1);
  for (std::size_t k = 0; k < im.nodes.size(); ++k)
    if (!im.nodes[k].dead)
      for (const auto* list : {&im.nodes[k].inputs, &im.nodes[k].captured})
        for (int t : *list)
          if (t >= 0) last[static_cast<std::size_t>(t)] = static_cast<int>(k);
  std::set<int> keep(im.output_ids.begin(), im.output_ids.end());
  for (std::size_t t = 0; t < last.size(); ++t)
    if (last[t] >= 0 && !keep.count(static_cast<int>(t)) && !im.slots[t].persistent)
      im.nodes[static_cast<std::size_t>(last[t])].release_after.push_back(static_cast<int>(t));
  // Outputs nobody reads (unused optional outputs, dead ends) are released right after their
  // producer.
  for (std::size_t k = 0; k < im.nodes.size(); ++k)
    if (!im.nodes[k].dead)
      for (int t : im.nodes[k].outputs)
        if (t >= 0 && last[static_cast<std::size_t>(t)] < 0 && !keep.count(t) &&
            !im.slots[static_cast<std::size_t>(t)].persistent)
          im.nodes[k].release_after.push_back(t);
  plan_hooked_release(im);
  // A view op whose data input dies with it takes that input's buffer as its output instead of
  // copying it (alloc_output in exec_run.cpp): the backward of a transformer reshapes whole
  // activations and gradients back and forth.
  if (im.opts.offload.enabled) return;
  for (PreparedNode& n : im.nodes) {
    static const std::set<std::string> views{"Reshape", "Flatten", "Squeeze", "Unsqueeze",
                                             "Identity"};
    if (n.dead || !n.domain.empty() || !views.count(n.op_type) || n.inputs.empty() ||
        n.inputs[0] < 0 || n.outputs.size() != 1)
      continue;
    const int x = n.inputs[0];
    n.donate_input0 = std::count(n.release_after.begin(), n.release_after.end(), x) > 0 &&
                      std::count(n.inputs.begin(), n.inputs.end(), x) == 1;
  }
}

void plan_hooked_release(Executor::Impl& im) {
  for (PreparedNode& n : im.nodes) n.release_hooked.clear();
  // Not under offload, whose schedule follows every tensor's life itself.
  if (!im.output_hook || im.opts.offload.enabled) return;
  // A hooked output lives until its producer has run and its last reader (the graph may read a
  // graph output too); then only the hook's copy is needed. A data-parallel backward's gradients
  // thus leave the pool one by one instead of all staying to the end.
  std::map<int, int> at;   // hooked tensor -> the node after which it can go
  std::set<int> computed;  // hooked tensors a node computes (not graph inputs passed through)
  for (std::size_t k = 0; k < im.nodes.size(); ++k) {
    const PreparedNode& n = im.nodes[k];
    if (n.dead) continue;
    for (const auto* list : {&n.inputs, &n.captured, &n.outputs})
      for (int t : *list)
        if (t >= 0 && im.hooked_outputs.count(t)) at[t] = static_cast<int>(k);
    for (int t : n.outputs)
      if (t >= 0 && im.hooked_outputs.count(t)) computed.insert(t);
  }
  for (const auto& [t, k] : at)
    if (computed.count(t) && !im.slots[static_cast<std::size_t>(t)].persistent)
      im.nodes[static_cast<std::size_t>(k)].release_hooked.push_back(t);
}

Expected<std::unique_ptr<Executor>> Executor::create(const model::Model& model,
                                                     const ExecOptions& options) {
  if (!options.cpu) return Error(Errc::internal, "the executor needs the cpu backend");
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->be[0] = options.cpu.get();
  if (options.backend && options.backend.get() != options.cpu.get())
    impl->be[1] = options.backend.get();
  const onnx::GraphProto& g = model.proto->graph();
  const std::filesystem::path dir = model.path.parent_path();
  const std::string where = model.path.string();

  std::set<std::string> init_names;
  for (const auto& t : g.initializer()) {
    init_names.insert(t.name());
    impl->id_of(t.name());
  }
  for (const auto& v : g.input()) {
    if (init_names.count(v.name())) continue;
    impl->inputs.push_back(graph_io_of(v));
    impl->input_ids.push_back(impl->id_of(v.name()));
  }
  for (const auto& v : g.output()) {
    impl->outputs.push_back(graph_io_of(v));
    impl->output_ids.push_back(impl->id_of(v.name()));
  }
  Scope scope;
  scope.main = true;
  auto id = [&](const std::string& name) { return impl->id_of(name); };
  std::vector<Diagnostic> unsupported;
  HP_TRY(prepare_nodes(*impl, g, model, scope, impl->nodes, unsupported, id, id));
  if (!unsupported.empty()) {
    Error e = collect_errors(Errc::bad_input, std::move(unsupported));
    e.what.message = fmt::format("{} ({} unsupported node{} in {})", e.what.message,
                                 e.more.size() + 1, e.more.empty() ? "" : "s", where);
    return e;
  }

  // Weights: decoded now so a missing external file fails before the run.
  for (const auto& t : g.initializer()) {
    HP_ASSIGN_OR_RETURN(auto h, tensor_from_proto(t, dir, where));
    impl->stats.weight_bytes += static_cast<std::int64_t>(h.data.size());
    impl->weights.emplace_back(impl->id_of(t.name()), std::move(h));
  }

  fuse_nodes(*impl);
  keep_channels_last(*impl);

  std::map<std::string, int> op_slots;
  for (PreparedNode& n : impl->nodes) {
    const std::string label = n.domain.empty() ? n.op_type : n.domain + "." + n.op_type;
    auto [it, added] = op_slots.emplace(label, static_cast<int>(impl->op_types.size()));
    if (added) impl->op_types.push_back(label);
    n.op_slot = it->second;
  }
  impl->slots.resize(impl->tensor_names.size());
  plan_lifetimes(*impl);
  if (options.pack_weights) tag_constant_weights(*impl);

  for (int s = 0; s < 2; ++s) {
    if (!impl->be[s]) continue;
    HP_ASSIGN_OR_RETURN(auto st, impl->be[s]->stream_create(0));
    impl->stream[s] = st;
  }
  if (options.offload.enabled) {
    for (const PreparedNode& n : impl->nodes)
      if (n.builtin != Builtin::none)
        return Error(Errc::not_implemented,
                     fmt::format("offload does not plan through op {} yet", n.op_type),
                     n.name.empty() ? n.op_type : n.name,
                     "run this model without [offload] (docs/executor.md, \"Control flow\")");
    HP_TRY(offload_prepare(*impl, model));
  }
  return std::unique_ptr<Executor>(new Executor(std::move(impl)));
}

Executor::Executor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executor::~Executor() = default;
const std::vector<GraphIO>& Executor::inputs() const { return impl_->inputs; }
const std::vector<GraphIO>& Executor::outputs() const { return impl_->outputs; }
const ExecStats& Executor::stats() const { return impl_->stats; }

}  // namespace hp::exec
