// ABI 1.2 entry points of the cpu backend (supports_op, run_op) and the helpers every kernel family
// shares: the OpCall view of an hp_op_desc, shape arithmetic and ONNX broadcasting. See cpu_ops.h
// for the design.
#include "cpu_ops.h"

#include <cstring>

using hp_common::make_status;

namespace hp_cpu {

int dtype_size(int dtype) {
  switch (dtype) {
    case HP_F32:
    case HP_I32:
    case HP_U32: return 4;
    case HP_F64:
    case HP_I64:
    case HP_U64: return 8;
    case HP_F16:
    case HP_BF16:
    case HP_I16:
    case HP_U16: return 2;
    case HP_I8:
    case HP_BOOL:
    case HP_U8:
    case HP_F8: return 1;
    default: return 0;
  }
}

int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

Dims strides_of(const Dims& d) {
  Dims s(d.size(), 1);
  for (size_t i = d.size(); i-- > 1;) s[i - 1] = s[i] * d[i];
  return s;
}

std::string dims_str(const Dims& d) {
  std::string r = "[";
  for (size_t i = 0; i < d.size(); ++i) r += (i ? "," : "") + std::to_string(d[i]);
  return r + "]";
}

std::vector<int64_t> View::ints() const {
  std::vector<int64_t> r(static_cast<size_t>(numel()));
  for (size_t k = 0; k < r.size(); ++k) {
    switch (dtype) {
      case HP_I64: r[k] = as<int64_t>()[k]; break;
      case HP_I32: r[k] = as<int32_t>()[k]; break;
      case HP_I16: r[k] = as<int16_t>()[k]; break;
      case HP_I8: r[k] = as<int8_t>()[k]; break;
      case HP_BOOL:
      case HP_U8: r[k] = as<uint8_t>()[k]; break;
      case HP_U16: r[k] = as<uint16_t>()[k]; break;
      case HP_U32: r[k] = as<uint32_t>()[k]; break;
      case HP_U64: r[k] = static_cast<int64_t>(as<uint64_t>()[k]); break;
      default: throw OpError("expected an integer tensor");
    }
  }
  return r;
}

double View::scalar() const {
  if (numel() < 1) throw OpError("expected a scalar, got an empty tensor");
  double v = 0;
  dispatch(dtype,
           [&](auto t) { v = static_cast<double>(static_cast<const decltype(t)*>(data)[0]); });
  return v;
}

OpCall::OpCall(const hp_op_desc& d, hp_ctx* ctx, hp_stream* s)
    : desc_(d), ctx_(ctx), stream_(s), op_(d.op_type ? d.op_type : "") {
  for (int64_t k = 0; k < d.n_inputs; ++k) {
    const hp_tensor_desc& t = d.inputs[k];
    View v;
    v.dtype = t.data || t.dtype >= 0 ? t.dtype : -1;
    if (t.rank < 0 || t.rank > HP_MAX_RANK) throw OpError("input rank out of range");
    v.dims.assign(t.dims, t.dims + t.rank);
    v.data = t.data;
    // The ABI boundary: every kernel multiplies dims into element counts and byte offsets, so a
    // negative dim or a count that overflows is refused before any kernel sees it.
    int64_t n = 1;
    for (int64_t x : v.dims) {
      if (x < 0 || (x != 0 && n > (int64_t{1} << 56) / x))
        throw OpError("input " + std::to_string(k) + " has an invalid shape " + dims_str(v.dims));
      n *= x;
    }
    if (v.present() && v.numel() > 0 && !v.data)
      throw OpError("input " + std::to_string(k) + " has no data");
    inputs_.push_back(std::move(v));
  }
}

const View& OpCall::in(size_t i) const { return i < inputs_.size() ? inputs_[i] : absent_; }

const View& OpCall::need(size_t i) const {
  const View& v = in(i);
  if (!v.present()) fail("input " + std::to_string(i) + " is required");
  return v;
}

View OpCall::out(int64_t i, int dtype, const Dims& dims) {
  if (i < 0 || i >= desc_.n_outputs) fail("output " + std::to_string(i) + " out of range");
  if (dims.size() > HP_MAX_RANK)
    fail("output rank " + std::to_string(dims.size()) + " exceeds the maximum");
  int64_t n = 1;
  for (int64_t x : dims) {
    if (x < 0) fail("negative output dim in " + dims_str(dims));
    if (x != 0 && n > (int64_t{1} << 56) / x)
      fail("output shape " + dims_str(dims) + " is too large");
    n *= x;
  }
  hp_tensor_desc t;
  std::memset(&t, 0, sizeof t);
  if (!desc_.alloc_output(desc_.alloc_user, static_cast<int32_t>(i), dtype,
                          static_cast<int32_t>(dims.size()), dims.data(), &t))
    throw OpError("cannot allocate output " + std::to_string(i) + " " + dims_str(dims),
                  HP_NO_MEMORY);
  View v;
  v.dtype = dtype;
  v.dims = dims;
  v.data = t.data;
  return v;
}

const hp_op_attr* OpCall::find(const char* name) const {
  for (int64_t k = 0; k < desc_.n_attrs; ++k)
    if (desc_.attrs[k].name && std::strcmp(desc_.attrs[k].name, name) == 0) return &desc_.attrs[k];
  return nullptr;
}

bool OpCall::has(const char* name) const { return find(name) != nullptr; }

int64_t OpCall::i(const char* name, int64_t dflt) const {
  const hp_op_attr* a = find(name);
  return a ? a->i : dflt;
}

double OpCall::f(const char* name, double dflt) const {
  const hp_op_attr* a = find(name);
  return a ? a->f : dflt;
}

std::string OpCall::s(const char* name, const std::string& dflt) const {
  const hp_op_attr* a = find(name);
  return a && a->s ? a->s : dflt;
}

std::vector<int64_t> OpCall::ints(const char* name) const {
  const hp_op_attr* a = find(name);
  if (!a || !a->ints) return {};
  return {a->ints, a->ints + a->n};
}

std::vector<double> OpCall::floats(const char* name) const {
  const hp_op_attr* a = find(name);
  if (!a || !a->floats) return {};
  return {a->floats, a->floats + a->n};
}

std::vector<std::string> OpCall::strings(const char* name) const {
  const hp_op_attr* a = find(name);
  std::vector<std::string> r;
  if (!a || a->kind != HP_ATTR_STRINGS || !a->s) return r;
  const char* p = a->s;
  for (int64_t k = 0; k < a->n; ++k) {
    r.emplace_back(p);
    p += r.back().size() + 1;
  }
  return r;
}

const hp_tensor_desc* OpCall::tensor(const char* name) const {
  const hp_op_attr* a = find(name);
  return a ? a->tensor : nullptr;
}

// Strict: a scalar has no axis. Every kernel indexes dims[axis] with the result, so a rank-0
// input given an axis (Concat of scalars) must be an error here, not a write past the dims.
int64_t OpCall::axis(int64_t a, int64_t rank) const {
  if (a < -rank || a >= rank)
    fail("axis " + std::to_string(a) + " out of range for rank " + std::to_string(rank));
  return a < 0 ? a + rank : a;
}

void OpCall::fail(const std::string& message) const { throw OpError(message); }

Dims broadcast_shapes(const Dims& a, const Dims& b, const OpCall& c) {
  size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (size_t k = 0; k < r; ++k) {
    int64_t x = k < r - a.size() ? 1 : a[k - (r - a.size())];
    int64_t y = k < r - b.size() ? 1 : b[k - (r - b.size())];
    if (x != y && x != 1 && y != 1)
      c.fail("cannot broadcast " + dims_str(a) + " with " + dims_str(b));
    out[k] = x == 1 ? y : x;
  }
  return out;
}

Dims broadcast_strides(const Dims& in, const Dims& out) {
  Dims s(out.size(), 0);
  Dims own = strides_of(in);
  size_t off = out.size() - in.size();
  for (size_t k = 0; k < in.size(); ++k) s[k + off] = in[k] == 1 ? 0 : own[k];
  return s;
}

bool all_f32(const std::vector<int32_t>& d) {
  for (int32_t t : d)
    if (t != HP_F32 && t != -1) return false;
  return !d.empty();
}

bool is_float(int32_t t) { return t == HP_F32 || t == HP_F64; }

bool is_int(int32_t t) {
  switch (t) {
    case HP_I8:
    case HP_I16:
    case HP_I32:
    case HP_I64:
    case HP_U8:
    case HP_U16:
    case HP_U32:
    case HP_U64: return true;
    default: return false;
  }
}

bool is_num(int32_t t) { return is_float(t) || is_int(t); }

bool same_float(const std::vector<int32_t>& d) {
  if (d.empty() || (d[0] != HP_F32 && d[0] != HP_F64)) return false;
  for (int32_t t : d)
    if (t != -1 && t != d[0]) return false;
  return true;
}

const OpTable& op_table() {
  static const OpTable table = [] {
    OpTable t;
    // The float math families also take f16/bf16 through their f32 kernels.
    for (auto reg : {register_elementwise_ops, register_nn_ops, register_conv_ops,
                     register_reduce_ops, register_pool_ops, register_norm_ops}) {
      OpTable part;
      reg(part);
      for (auto& [name, e] : part) {
        e.halves = true;
        t[name] = e;
      }
    }
    register_cast_ops(t);  // converts 16-bit floats itself
    register_shape_ops(t);
    register_index_ops(t);
    register_resample_ops(t);
    register_scatter_ops(t);
    register_rnn_ops(t);
    register_loss_ops(t);
    register_attention_ops(t);
    register_misc_ops(t);
    register_convt_ops(t);
    register_quant_ops(t);
    register_signal_ops(t);
    register_vision_ops(t);
    register_linalg_ops(t);
    register_qconv_ops(t);
    register_optim_ops(t);
    register_text_ops(t);
    register_random_ops(t);
    register_grad_ops(t);
    register_vocab_ops(t);
    return t;
  }();
  return table;
}

namespace {

/// The table key of an op: its type for ai.onnx (domain "" or "ai.onnx"), else "domain.type".
std::string op_key(const char* op_type, const char* domain) {
  if (!domain || !*domain || std::strcmp(domain, "ai.onnx") == 0) return op_type;
  return std::string(domain) + "." + op_type;
}

}  // namespace

int32_t supports_op(hp_ctx*, int32_t dev, const char* op_type, const char* domain, int64_t,
                    const int32_t* input_dtypes, int64_t n_inputs) {
  if (dev != 0 || !op_type) return 0;
  try {
    auto it = op_table().find(op_key(op_type, domain));
    if (it == op_table().end()) return 0;
    if (!input_dtypes) return 1;  // "is the op type implemented at all"
    std::vector<int32_t> dt(input_dtypes, input_dtypes + n_inputs);
    if (it->second.accepts(dt)) return 1;
    return it->second.halves && half_input_type(input_dtypes, n_inputs) >= 0 &&
                   accepts_widened(it->second, dt)
               ? 1
               : 0;
  } catch (...) {
    return 0;
  }
}

hp_status* run_op(hp_ctx* ctx, hp_stream* s, const hp_op_desc* in) {
  if (!ctx || !s || !in || !in->op_type || !in->alloc_output)
    return make_status(HP_INVALID, "cpu: run_op: null argument");
  hp_op_desc d = hp_common::copy_in(in);
  const char* node = d.node_name && *d.node_name ? d.node_name : "?";
  try {
    auto it = op_table().find(op_key(d.op_type, d.domain));
    if (it == op_table().end())
      return make_status(HP_UNSUPPORTED, "cpu: %s (node %s): op not supported", d.op_type, node);
    std::vector<int32_t> dt;
    for (int64_t k = 0; k < d.n_inputs; ++k)
      dt.push_back(d.inputs[k].data || d.inputs[k].dtype >= 0 ? d.inputs[k].dtype : -1);
    const int half = half_input_type(dt.data(), d.n_inputs);
    if (it->second.halves && half >= 0 && !it->second.accepts(dt)) {
      run_widened(it->second, d, half, ctx, s);
      return nullptr;
    }
    OpCall call(d, ctx, s);
    it->second.run(call);
    return nullptr;
  } catch (const OpError& e) {
    return make_status(e.code, "cpu: %s (node %s): %s", d.op_type, node, e.what());
  } catch (const std::bad_alloc&) {
    return make_status(HP_NO_MEMORY, "cpu: %s (node %s): out of host memory", d.op_type, node);
  } catch (const std::exception& e) {
    return make_status(HP_INTERNAL, "cpu: %s (node %s): %s", d.op_type, node, e.what());
  } catch (...) {
    return make_status(HP_INTERNAL, "cpu: %s (node %s): unknown exception", d.op_type, node);
  }
}

}  // namespace hp_cpu
