// Builds the skeleton graphs of hp/model/skeleton.h with the ONNX protobuf types.
//
// The structure follows recipes/skeletons/gen_skeletons.py node for node (the same node and
// tensor names, the same initializer order), so a skeleton written here for a preset describes the
// same model as the checked-in one, and the parity test can compare the two protos field by field.
// Weights are float16 initializers with external data in "<name>.weights" at consecutive offsets:
// the file never exists, but its offsets and lengths are the ones a real export would have, so the
// loader's checks of external data (offset + length against the dtype and shape) still pass.
// Shape and axis vectors are int64 initializers with data (they are not parameters); scalars are
// Constant nodes so they are not counted as parameters either.
#include <onnx/onnx_pb.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "hp/model/skeleton.h"

namespace hp::model {
namespace {

constexpr int kFloat16 = onnx::TensorProto::FLOAT16;
constexpr int kInt64 = onnx::TensorProto::INT64;

// IEEE half bits of a float with round-to-nearest-even; the constants here (1/sqrt(head_dim),
// sqrt 2, 1, 0.5) are normal halves, and subnormals flush to zero, which none of them needs.
std::uint16_t to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  std::uint32_t mant = x & 0x7fffffu;
  if (exp <= 0) return static_cast<std::uint16_t>(sign);
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  std::uint32_t h = sign | (static_cast<std::uint32_t>(exp) << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carries into the exponent if needed
  return static_cast<std::uint16_t>(h);
}

using Attr = onnx::AttributeProto;

Attr attr_int(const std::string& name, std::int64_t v) {
  Attr a;
  a.set_name(name);
  a.set_i(v);
  a.set_type(onnx::AttributeProto::INT);
  return a;
}
Attr attr_float(const std::string& name, float v) {
  Attr a;
  a.set_name(name);
  a.set_f(v);
  a.set_type(onnx::AttributeProto::FLOAT);
  return a;
}
Attr attr_ints(const std::string& name, const std::vector<std::int64_t>& v) {
  Attr a;
  a.set_name(name);
  for (auto x : v) a.add_ints(x);
  a.set_type(onnx::AttributeProto::INTS);
  return a;
}

void set_value_info(onnx::ValueInfoProto* vi, const std::string& name, int elem_type,
                    const std::vector<std::string>& symbolic, std::int64_t last_fixed = -1) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  auto* shape = tt->mutable_shape();
  for (const auto& d : symbolic) shape->add_dim()->set_dim_param(d);
  if (last_fixed >= 0) shape->add_dim()->set_dim_value(last_fixed);
}

// Nodes and initializers in creation order; weights at consecutive offsets of one absent file.
class Builder {
 public:
  explicit Builder(const std::string& name) : data_file_(name + ".weights") {
    graph_.set_name(name);
  }

  std::string weight(const std::string& name, const std::vector<std::int64_t>& dims) {
    std::int64_t n = 1;
    for (auto d : dims) n *= d;
    const std::int64_t length = n * 2;
    auto* t = graph_.add_initializer();
    for (auto d : dims) t->add_dims(d);
    t->set_data_type(kFloat16);
    t->set_name(name);
    const std::pair<const char*, std::string> entries[] = {{"location", data_file_},
                                                           {"offset", std::to_string(offset_)},
                                                           {"length", std::to_string(length)}};
    for (const auto& [k, v] : entries) {
      auto* e = t->add_external_data();
      e->set_key(k);
      e->set_value(v);
    }
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    offset_ += length;
    params_ += n;
    return name;
  }

  std::string ints(const std::string& name, const std::vector<std::int64_t>& values) {
    auto* t = graph_.add_initializer();
    t->add_dims(static_cast<std::int64_t>(values.size()));
    t->set_data_type(kInt64);
    for (auto v : values) t->add_int64_data(v);
    t->set_name(name);
    return name;
  }

  std::string scalar(const std::string& name, double value) {
    onnx::TensorProto t;
    t.set_data_type(kFloat16);
    t.set_name(name + "/value");
    const std::uint16_t h = to_half(static_cast<float>(value));
    char bytes[2];
    std::memcpy(bytes, &h, 2);  // little-endian hosts only, as everywhere in hp
    t.set_raw_data(std::string(bytes, 2));
    Attr a;
    a.set_name("value");
    *a.mutable_t() = t;
    a.set_type(onnx::AttributeProto::TENSOR);
    return op("Constant", {}, name, {a});
  }

  std::string op(const std::string& op_type, const std::vector<std::string>& inputs,
                 const std::string& output, const std::vector<Attr>& attrs = {}) {
    return op_multi(op_type, inputs, {output}, attrs)[0];
  }

  std::vector<std::string> op_multi(const std::string& op_type,
                                    const std::vector<std::string>& inputs,
                                    const std::vector<std::string>& outputs,
                                    const std::vector<Attr>& attrs = {}) {
    auto* n = graph_.add_node();
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    n->set_name(outputs[0] + "/" + op_type);
    n->set_op_type(op_type);
    for (const auto& a : attrs) *n->add_attribute() = a;
    return outputs;
  }

  onnx::GraphProto& graph() { return graph_; }
  std::int64_t params() const { return params_; }

 private:
  onnx::GraphProto graph_;
  std::string data_file_;
  std::int64_t offset_ = 0;
  std::int64_t params_ = 0;
};

std::string norm(Builder& g, const std::string& x, const std::string& w, std::int64_t h,
                 bool bias) {
  std::vector<std::string> ins = {x, g.weight(w + ".weight", {h})};
  if (bias) ins.push_back(g.weight(w + ".bias", {h}));
  return g.op("LayerNormalization", ins, w + "/out",
              {attr_int("axis", -1), attr_float("epsilon", 1e-5f)});
}

std::string linear(Builder& g, const std::string& x, const std::string& w, std::int64_t din,
                   std::int64_t dout, bool bias) {
  std::string y = g.op("MatMul", {x, g.weight(w + ".weight", {din, dout})}, w + "/mm");
  if (!bias) return y;
  return g.op("Add", {y, g.weight(w + ".bias", {dout})}, w + "/out");
}

// Multi-head attention with kv_heads key/value heads repeated to `heads` (grouped-query when
// fewer): (b, s, h) -> q, k, v -> (b, n, s, hd) -> softmax(q k^T / sqrt hd) v -> o_proj.
std::string attention(Builder& g, const std::string& x, const std::string& w,
                      const SkeletonConfig& c) {
  const std::int64_t h = c.hidden, heads = c.heads, kv = c.kv_heads, hd = h / heads;
  std::string q = linear(g, x, w + ".q_proj", h, h, c.bias);
  std::string k = linear(g, x, w + ".k_proj", h, kv * hd, c.bias);
  std::string v = linear(g, x, w + ".v_proj", h, kv * hd, c.bias);
  auto split = [&](const std::string& t, std::int64_t n, const std::string& tag) {
    std::string r =
        g.op("Reshape", {t, g.ints(w + "/" + tag + "_shape", {0, 0, n, hd})}, w + "/" + tag + "_r");
    return g.op("Transpose", {r}, w + "/" + tag + "_t", {attr_ints("perm", {0, 2, 1, 3})});
  };
  auto repeat = [&](const std::string& t, const std::string& tag) {
    if (kv == heads) return t;
    const std::string p = w + "/" + tag;
    std::string u = g.op("Unsqueeze", {t, g.ints(p + "_axis", {2})}, p + "_u");
    std::string e = g.op("Expand", {u, g.ints(p + "_rep", {1, 1, heads / kv, 1, 1})}, p + "_e");
    return g.op("Reshape", {e, g.ints(p + "_merge", {0, heads, -1, hd})}, p + "_rep_out");
  };
  std::string qt = split(q, heads, "q");
  std::string kt = repeat(split(k, kv, "k"), "k");
  std::string vt = repeat(split(v, kv, "v"), "v");
  std::string kT = g.op("Transpose", {kt}, w + "/k_T", {attr_ints("perm", {0, 1, 3, 2})});
  std::string scores = g.op("MatMul", {qt, kT}, w + "/scores");
  scores = g.op("Mul", {scores, g.scalar(w + "/scale", 1.0 / std::sqrt(static_cast<double>(hd)))},
                w + "/scaled");
  std::string probs = g.op("Softmax", {scores}, w + "/probs", {attr_int("axis", -1)});
  std::string ctx = g.op("MatMul", {probs, vt}, w + "/ctx");
  ctx = g.op("Transpose", {ctx}, w + "/ctx_t", {attr_ints("perm", {0, 2, 1, 3})});
  ctx = g.op("Reshape", {ctx, g.ints(w + "/merge", {0, 0, h})}, w + "/merged");
  return linear(g, ctx, w + ".o_proj", h, h, c.bias);
}

// down(silu(x gate) * (x up)); `stacked` > 0: that many experts' weights stacked (E x in x out).
std::string swiglu(Builder& g, const std::string& x, const std::string& w, std::int64_t din,
                   std::int64_t ffn, std::int64_t stacked = 0) {
  std::vector<std::int64_t> lead;
  if (stacked) lead.push_back(stacked);
  auto dims = [&](std::int64_t a, std::int64_t b) {
    auto d = lead;
    d.push_back(a);
    d.push_back(b);
    return d;
  };
  std::string gate =
      g.op("MatMul", {x, g.weight(w + ".gate_proj.weight", dims(din, ffn))}, w + "/gate");
  std::string sig = g.op("Sigmoid", {gate}, w + "/sigmoid");
  std::string silu = g.op("Mul", {gate, sig}, w + "/silu");
  std::string up = g.op("MatMul", {x, g.weight(w + ".up_proj.weight", dims(din, ffn))}, w + "/up");
  std::string hidden = g.op("Mul", {silu, up}, w + "/hidden");
  return g.op("MatMul", {hidden, g.weight(w + ".down_proj.weight", dims(ffn, din))}, w + "/down");
}

// fc -> gelu (erf form, as PyTorch exports it before opset 20) -> proj, with biases; the width is
// 4 x hidden in GPT-2/3 (gen_skeletons.py fixes it so), other widths for GPT-2 configs' n_inner.
std::string gelu_mlp(Builder& g, const std::string& x, const std::string& w, std::int64_t h,
                     std::int64_t ffn) {
  std::string f = linear(g, x, w + ".c_fc", h, ffn, true);
  std::string sqrt2 = g.scalar(w + "/sqrt2", std::sqrt(2.0));
  std::string e = g.op("Erf", {g.op("Div", {f, sqrt2}, w + "/div")}, w + "/erf");
  std::string one = g.scalar(w + "/one", 1.0);
  e = g.op("Add", {e, one}, w + "/erf1");
  std::string fe = g.op("Mul", {f, e}, w + "/mul");
  std::string act = g.op("Mul", {fe, g.scalar(w + "/half", 0.5)}, w + "/gelu");
  return linear(g, act, w + ".c_proj", ffn, h, true);
}

// Router (softmax, top-k gates), `shared` always-on experts and the top-k routed experts with a
// perfectly balanced dispatch: the k copies of each token regrouped to (experts, k*tokens/experts,
// hidden) through stacked expert weights, so the graph's FLOPs are the active (top-k) FLOPs.
std::string moe(Builder& g, const std::string& x, const std::string& w, const SkeletonConfig& c) {
  const std::int64_t h = c.hidden;
  std::string logits =
      g.op("MatMul", {x, g.weight(w + ".gate.weight", {h, c.experts})}, w + "/router_logits");
  std::string scores = g.op("Softmax", {logits}, w + "/router_scores", {attr_int("axis", -1)});
  auto topk = g.op_multi("TopK", {scores, g.ints(w + "/k", {c.top_k})},
                         {w + "/gates", w + "/experts"}, {attr_int("axis", -1)});
  std::string shared;
  if (c.shared > 0) shared = swiglu(g, x, w + ".shared_experts", h, c.shared * c.ffn);
  std::string tokens = g.op("Reshape", {x, g.ints(w + "/tokens_shape", {-1, h})}, w + "/tokens");
  std::string copies = g.op("Tile", {tokens, g.ints(w + "/tile", {c.top_k, 1})}, w + "/copies");
  std::string dispatch =
      g.op("Reshape", {copies, g.ints(w + "/dispatch_shape", {c.experts, -1, h})}, w + "/dispatch");
  std::string routed = swiglu(g, dispatch, w + ".experts", h, c.ffn, c.experts);
  routed =
      g.op("Reshape", {routed, g.ints(w + "/combine_shape", {c.top_k, -1, h})}, w + "/combine");
  std::string gates = g.op("Transpose", {topk[0]}, w + "/gates_t", {attr_ints("perm", {2, 0, 1})});
  gates = g.op("Reshape", {gates, g.ints(w + "/gates_shape", {c.top_k, -1, 1})}, w + "/gates_r");
  std::string weighted = g.op("Mul", {routed, gates}, w + "/weighted");
  std::string summed = g.op("ReduceSum", {weighted, g.ints(w + "/axis0", {0})}, w + "/sum",
                            {attr_int("keepdims", 0)});
  std::string xshape = g.op("Shape", {x}, w + "/x_shape");
  routed = g.op("Reshape", {summed, xshape}, w + "/routed");
  if (shared.empty()) return routed;  // no shared expert (Mixtral): gen_skeletons.py has none such
  return g.op("Add", {shared, routed}, w + "/out");
}

std::string mlp(Builder& g, const std::string& x, const std::string& w, std::int64_t layer,
                const SkeletonConfig& c) {
  switch (c.arch) {
    case SkeletonArch::gpt: return gelu_mlp(g, x, w, c.hidden, c.ffn);
    case SkeletonArch::moe:
      if (layer < c.dense_layers) return swiglu(g, x, w, c.hidden, c.dense_ffn);
      return moe(g, x, w, c);
    case SkeletonArch::llama: break;
  }
  return swiglu(g, x, w, c.hidden, c.ffn);
}

}  // namespace

Expected<std::string> build_skeleton(const SkeletonConfig& c, const std::string& name,
                                     std::int64_t* parameters) {
  HP_TRY(validate_skeleton_config(c));
  Builder g(name);
  const std::int64_t h = c.hidden;
  // Token embedding (+ learned positions), `layers` pre-norm blocks, final norm, lm_head (or,
  // tied, the transposed token embedding).
  std::string x =
      g.op("Gather", {g.weight("embed_tokens.weight", {c.vocab, h}), "input_ids"}, "embed/tokens");
  set_value_info(g.graph().add_input(), "input_ids", kInt64, {"batch", "seq"});
  if (c.positions > 0) {
    std::string pos =
        g.op("Gather", {g.weight("embed_positions.weight", {c.positions, h}), "position_ids"},
             "embed/positions");
    x = g.op("Add", {x, pos}, "embed/out");
    set_value_info(g.graph().add_input(), "position_ids", kInt64, {"batch", "seq"});
  }
  for (std::int64_t i = 0; i < c.layers; ++i) {
    const std::string w = "layers." + std::to_string(i);
    std::string a = attention(g, norm(g, x, w + ".input_norm", h, c.bias), w + ".attn", c);
    x = g.op("Add", {x, a}, w + "/res_attn");
    std::string m = mlp(g, norm(g, x, w + ".post_attention_norm", h, c.bias), w + ".mlp", i, c);
    x = g.op("Add", {x, m}, w + "/res_mlp");
  }
  std::string y = norm(g, x, "norm", h, c.bias);
  std::string head = c.tied ? g.op("Transpose", {"embed_tokens.weight"}, "lm_head/tied",
                                   {attr_ints("perm", {1, 0})})
                            : g.weight("lm_head.weight", {h, c.vocab});
  g.op("MatMul", {y, head}, "logits");
  set_value_info(g.graph().add_output(), "logits", kFloat16, {"batch", "seq"}, c.vocab);

  onnx::ModelProto model;
  model.set_ir_version(8);
  model.set_producer_name("hp model-skeleton");
  *model.mutable_graph() = std::move(g.graph());
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(17);
  if (parameters) *parameters = g.params();
  std::string out;
  if (!model.SerializeToString(&out))
    return Error(Errc::internal, "could not serialize the skeleton's ONNX model", name);
  return out;
}

}  // namespace hp::model
