// Per-node cost for one forward pass at the bound dims.
//
// Convention (printed by `hp plan --summary`; docs/planner.md, "FLOPs convention"): matrix products
// — MatMul, Gemm, Conv, Einsum — count 2 FLOPs per multiply-accumulate and are reported separately
// as "matmul FLOPs", because they dominate, run on tensor cores, and are what the planner's compute
// model divides by peak matmul throughput. Everything else counts per element of output:
//   - elementwise math, comparisons, activations (incl. transcendental ones): 1 FLOP per element,
//   - Softmax / LogSoftmax: 5 per element (max, subtract, exp, sum, divide),
//   - LayerNormalization and other normalisations: 8 per element,
//   - reductions, TopK, CumSum: 1 per *input* element,
//   - bias terms of Gemm/Conv: 1 per output element (in the "other" FLOPs),
//   - data movement (Reshape, Transpose, Gather, Concat, Slice, Cast, ...): 0,
//   - recurrent layers and the bodies of control flow: cost_control.cpp.
// These other FLOPs are a rounding error next to the matmuls of any large model; they are counted
// so that small or unusual models (pure elementwise graphs) do not look free.
//
// Bytes read and written are the sizes of the data inputs and outputs (Shape/Size read metadata
// only). Parameters are the floating-point initializer elements a node consumes directly. When a
// shape the cost needs is unknown (an unbound dim), that part is not counted and the cost is marked
// unknown; nothing ever divides by or multiplies an unknown dim.
#include <set>

#include "cost.h"
#include "einsum.h"
#include "hp/core/checked.h"

namespace hp::model {
namespace {

const Tensor* tensor_at(const Graph& g, const Node& n, std::size_t i, bool output = false) {
  const auto& v = output ? n.outputs : n.inputs;
  if (i >= v.size() || v[i] < 0) return nullptr;
  return &g.tensor(v[i]);
}

std::optional<std::int64_t> dim_at(const Tensor* t, std::int64_t i) {
  if (!t || !t->has_shape) return std::nullopt;
  auto rank = static_cast<std::int64_t>(t->dims.size());
  if (i < 0) i += rank;
  if (i < 0 || i >= rank || !t->dims[static_cast<std::size_t>(i)].known()) return std::nullopt;
  return t->dims[static_cast<std::size_t>(i)].value;
}

// Elements of the first output, -1 when unknown.
double output_numel(const Graph& g, const Node& n) {
  const Tensor* out = tensor_at(g, n, 0, true);
  return out ? static_cast<double>(out->numel().value_or(-1)) : -1.0;
}

double elementwise_weight(const std::string& op) {
  static const std::set<std::string> one = {
      "Add",      "Sub",   "Mul",        "Div",  "Pow",     "Sqrt",        "Neg",
      "Abs",      "Relu",  "Reciprocal", "Exp",  "Log",     "Tanh",        "Sigmoid",
      "Erf",      "Min",   "Max",        "Sum",  "Mean",    "Clip",        "LeakyRelu",
      "Floor",    "Ceil",  "Equal",      "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
      "Not",      "And",   "Or",         "Xor",  "Where",   "Sin",         "Cos",
      "Softplus", "Mod",   "PRelu",      "Elu",  "Selu",    "HardSigmoid", "HardSwish",
      "Sign",     "Round", "Gelu",       "Mish", "Trilu",   "IsNaN",       "IsInf",
      "BitShift"};
  if (one.count(op)) return 1;
  if (op == "Softmax" || op == "LogSoftmax") return 5;
  if (op == "LayerNormalization" || op == "BatchNormalization" || op == "InstanceNormalization" ||
      op == "GroupNormalization" || op == "SimplifiedLayerNormalization" ||
      op == "RMSNormalization")
    return 8;
  return 0;
}

bool is_reduction(const std::string& op) {
  return op.rfind("Reduce", 0) == 0 || op == "ArgMax" || op == "ArgMin" || op == "TopK" ||
         op == "CumSum";
}

// MACs of an Einsum: one per point of the joint index space (einsum.cpp).
std::optional<double> einsum_macs(const onnx::NodeProto& p, const Graph& g, const Node& n) {
  std::vector<std::vector<std::int64_t>> shapes;
  for (int i : n.inputs) {
    if (i < 0 || !g.tensor(i).numel()) return std::nullopt;
    std::vector<std::int64_t> dims;
    for (const auto& d : g.tensor(i).dims) dims.push_back(d.value);
    shapes.push_back(std::move(dims));
  }
  auto e = analyse_einsum(attr_string(p, "equation", ""), shapes);
  if (!e) return std::nullopt;
  return e->macs();
}

// Multiply-accumulates of the matrix-product ops; nullopt when a needed dim is unknown.
std::optional<double> matmul_macs(const onnx::NodeProto& p, const Graph& g, const Node& n) {
  const std::string& op = n.op_type;
  const double out_numel = output_numel(g, n);
  if (op == "MatMul") {
    auto k = dim_at(tensor_at(g, n, 0), -1);
    if (!k || out_numel < 0) return std::nullopt;
    return out_numel * static_cast<double>(*k);
  }
  if (op == "Gemm") {
    auto k = dim_at(tensor_at(g, n, 0), attr_int(p, "transA", 0) ? 0 : 1);
    if (!k || out_numel < 0) return std::nullopt;
    return out_numel * static_cast<double>(*k);
  }
  if (op == "Conv") {
    const Tensor* w = tensor_at(g, n, 1);
    std::int64_t wn = w ? w->numel().value_or(-1) : -1;
    auto cout = dim_at(w, 0);
    if (wn < 0 || !cout || *cout == 0 || out_numel < 0) return std::nullopt;
    // Each output element is a dot product over Cin/group x kernel = numel(W) / Cout.
    return out_numel * static_cast<double>(wn / *cout);
  }
  if (op == "Einsum") return einsum_macs(p, g, n);
  return 0.0;
}

}  // namespace

NodeCost compute_cost(const onnx::NodeProto& p, const Graph& g, const Node& n) {
  NodeCost c;
  const std::string& op = n.op_type;
  bool metadata_only = op == "Shape" || op == "Size";
  std::set<int> seen;
  for (int i : n.inputs) {
    if (i < 0 || !seen.insert(i).second) continue;
    const Tensor& t = g.tensor(i);
    if (t.is_parameter()) c.parameters = saturating_add(c.parameters, t.numel().value_or(0));
    if (metadata_only || t.sequence) continue;  // a sequence's elements are counted by their ops
    if (auto b = t.bytes())
      c.bytes_read = saturating_add(c.bytes_read, *b);
    else
      c.known = false;
  }
  for (int o : n.outputs) {
    if (o < 0 || g.tensor(o).sequence) continue;
    if (auto b = g.tensor(o).bytes())
      c.bytes_written = saturating_add(c.bytes_written, *b);
    else
      c.known = false;
  }
  const double out_numel = output_numel(g, n);
  if (add_recurrent_cost(p, g, n, c)) return c;
  if (op == "MatMul" || op == "Gemm" || op == "Conv" || op == "Einsum") {
    auto macs = matmul_macs(p, g, n);
    if (!macs)
      c.known = false;
    else
      c.matmul_flops = 2 * *macs;
    bool has_bias = (op == "Gemm" && n.inputs.size() > 2 && n.inputs[2] >= 0) ||
                    (op == "Conv" && n.inputs.size() > 2 && n.inputs[2] >= 0);
    if (has_bias && out_numel >= 0) c.other_flops = out_numel;
    return c;
  }
  if (is_reduction(op)) {
    const Tensor* in = tensor_at(g, n, 0);
    std::int64_t in_numel = in ? in->numel().value_or(-1) : -1;
    if (in_numel < 0)
      c.known = false;
    else
      c.other_flops = static_cast<double>(in_numel);
    return c;
  }
  double w = elementwise_weight(op);
  if (w > 0) {
    if (out_numel < 0)
      c.known = false;
    else
      c.other_flops = w * out_numel;
  }
  return c;
}

}  // namespace hp::model
