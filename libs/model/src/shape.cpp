// Shape inference at bound dims.
//
// Exported models carry symbolic input dims ("batch", "seq"). Planning needs concrete sizes, so we
// rewrite the graph inputs' dim_param into dim_value from the user's bindings, then run ONNX's
// shape inference. That alone resolves little in a PyTorch export, whose reshapes take their target
// shapes from Shape/Gather/Concat arithmetic that ONNX 1.12 cannot evaluate. So inference runs in
// rounds: after each, values.cpp evaluates the shape arithmetic with the shapes known so far, and
// every shape-determining input (Reshape's shape, Range's bounds, Expand's shape, ...) whose value
// is now known is replaced by a constant initializer; ONNX inference uses constant inputs, so the
// next round resolves further. Sequence ops whose lengths are now known (the Loop PyTorch writes
// for repeat_interleave) are lowered to tensor ops the same way (shape_seq.cpp). Rounds stop when
// nothing new is pinned or lowered (a handful for exported models).
//
// What is left unknown is reported by where it starts (shape_diag.cpp): the node and the reason,
// never the unk__N symbols ONNX invents downstream, which no user could bind.
//
// All of this happens on a weight-less copy of the model: float initializers keep their dims and
// lose their data (only small integer tensors, which may be shape constants, keep theirs). The copy
// is cheap even for a 175B-parameter model, the loaded Model stays untouched, and external data is
// never read.
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include <fmt/core.h>

#include <set>
#include <unordered_set>

#include "einsum.h"
#include "shape_infer.h"

namespace hp::model {
namespace {

constexpr int kMaxRounds = 16;
constexpr std::int64_t kKeepDataElems = 4096;

onnx::ModelProto weightless_copy(const onnx::ModelProto& m) {
  onnx::ModelProto c;
  c.set_ir_version(m.ir_version());
  *c.mutable_opset_import() = m.opset_import();
  *c.mutable_functions() = m.functions();
  const onnx::GraphProto& g = m.graph();
  onnx::GraphProto* cg = c.mutable_graph();
  cg->set_name(g.name());
  *cg->mutable_input() = g.input();
  *cg->mutable_output() = g.output();
  *cg->mutable_node() = g.node();
  for (const auto& t : g.initializer()) {
    onnx::TensorProto* ct = cg->add_initializer();
    auto numel = checked_numel(t);
    bool keep = t.data_location() != onnx::TensorProto::EXTERNAL && numel &&
                *numel <= kKeepDataElems && !is_float_type(t.data_type());
    if (keep) {
      *ct = t;
      continue;
    }
    ct->set_name(t.name());
    ct->set_data_type(t.data_type());
    *ct->mutable_dims() = t.dims();
    // Inference reads only dims of these; mark them external so nothing tries to parse data.
    ct->set_data_location(onnx::TensorProto::EXTERNAL);
    auto* kv = ct->add_external_data();
    kv->set_key("location");
    kv->set_value("hp-weightless");
  }
  return c;
}

}  // namespace

// The inputs whose *values* decide an op's output shape (what pinning helps with).
const std::vector<int>* shape_inputs(const std::string& op) {
  static const std::map<std::string, std::vector<int>> table = {
      {"Reshape", {1}},     {"Expand", {1}},         {"Tile", {1}},      {"ConstantOfShape", {0}},
      {"Range", {0, 1, 2}}, {"Slice", {1, 2, 3, 4}}, {"Unsqueeze", {1}}, {"Squeeze", {1}},
      {"Split", {1}},       {"TopK", {1}},           {"Pad", {1}},       {"OneHot", {1}},
      {"ReduceSum", {1}},   {"Resize", {2, 3}},      {"Upsample", {1}}};
  auto it = table.find(op);
  return it == table.end() ? nullptr : &it->second;
}

namespace {

onnx::TensorProto make_constant(const std::string& name, const Value& v) {
  onnx::TensorProto t;
  t.set_name(name);
  for (auto d : v.shape) t.add_dims(d);
  using T = onnx::TensorProto;
  std::int32_t type = v.elem_type;
  if (type == T::FLOAT || type == T::FLOAT16 || type == T::BFLOAT16) {
    t.set_data_type(T::FLOAT);
    for (double d : v.data) t.add_float_data(static_cast<float>(d));
    if (type != T::FLOAT) type = T::FLOAT;
  } else if (type == T::DOUBLE) {
    t.set_data_type(T::DOUBLE);
    for (double d : v.data) t.add_double_data(d);
  } else if (type == T::INT32 || type == T::BOOL || type == T::INT8 || type == T::UINT8) {
    t.set_data_type(type);
    for (double d : v.data) t.add_int32_data(static_cast<std::int32_t>(d));
  } else {
    t.set_data_type(T::INT64);
    for (double d : v.data) t.add_int64_data(saturate_i64(d));
  }
  return t;
}

void add_shape(ShapeMap& map, const std::string& name, const onnx::TypeProto& type) {
  if (!type.has_tensor_type()) return;
  const auto& tt = type.tensor_type();
  ShapeInfo& s = map[name];
  s.elem_type = tt.elem_type();
  s.has_shape = tt.has_shape();
  s.dims.clear();
  for (const auto& d : tt.shape().dim()) {
    Dim dim;
    if (d.has_dim_value() && d.dim_value() >= 0)
      dim.value = d.dim_value();
    else if (d.has_dim_param())
      dim.symbol = d.dim_param();
    s.dims.push_back(dim);
  }
}

ShapeMap collect_shapes(const onnx::GraphProto& g) {
  ShapeMap map;
  for (const auto& t : g.initializer()) {
    ShapeInfo& s = map[t.name()];
    s.elem_type = t.data_type();
    s.has_shape = true;
    for (auto d : t.dims()) s.dims.push_back(Dim{d, {}});
  }
  for (const auto& v : g.input())
    if (!map.count(v.name())) add_shape(map, v.name(), v.type());
  for (const auto& v : g.value_info()) add_shape(map, v.name(), v.type());
  for (const auto& v : g.output()) add_shape(map, v.name(), v.type());
  return map;
}

bool fully_known(const ShapeMap& map, const std::string& name) {
  auto it = map.find(name);
  if (it == map.end() || !it->second.has_shape) return false;
  for (const auto& d : it->second.dims)
    if (!d.known()) return false;
  return true;
}

// Replaces shape-deciding inputs with known values by constant initializers; returns how many.
int pin_known_values(onnx::GraphProto& g, const ShapeMap& shapes, const ValueMap& values,
                     int& serial) {
  std::unordered_set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  int pinned = 0;
  for (auto& n : *g.mutable_node()) {
    const auto* positions = shape_inputs(n.op_type());
    if (!positions) continue;
    bool outputs_known = true;
    for (const auto& o : n.output())
      outputs_known = outputs_known && (o.empty() || fully_known(shapes, o));
    if (outputs_known) continue;
    for (int pos : *positions) {
      if (pos >= n.input_size() || n.input(pos).empty() || inits.count(n.input(pos))) continue;
      auto it = values.find(n.input(pos));
      if (it == values.end()) continue;
      std::string name = fmt::format("hp_pinned_{}", serial++);
      *g.add_initializer() = make_constant(name, it->second);
      inits.insert(name);
      n.set_input(pos, name);
      ++pinned;
    }
  }
  return pinned;
}

// ONNX 1.12 infers only the rank of an Einsum's output; compute its dims when the inputs are known.
// Returns how many outputs got a shape they did not have.
int fix_einsum_shapes(const onnx::GraphProto& g, const ShapeMap& shapes, ShapeMap& fixed) {
  int added = 0;
  for (const auto& n : g.node()) {
    if (n.op_type() != "Einsum" || n.output_size() == 0 || fully_known(shapes, n.output(0)))
      continue;
    std::vector<std::vector<std::int64_t>> ins;
    std::int32_t type = 0;
    for (const auto& in : n.input()) {
      if (!fully_known(shapes, in)) break;
      const ShapeInfo& s = shapes.at(in);
      type = s.elem_type;
      ins.emplace_back();
      for (const auto& d : s.dims) ins.back().push_back(d.value);
    }
    if (ins.size() != static_cast<std::size_t>(n.input_size())) continue;
    auto e = analyse_einsum(attr_string(n, "equation", ""), ins);
    if (!e || fixed.count(n.output(0))) continue;
    ShapeInfo& out = fixed[n.output(0)];
    out.elem_type = type;
    out.has_shape = true;
    for (auto d : e->output) out.dims.push_back(Dim{d, {}});
    ++added;
  }
  return added;
}

// Re-adds hp's own shapes as value_info, which ONNX merges with (and propagates from) what it
// infers.
void add_fixed_value_info(onnx::GraphProto& g, const ShapeMap& fixed) {
  for (const auto& [name, s] : fixed) {
    auto* vi = g.add_value_info();
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(s.elem_type);
    auto* shape = tt->mutable_shape();
    for (const auto& d : s.dims) shape->add_dim()->set_dim_value(d.value);
  }
}

// A graph output declared without a type (a part cut out of a larger graph declares its outputs by
// name only) that an op ONNX does not know writes (hp.AllToAll read by a Mul whose Shape is taken):
// libonnx's inference dereferences the missing type when it merges in the value_info hp declares
// for it, and dies with SIGSEGV. Each round such an output takes the type hp declares (`untyped`:
// the outputs the model left untyped), shape included.
void type_untyped_outputs(onnx::GraphProto& g, const std::set<std::string>& untyped) {
  std::unordered_map<std::string, const onnx::TypeProto*> declared;
  for (const auto& vi : g.value_info())
    if (vi.type().has_tensor_type()) declared.emplace(vi.name(), &vi.type());
  for (auto& out : *g.mutable_output()) {
    if (!untyped.count(out.name())) continue;
    out.clear_type();
    if (auto it = declared.find(out.name()); it != declared.end())
      *out.mutable_type() = *it->second;
  }
}

}  // namespace

Expected<InferResult> infer_shapes(const Model& model, const DimBindings& dims) {
  InferResult result;
  HP_TRY(check_node_schemas(model.proto->graph(), model.opsets, model.path.string()));
  onnx::ModelProto copy = weightless_copy(*model.proto);
  onnx::GraphProto& g = *copy.mutable_graph();
  strip_subgraph_output_shapes(g);

  std::unordered_set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  std::set<std::string> used, unbound;
  for (auto& in : *g.mutable_input()) {
    // An input without a shape stays one: mutable_shape() would declare it a scalar.
    if (inits.count(in.name()) || !in.type().has_tensor_type() ||
        !in.type().tensor_type().has_shape())
      continue;
    auto* shape = in.mutable_type()->mutable_tensor_type()->mutable_shape();
    for (auto& d : *shape->mutable_dim()) {
      if (!d.has_dim_param()) continue;
      auto it = dims.find(d.dim_param());
      if (it == dims.end()) {
        unbound.insert(d.dim_param());
        continue;
      }
      used.insert(it->first);
      d.set_dim_value(it->second);
    }
  }
  for (const auto& [name, value] : dims)
    if (!used.count(name))
      result.warnings.push_back(fmt::format("dim '{}' matches no symbolic input dim", name));
  for (const auto& name : unbound) {
    result.unknown_dims.push_back(name);
    result.warnings.push_back(
        fmt::format("input dim '{}' is not bound; costs that depend on it are "
                    "not counted (pass --dim {}=N)",
                    name, name));
  }

  int opset = 0;
  for (const auto& op : copy.opset_import())
    if (op.domain().empty() || op.domain() == "ai.onnx") opset = static_cast<int>(op.version());
  {
    const std::lock_guard<std::mutex> registry(onnx_registry_mutex());
    const auto& known = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
    if (auto it = known.find(""); it != known.end() && opset > it->second.second)
      result.warnings.push_back(
          fmt::format("the model's opset {} is newer than this build's onnx library knows ({}); "
                      "ops changed since may have unknown shapes",
                      opset, it->second.second));
  }
  onnx::ShapeInferenceOptions options(/*check_type=*/false, /*error_mode=*/0, /*data_prop=*/true);
  int serial = 0;
  ShapeMap fixed;
  std::set<std::string> untyped;
  for (const auto& out : g.output())
    if (out.type().value_case() == onnx::TypeProto::VALUE_NOT_SET) untyped.insert(out.name());
  for (int round = 0; round < kMaxRounds; ++round) {
    g.clear_value_info();
    add_fixed_value_info(g, fixed);
    add_type_stubs(g, fixed, result.shapes, opset);
    type_untyped_outputs(g, untyped);
    HP_TRY(infer_shapes_isolated(copy, options, model.path.string()));
    result.shapes = collect_shapes(g);
    ValueMap values = evaluate_shape_values(g, result.shapes, opset);
    for (const auto& [name, v] : values) result.valued.insert(name);
    if (lower_sequences(g, result.shapes, values, opset, serial, result.sequences) > 0) continue;
    int progress = pin_known_values(g, result.shapes, values, serial);
    progress += fix_einsum_shapes(g, result.shapes, fixed);
    progress += fix_onehot_shapes(g, result.shapes, values, fixed);
    progress += fix_hp_domain_shapes(g, result.shapes, fixed);
    progress += bind_loop_body_inputs(g, result.shapes);
    progress += fix_loop_shapes(g, result.shapes, fixed);
    if (progress == 0) break;
  }

  // Sequence-typed tensors left as they are (a Loop whose trip count stays unknown): no shapes.
  for (const auto* list : {&g.input(), &g.value_info(), &g.output()})
    for (const auto& v : *list)
      if (v.type().has_sequence_type()) result.sequences.insert(v.name());
  for (const auto& name : result.sequences) {
    ShapeInfo& info = result.shapes[name];
    info.has_shape = false;
    info.dims.clear();
  }
  result.unresolved = find_unresolved(model.proto->graph(), result);
  std::int64_t shapeless = 0;
  for (const auto& n : model.proto->graph().node())
    for (const auto& o : n.output()) {
      if (o.empty() || result.sequences.count(o)) continue;
      auto it = result.shapes.find(o);
      shapeless += it == result.shapes.end() || !it->second.has_shape;
    }
  if (shapeless > 0)
    result.warnings.push_back(fmt::format("{} tensors have no inferred shape", shapeless));
  constexpr std::size_t kListed = 5;
  for (std::size_t i = 0; i < result.unresolved.size() && i < kListed; ++i) {
    const UnresolvedShape& u = result.unresolved[i];
    result.warnings.push_back(fmt::format("node '{}' ({}): output '{}' has no concrete shape: {}",
                                          u.node, u.op, u.tensor, u.reason));
  }
  if (result.unresolved.size() > kListed)
    result.warnings.push_back(
        fmt::format("{} more nodes leave shapes unknown", result.unresolved.size() - kListed));
  return result;
}

}  // namespace hp::model
