// Node fusion at preparation: chains of ONNX nodes that one kernel does better are rewritten into
// that kernel's node, when the backend that would run them implements it.
//
// GELU: PyTorch exports the exact GELU (F.gelu, nn.GELU) as five nodes,
//     Div(x, sqrt 2) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(., 0.5)
// each a full pass over the (large, 4 x hidden wide) activation. They become one ONNX Gelu node
// (opset 20, approximate "none"), evaluated in one pass. The chain's intermediates must be read
// only by the next node of the chain and not be graph outputs, and the constants must be scalar
// weights or Constant nodes with those values (within float rounding). Fused-away nodes are marked
// dead: the run skips them, lifetimes ignore them.
//
// Layer norm exported as primitives (below opset 17): one LayerNormalization node
// (exec_fuse_norm.cpp). Attention's scale -> mask -> Softmax: one hp.nn.MaskedSoftmax node
// (exec_fuse_softmax.cpp); with the two matmuls around it and the heads' Transposes, one
// hp.nn.Attention node (exec_fuse_attention.cpp).
//
// Conv + Relu and Conv + Add + Relu (the residual blocks of CNNs): the Relu node becomes ONNX
// Runtime's com.microsoft FusedConv (the Conv's inputs and attributes, activation "Relu", the Add's
// other operand as the fourth input Z), which the cpu backend runs as one oneDNN convolution with
// sum and ReLU post-ops instead of three passes over the activation. The Relu node is the one kept
// because every input of the fused node (the Conv's and Z) is computed before it, while Z may come
// after the Conv in the node order. The Conv's and Add's outputs must be read only by the chain and
// not be graph outputs; the result is the unfused one up to float rounding of the same sums.
//
// MatMul + Add [+ Gelu | Relu] (every linear layer of an exported transformer, and its GELU MLP):
// the last node of the chain becomes hp.nn.MatMulAdd (A, B, Z) with the activation as an
// attribute, which the cpu backend runs as one oneDNN matmul with bias and eltwise post-ops when Z
// is a bias (one value per column) and as the three steps otherwise, so no shape needs to be known
// here. The MatMul's and Add's outputs must be read only by the chain and not be graph outputs. In
// a training graph the Add's output (a GELU's input) is also read by the backward, so only MatMul +
// Add fuse there. A MatMulAdd read only by a further Add (a residual connection, x + proj(h)) takes
// the Add's other operand as a fourth input R, added in the same oneDNN matmul (a binary post-op)
// instead of in a pass over the activation of its own.
#include <atomic>
#include <cmath>
#include <optional>
#include <set>

#include "exec_fuse_graph.h"

namespace hp::exec {

namespace {

int fuse_gelu(FuseGraph& g) {
  int fused = 0;
  for (PreparedNode& erf : g.im.nodes) {
    if (erf.dead || !is_unary(erf, "Erf")) continue;
    PreparedNode* div = g.sole_producer(erf.inputs[0]);
    if (!div) continue;
    int x = g.other_than_const(*div, "Div", static_cast<float>(M_SQRT2), false);
    if (x < 0) x = g.other_than_const(*div, "Mul", static_cast<float>(M_SQRT1_2), true);
    if (x < 0) continue;
    PreparedNode* add = g.sole_reader(erf.outputs[0]);
    if (!add || g.other_than_const(*add, "Add", 1.0f, true) != erf.outputs[0]) continue;
    PreparedNode* mul = g.sole_reader(add->outputs[0]);
    if (!mul || mul->op_type != "Mul" || mul->inputs.size() != 2) continue;
    const int a = add->outputs[0];
    if (!((mul->inputs[0] == x && mul->inputs[1] == a) ||
          (mul->inputs[1] == x && mul->inputs[0] == a)))
      continue;
    PreparedNode* half = g.sole_reader(mul->outputs[0]);
    if (!half || g.other_than_const(*half, "Mul", 0.5f, true) != mul->outputs[0]) continue;
    // `half` becomes Gelu(x); the four nodes before it go.
    div->dead = erf.dead = add->dead = mul->dead = true;
    half->op_type = "Gelu";
    half->inputs = {x};
    half->attrs.clear();
    ++fused;
  }
  return fused;
}

bool is_conv(const PreparedNode& n) {
  return n.op_type == "Conv" && n.domain.empty() && !n.dead && n.outputs.size() == 1 &&
         (n.inputs.size() == 2 || n.inputs.size() == 3) && n.inputs[0] >= 0 && n.inputs[1] >= 0;
}

/// Copies the attributes of `from` into `to`, their strings and arrays into `to`'s own storage;
/// false (nothing usable) for a kind a Conv does not have.
bool copy_attrs(const PreparedNode& from, PreparedNode& to) {
  std::vector<hp_op_attr> out;
  for (hp_op_attr a : from.attrs) {
    a.name = to.store_strings.emplace_back(a.name).c_str();
    if (a.kind == HP_ATTR_STRING)
      a.s = to.store_strings.emplace_back(a.s).c_str();
    else if (a.kind == HP_ATTR_INTS)
      a.ints = to.store_ints.emplace_back(a.ints, a.ints + a.n).data();
    else if (a.kind == HP_ATTR_FLOATS)
      a.floats = to.store_floats.emplace_back(a.floats, a.floats + a.n).data();
    else if (a.kind != HP_ATTR_INT && a.kind != HP_ATTR_FLOAT)
      return false;
    out.push_back(a);
  }
  hp_op_attr act{};
  act.name = to.store_strings.emplace_back("activation").c_str();
  act.kind = HP_ATTR_STRING;
  act.s = to.store_strings.emplace_back("Relu").c_str();
  out.push_back(act);
  to.attrs = std::move(out);
  return true;
}

int fuse_conv_relu(FuseGraph& g) {
  int fused = 0;
  for (PreparedNode& relu : g.im.nodes) {
    if (relu.dead || !is_unary(relu, "Relu") || relu.outputs[0] < 0) continue;
    PreparedNode* p = g.sole_producer(relu.inputs[0]);
    if (!p) continue;
    PreparedNode* add = nullptr;
    int z = -1;
    if (p->op_type == "Add" && p->domain.empty() && p->inputs.size() == 2 &&
        p->outputs.size() == 1 && p->inputs[0] != p->inputs[1]) {
      for (std::size_t side : {0u, 1u}) {
        PreparedNode* cv = g.sole_producer(p->inputs[side]);
        if (cv && is_conv(*cv) && p->inputs[1 - side] >= 0) {
          add = p;
          z = p->inputs[1 - side];
          p = cv;
          break;
        }
      }
      if (!add) continue;
    }
    if (!is_conv(*p)) continue;
    PreparedNode& conv = *p;
    std::vector<int> inputs = conv.inputs;
    if (add) {
      inputs.resize(3, -1);  // an absent bias keeps Z in its place
      inputs.push_back(z);
    }
    if (!copy_attrs(conv, relu)) continue;
    conv.dead = true;
    if (add) add->dead = true;
    relu.op_type = "FusedConv";
    relu.domain = "com.microsoft";
    relu.opset = 1;
    relu.inputs = std::move(inputs);
    ++fused;
  }
  return fused;
}

/// The exact-GELU or ReLU node that alone reads `t`: its activation name, else "".
std::string activation_reading(FuseGraph& g, int t, PreparedNode** node) {
  PreparedNode* r = g.sole_reader(t);
  if (!r || r->outputs.size() != 1 || r->outputs[0] < 0) return "";
  if (is_unary(*r, "Relu")) {
    *node = r;
    return "Relu";
  }
  if (!is_unary(*r, "Gelu")) return "";
  for (const hp_op_attr& a : r->attrs)
    if (std::string(a.name) == "approximate" &&
        (a.kind != HP_ATTR_STRING || std::string(a.s) != "none"))
      return "";
  *node = r;
  return "Gelu";
}

/// A live ONNX Add of two different tensors with one output: what the linear-layer and residual
/// rewrites take over.
bool two_operand_add(const PreparedNode& n) {
  return !n.dead && n.op_type == "Add" && n.domain.empty() && n.inputs.size() == 2 &&
         n.outputs.size() == 1 && n.outputs[0] >= 0 && n.inputs[0] != n.inputs[1];
}

int fuse_matmul_add(FuseGraph& g) {
  int fused = 0;
  for (PreparedNode& add : g.im.nodes) {
    if (!two_operand_add(add)) continue;
    PreparedNode* mm = nullptr;
    int z = -1;
    for (std::size_t side : {0u, 1u}) {
      PreparedNode* p = g.sole_producer(add.inputs[side]);
      if (p && p->op_type == "MatMul" && p->domain.empty() && p->inputs.size() == 2 &&
          p->outputs.size() == 1 && p->inputs[0] >= 0 && p->inputs[1] >= 0 &&
          add.inputs[1 - side] >= 0) {
        mm = p;
        z = add.inputs[1 - side];
        break;
      }
    }
    if (!mm) continue;
    PreparedNode* act_node = nullptr;
    const std::string act = activation_reading(g, add.outputs[0], &act_node);
    PreparedNode& keep = act_node ? *act_node : add;
    rewrite_as(keep, "MatMulAdd", {mm->inputs[0], mm->inputs[1], z});
    set_string_attr(keep, "activation", act);
    mm->dead = true;
    if (act_node) add.dead = true;
    ++fused;
  }
  return fused;
}

/// hp.nn.MatMulAdd -> Add(., R): the Add becomes hp.nn.MatMulAdd (A, B, Z, R), the residual
/// connection read in the matmul's epilogue. The Add node is the one kept: R may be computed
/// after the MatMulAdd in the node order, every input of the MatMulAdd before it.
int fuse_residual_add(FuseGraph& g) {
  int fused = 0;
  for (PreparedNode& add : g.im.nodes) {
    if (!two_operand_add(add)) continue;
    for (std::size_t side : {0u, 1u}) {
      PreparedNode* mm = g.sole_producer(add.inputs[side]);
      const int r = add.inputs[1 - side];
      if (!mm || mm->op_type != "MatMulAdd" || mm->domain != "hp.nn" || mm->inputs.size() != 3 ||
          r < 0)
        continue;
      std::string act;
      for (const hp_op_attr& a : mm->attrs)
        if (a.kind == HP_ATTR_STRING && std::string(a.name) == "activation") act = a.s;
      rewrite_as(add, "MatMulAdd", {mm->inputs[0], mm->inputs[1], mm->inputs[2], r});
      set_string_attr(add, "activation", act);
      mm->dead = true;
      ++fused;
      break;
    }
  }
  return fused;
}

}  // namespace

void set_string_attr(PreparedNode& n, const char* name, const std::string& value) {
  for (hp_op_attr& a : n.attrs)
    if (a.kind == HP_ATTR_STRING && std::string(a.name) == name) {
      a.s = n.store_strings.emplace_back(value).c_str();
      return;
    }
  hp_op_attr a{};
  a.name = n.store_strings.emplace_back(name).c_str();
  a.kind = HP_ATTR_STRING;
  a.s = n.store_strings.emplace_back(value).c_str();
  n.attrs.push_back(a);
}

int add_int_attr(PreparedNode& n, const char* name, std::int64_t value) {
  hp_op_attr a{};
  a.name = n.store_strings.emplace_back(name).c_str();
  a.kind = HP_ATTR_INT;
  a.i = value;
  n.attrs.push_back(a);
  return static_cast<int>(n.attrs.size()) - 1;
}

void add_float_attr(PreparedNode& n, const char* name, double value) {
  hp_op_attr a{};
  a.name = n.store_strings.emplace_back(name).c_str();
  a.kind = HP_ATTR_FLOAT;
  a.f = value;
  n.attrs.push_back(a);
}

void add_ints_attr(PreparedNode& n, const char* name, std::vector<std::int64_t> values) {
  hp_op_attr a{};
  a.name = n.store_strings.emplace_back(name).c_str();
  a.kind = HP_ATTR_INTS;
  a.n = static_cast<std::int64_t>(values.size());
  a.ints = n.store_ints.emplace_back(std::move(values)).data();
  n.attrs.push_back(a);
}

void tag_constant_weights(Executor::Impl& im) {
  // Keys are unique in the process, never reused: a backend's packed copies of another
  // executor's weights (ranks simulated as threads share one backend) can never be mistaken.
  static std::atomic<std::int64_t> next_key{1};
  std::set<int> weights;
  for (const auto& [id, h] : im.weights) weights.insert(id);
  for (PreparedNode& n : im.nodes) {
    // Convolutions too: the cpu plugin keeps a constant filter's Winograd transform or its
    // reorder into oneDNN's layout (plugins/cpu/cpu_winograd.cpp, cpu_conv.cpp).
    const bool packable =
        (n.domain.empty() &&
         (n.op_type == "MatMul" || n.op_type == "Gemm" || n.op_type == "Conv")) ||
        (n.domain == "hp.nn" && (n.op_type == "MatMulAdd" || n.op_type == "FusedConv")) ||
        (n.domain == "com.microsoft" && n.op_type == "FusedConv");
    if (n.dead || !packable || n.inputs.size() < 2 || !weights.count(n.inputs[1])) continue;
    Slot& w = im.slots[static_cast<std::size_t>(n.inputs[1])];
    if (w.weight_key == 0) w.weight_key = next_key++;
    n.weight_attr = add_int_attr(n, "hp_weight_b", w.weight_key);
  }
}

int fuse_nodes(Executor::Impl& im) {
  const plugin::Backend* be = im.be[1] ? im.be[1] : im.be[0];
  // Each pass runs when the backend implements the node it writes, on a fresh view of the graph
  // (an earlier pass may have made nodes dead).
  struct Pass {
    const char* op;
    const char* domain;
    int opset;
    int (*run)(FuseGraph&);
  };
  static constexpr Pass passes[] = {
      {"Gelu", "", 20, fuse_gelu},
      {"FusedConv", "com.microsoft", 1, fuse_conv_relu},
      {"LayerNormalization", "", 17, fuse_layer_norm},
      {"MaskedSoftmax", "hp.nn", 1, fuse_masked_softmax},
      {"Attention", "hp.nn", 1, fuse_attention},
      {"MatMulAdd", "hp.nn", 1, fuse_matmul_add},
      {"MatMulAdd", "hp.nn", 1, fuse_residual_add},
  };
  int fused = 0;
  for (const Pass& p : passes) {
    if (!be->supports_op_type(0, p.op, p.domain, p.opset)) continue;
    FuseGraph g(im);
    fused += p.run(g);
  }
  return fused;
}

}  // namespace hp::exec
