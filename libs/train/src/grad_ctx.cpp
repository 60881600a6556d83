// GraphWriter and GradCtx (grad_ctx.h): node emission, constants, Shape memo and attribute access.
#include <fmt/core.h>

#include <cstring>

#include "grad_ctx.h"

namespace hp::train::detail {

namespace {

void set_attr(onnx::AttributeProto& a, const Attr& at) {
  a.set_name(at.name);
  if (auto* i = std::get_if<std::int64_t>(&at.value)) {
    a.set_type(onnx::AttributeProto::INT);
    a.set_i(*i);
  } else if (auto* f = std::get_if<double>(&at.value)) {
    a.set_type(onnx::AttributeProto::FLOAT);
    a.set_f(static_cast<float>(*f));
  } else if (auto* s = std::get_if<std::string>(&at.value)) {
    a.set_type(onnx::AttributeProto::STRING);
    a.set_s(*s);
  } else if (auto* fs = std::get_if<std::vector<double>>(&at.value)) {
    a.set_type(onnx::AttributeProto::FLOATS);
    for (double v : *fs) a.add_floats(static_cast<float>(v));
  } else if (auto* ss = std::get_if<std::vector<std::string>>(&at.value)) {
    a.set_type(onnx::AttributeProto::STRINGS);
    for (const auto& v : *ss) a.add_strings(v);
  } else {
    a.set_type(onnx::AttributeProto::INTS);
    for (std::int64_t v : std::get<std::vector<std::int64_t>>(at.value)) a.add_ints(v);
  }
}

}  // namespace

std::string GraphWriter::fresh(const std::string& hint) {
  return fmt::format("hp_grad/{}_{}", hint, counter++);
}

std::vector<std::string> GraphWriter::emit(const std::string& op,
                                           const std::vector<std::string>& inputs, int n,
                                           const std::vector<Attr>& attrs,
                                           const std::string& domain,
                                           std::vector<std::string> outs) {
  onnx::NodeProto* node = graph->add_node();
  node->set_op_type(op);
  if (!domain.empty()) node->set_domain(domain);
  node->set_name(fresh(op));
  for (const auto& i : inputs) node->add_input(i);
  if (outs.empty())
    for (int k = 0; k < n; ++k) outs.push_back(fresh(op + "_out"));
  for (const auto& o : outs) node->add_output(o);
  for (const auto& a : attrs) set_attr(*node->add_attribute(), a);
  for (const auto& o : outs)
    if (!o.empty()) made[o] = node;
  return outs;
}

std::string GraphWriter::i64s(const std::vector<std::int64_t>& v) {
  std::string key = "i64:";
  for (auto x : v) key += std::to_string(x) + ",";
  auto it = consts.find(key);
  if (it != consts.end()) return it->second;
  onnx::TensorProto* t = graph->add_initializer();
  const std::string name = fresh("const");
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<std::int64_t>(v.size()));
  for (auto x : v) t->add_int64_data(x);
  consts.emplace(key, name);
  types[name] = onnx::TensorProto::INT64;
  return name;
}

std::string GraphWriter::scalar(double v, std::int32_t elem_type) {
  if (elem_type == 0) elem_type = onnx::TensorProto::FLOAT;
  const std::string key = fmt::format("s{}:{}", elem_type, v);
  auto it = consts.find(key);
  if (it != consts.end()) return it->second;
  onnx::TensorProto* t = graph->add_initializer();
  const std::string name = fresh("const");
  t->set_name(name);
  t->set_data_type(elem_type);
  if (elem_type == onnx::TensorProto::DOUBLE)
    t->add_double_data(v);
  else if (elem_type == onnx::TensorProto::INT64)
    t->add_int64_data(static_cast<std::int64_t>(v));
  else
    t->add_float_data(static_cast<float>(v));  // f32 (f16/bf16 models train in f32 here)
  consts.emplace(key, name);
  types[name] = elem_type;
  return name;
}

std::string GraphWriter::shape_of(const std::string& t) {
  auto it = shapes.find(t);
  if (it != shapes.end()) return it->second;
  std::string s = emit("Shape", {t}, 1)[0];
  types[s] = onnx::TensorProto::INT64;
  shapes.emplace(t, s);
  return s;
}

void GraphWriter::declare_like(onnx::ValueInfoProto& v, std::int32_t elem_type,
                               const std::string& like, bool drop_last) const {
  auto* tt = v.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  int i = fwd->find_tensor(original(like));
  if (i < 0 || !fwd->tensor(i).has_shape) return;
  const auto& dims = fwd->tensor(i).dims;
  auto* sh = tt->mutable_shape();
  for (std::size_t k = 0; k + (drop_last ? 1 : 0) < dims.size(); ++k) {
    auto* d = sh->add_dim();
    if (dims[k].known())
      d->set_dim_value(dims[k].value);
    else if (!dims[k].symbol.empty() && dims[k].symbol.rfind("unk__", 0) != 0)
      d->set_dim_param(dims[k].symbol);
  }
}

std::int32_t GraphWriter::elem_type(const std::string& t) const {
  auto it = types.find(t);
  if (it != types.end()) return it->second;
  int i = fwd->find_tensor(original(t));
  return i < 0 ? 0 : fwd->tensor(i).elem_type;
}

std::optional<std::vector<std::int64_t>> GraphWriter::static_shape(const std::string& t) const {
  int i = fwd->find_tensor(original(t));
  if (i < 0 || !fwd->tensor(i).has_shape) return std::nullopt;
  std::vector<std::int64_t> d;
  for (const auto& dim : fwd->tensor(i).dims) {
    if (!dim.known()) return std::nullopt;
    d.push_back(dim.value);
  }
  return d;
}

int GraphWriter::rank(const std::string& t) const {
  int i = fwd->find_tensor(original(t));
  if (i < 0 || !fwd->tensor(i).has_shape) return -1;
  return static_cast<int>(fwd->tensor(i).dims.size());
}

namespace {

/// Where a forward constant's value lives: an initializer, or a Constant node (its `value` tensor,
/// or for value_int(s)/value_float only the node). Both null when `t` is neither.
struct ConstSource {
  const onnx::TensorProto* tensor = nullptr;
  const onnx::NodeProto* node = nullptr;
};

ConstSource find_const(const onnx::GraphProto& g, const std::string& t) {
  for (const auto& init : g.initializer())
    if (init.name() == t) return {&init, nullptr};
  for (const auto& n : g.node())
    if (n.op_type() == "Constant" && n.output_size() == 1 && n.output(0) == t) {
      for (const auto& a : n.attribute())
        if (a.name() == "value" && a.has_t()) return {&a.t(), &n};
      return {nullptr, &n};
    }
  return {};
}

}  // namespace

std::optional<std::vector<std::int64_t>> GraphWriter::const_ints(const std::string& t) const {
  auto ints_of = [](const onnx::TensorProto& p) -> std::optional<std::vector<std::int64_t>> {
    if (p.data_location() == onnx::TensorProto::EXTERNAL) return std::nullopt;
    std::vector<std::int64_t> v;
    if (p.data_type() == onnx::TensorProto::INT64) {
      if (p.has_raw_data()) {
        v.resize(p.raw_data().size() / sizeof(std::int64_t));
        if (!v.empty()) std::memcpy(v.data(), p.raw_data().data(), v.size() * sizeof(std::int64_t));
      } else {
        v.assign(p.int64_data().begin(), p.int64_data().end());
      }
      return v;
    }
    if (p.data_type() == onnx::TensorProto::INT32) {
      if (p.has_raw_data()) {
        std::vector<std::int32_t> w(p.raw_data().size() / sizeof(std::int32_t));
        if (!w.empty()) std::memcpy(w.data(), p.raw_data().data(), w.size() * sizeof(std::int32_t));
        v.assign(w.begin(), w.end());
      } else {
        v.assign(p.int32_data().begin(), p.int32_data().end());
      }
      return v;
    }
    return std::nullopt;
  };
  const ConstSource src = find_const(*fwd_proto, original(t));
  if (src.tensor) return ints_of(*src.tensor);
  if (src.node)
    for (const auto& a : src.node->attribute()) {
      if (a.name() == "value_ints")
        return std::vector<std::int64_t>(a.ints().begin(), a.ints().end());
      if (a.name() == "value_int") return std::vector<std::int64_t>{a.i()};
    }
  return std::nullopt;
}

std::optional<double> GraphWriter::const_scalar(const std::string& t) const {
  auto value_of = [](const onnx::TensorProto& p) -> std::optional<double> {
    std::int64_t n = 1;
    for (auto d : p.dims()) n *= d;
    if (n != 1 || p.data_location() == onnx::TensorProto::EXTERNAL) return std::nullopt;
    if (p.data_type() == onnx::TensorProto::FLOAT) {
      if (p.has_raw_data() && p.raw_data().size() == 4) {
        float f;
        std::memcpy(&f, p.raw_data().data(), 4);
        return f;
      }
      if (p.float_data_size() == 1) return p.float_data(0);
    }
    if (p.data_type() == onnx::TensorProto::DOUBLE) {
      if (p.has_raw_data() && p.raw_data().size() == 8) {
        double d;
        std::memcpy(&d, p.raw_data().data(), 8);
        return d;
      }
      if (p.double_data_size() == 1) return p.double_data(0);
    }
    return std::nullopt;
  };
  const ConstSource src = find_const(*fwd_proto, original(t));
  if (src.tensor) return value_of(*src.tensor);
  if (src.node)
    for (const auto& a : src.node->attribute())
      if (a.name() == "value_float") return a.f();
  return std::nullopt;
}

const std::string& GradCtx::in(int i) const {
  static const std::string none;
  return i >= 0 && i < n_in() ? ins_[static_cast<std::size_t>(i)] : none;
}

const std::string& GradCtx::out(int j) const {
  static const std::string none;
  return j >= 0 && j < n_out() ? outs_[static_cast<std::size_t>(j)] : none;
}

const std::string& GradCtx::dout(int j) const {
  static const std::string none;
  return j >= 0 && j < n_out() ? douts_[static_cast<std::size_t>(j)] : none;
}

bool GradCtx::any_wanted() const {
  for (bool b : wants_)
    if (b) return true;
  return false;
}

void GradCtx::grad(int i, const std::string& g) {
  if (wants(i) && !g.empty()) grads_[static_cast<std::size_t>(i)] = g;
}

std::string GradCtx::op(const std::string& type, const std::vector<std::string>& inputs,
                        const std::vector<Attr>& attrs, const std::string& domain) {
  return w_.emit(type, inputs, 1, attrs, domain)[0];
}

std::vector<std::string> GradCtx::op_n(const std::string& type,
                                       const std::vector<std::string>& inputs, int n,
                                       const std::vector<Attr>& attrs, const std::string& domain) {
  return w_.emit(type, inputs, n, attrs, domain);
}

std::vector<std::string> GradCtx::op_opt(const std::string& type,
                                         const std::vector<std::string>& inputs,
                                         const std::vector<bool>& present,
                                         const std::vector<Attr>& attrs,
                                         const std::string& domain) {
  std::vector<std::string> outs;
  for (bool p : present) outs.push_back(p ? w_.fresh(type + "_out") : std::string());
  while (!outs.empty() && outs.back().empty()) outs.pop_back();
  auto got = w_.emit(type, inputs, 0, attrs, domain, outs);
  got.resize(present.size());
  return got;
}

std::string GradCtx::scalar(double v, const std::string& like) {
  return w_.scalar(v, w_.elem_type(like));
}

std::string GradCtx::sum_to(const std::string& g, const std::string& like,
                            const std::string& full) {
  auto a = w_.static_shape(like), b = w_.static_shape(full);
  if (a && b && *a == *b) return g;
  return hp("SumTo", {g, shape_of(like)});
}

namespace {

const onnx::AttributeProto* find_attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

}  // namespace

bool GradCtx::has(const std::string& name) const { return find_attr(node_, name) != nullptr; }

std::int64_t GradCtx::attr_i(const std::string& name, std::int64_t dflt) const {
  const auto* a = find_attr(node_, name);
  return a ? a->i() : dflt;
}

double GradCtx::attr_f(const std::string& name, double dflt) const {
  const auto* a = find_attr(node_, name);
  return a ? a->f() : dflt;
}

std::string GradCtx::attr_s(const std::string& name, const std::string& dflt) const {
  const auto* a = find_attr(node_, name);
  return a ? a->s() : dflt;
}

std::vector<std::int64_t> GradCtx::attr_ints(const std::string& name) const {
  const auto* a = find_attr(node_, name);
  return a ? std::vector<std::int64_t>(a->ints().begin(), a->ints().end())
           : std::vector<std::int64_t>{};
}

std::vector<Attr> GradCtx::all_attrs() const {
  std::vector<Attr> out;
  for (const auto& a : node_.attribute()) {
    switch (a.type()) {
      case onnx::AttributeProto::INT: out.push_back({a.name(), a.i()}); break;
      case onnx::AttributeProto::FLOAT:
        out.push_back({a.name(), static_cast<double>(a.f())});
        break;
      case onnx::AttributeProto::STRING: out.push_back({a.name(), a.s()}); break;
      case onnx::AttributeProto::INTS:
        out.push_back({a.name(), std::vector<std::int64_t>(a.ints().begin(), a.ints().end())});
        break;
      case onnx::AttributeProto::FLOATS:  // a recurrent layer's activation_alpha / _beta
        out.push_back({a.name(), std::vector<double>(a.floats().begin(), a.floats().end())});
        break;
      case onnx::AttributeProto::STRINGS:  // a recurrent layer's activations
        out.push_back({a.name(), std::vector<std::string>(a.strings().begin(), a.strings().end())});
        break;
      default: break;
    }
  }
  return out;
}

Error GradCtx::fail(const std::string& message) const {
  return Error(
      Errc::bad_input, message,
      fmt::format("node '{}' ({})", node_.name().empty() ? out(0) : node_.name(), node_.op_type()));
}

}  // namespace hp::train::detail
