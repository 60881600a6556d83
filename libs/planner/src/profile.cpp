// From a summarised model to the planner's per-block profile.
//
// Activation memory is what autograd keeps for the backward pass (saved_by() below), not every
// tensor the forward produces: libs/model's Block::activation_bytes counts all of them, an upper
// bound some 3x above what frameworks keep (views, bias adds and residual sums are not saved). For
// a GPT layer the rule gives about 56 s h + 2 a s^2 bytes (16-bit) per sequence against
// Korthikanti's 34 s h + 5 a s^2: unfused GELU keeps four 4h tensors where a fused kernel keeps
// one, and the ONNX export has no dropout masks.
//
// libs/model binds the batch dim to 1 and the sequence to the planned length, so every figure here
// is "per sequence"; the cost model multiplies by the micro-batch size (attention's s^2 term is per
// sequence, so this is exact). Activation and boundary sizes are recomputed in the planned dtype
// (ONNX test models are fp32, training runs in bf16): float tensors count dtype_bytes per element,
// integer tensors (masks, indices) their own size.
//
// Two figures need the structure of attention, found without names: a tensor with two dims equal to
// the sequence length is an attention-score tensor (seq x seq), and a node reading or writing one
// is part of the quadratic work. Selective recomputation (Korthikanti 2022) drops exactly these
// tensors and redoes exactly this work. The number of TP collectives per block follows Megatron's
// pairing of a column-parallel with a row-parallel matmul: one all-reduce per pair in forward, so a
// transformer block (attention + MLP) has 2; a block with one or two weight matmuls has 1.
//
// Mixture of experts, also found without names: a matmul whose weight is a stacked parameter of
// rank 3 or more (experts x in x out) is a routed expert; its leading dim is the expert count and
// the last dim of a TopK output in the block is the routing top-k. Expert parallelism splits
// exactly these parameters (routed experts are split by expert x tensor parallelism; the router,
// norms and shared experts stay replicated). Experts in a ModuleList are found too, stacked by
// torch.stack or added into a sum in a loop (profile_experts.cpp). The head count
// TP must divide is read off the score tensor (1 x heads x seq x seq).
#include <algorithm>
#include <map>
#include <set>

#include <fmt/core.h>

#include "hp/model/axes.h"
#include "hp/model/model.h"
#include "hp/planner/planner.h"
#include "hp/planner/predict.h"
#include "pricing.h"
#include "profile_experts.h"

namespace hp::planner {
namespace {

using model::Graph;
using model::Tensor;

bool quadratic(const Tensor& t, std::int64_t seq) {
  if (seq <= 1 || !t.has_shape) return false;
  int n = 0;
  for (const auto& d : t.dims) n += d.value == seq ? 1 : 0;
  return n >= 2;
}

double tensor_bytes(const Tensor& t, double dtype_bytes) {
  auto n = t.numel();
  if (!n) return 0;
  if (t.is_float()) return static_cast<double>(*n) * dtype_bytes;
  auto b = t.bytes();
  return b ? static_cast<double>(*b) : 0.0;
}

// What autograd saves for a node's backward: which of its tensors must stay alive. Linear maps
// (Add, Sub, layout ops, Concat, Split, Slice, Gather's data, Where, Cast) save nothing; matmuls
// and products save their activation inputs (none when the other factor is a constant);
// normalisations save their input; Softmax, Sigmoid, Tanh, Relu and Exp save their output; Dropout
// saves its mask. Unknown ops save their inputs (safe side).
enum class Saves { nothing, inputs, first_input, output };

Saves saved_by(const std::string& op) {
  static const std::set<std::string> nothing = {"Add",
                                                "Sub",
                                                "Neg",
                                                "Reshape",
                                                "Transpose",
                                                "Squeeze",
                                                "Unsqueeze",
                                                "Flatten",
                                                "Identity",
                                                "Concat",
                                                "Split",
                                                "Slice",
                                                "Gather",
                                                "Expand",
                                                "Where",
                                                "Cast",
                                                "Shape",
                                                "Constant",
                                                "ConstantOfShape",
                                                "Range",
                                                "Equal",
                                                "Less",
                                                "Greater",
                                                "Not",
                                                "And",
                                                "Or",
                                                "Trilu",
                                                "Pad",
                                                "Tile"};
  static const std::set<std::string> output = {"Softmax", "LogSoftmax", "Sigmoid",
                                               "Tanh",    "Relu",       "Exp"};
  static const std::set<std::string> first = {"LayerNormalization",
                                              "SimplifiedLayerNormalization",
                                              "RMSNormalization",
                                              "BatchNormalization",
                                              "InstanceNormalization",
                                              "GroupNormalization",
                                              "ReduceMean",
                                              "Dropout"};
  if (nothing.count(op)) return Saves::nothing;
  if (output.count(op)) return Saves::output;
  if (first.count(op)) return Saves::first_input;
  return Saves::inputs;
}

// The intermediates of a layer norm exported as primitives (below opset 17): the centred input
// d = Sub(x, ReduceMean(x)), Pow(d, 2), its mean, + eps and the Sqrt. hp differentiates the chain
// as one LayerNormalization reading x (libs/train/src/norm_chain.cpp), so none of them is kept.
std::set<int> layer_norm_intermediates(const Graph& g, const model::Block& b) {
  std::set<int> inner;
  auto producer_op = [&](int ti) -> const model::Node* {
    for (int ni : b.nodes)
      for (int o : g.node(ni).outputs)
        if (o == ti) return &g.node(ni);
    return nullptr;
  };
  for (int ni : b.nodes) {  // nodes are in graph order: a chain's producers come first
    const auto& n = g.node(ni);
    if (n.inputs.empty() || n.outputs.empty() || n.outputs[0] < 0) continue;
    const bool reads_inner =
        std::any_of(n.inputs.begin(), n.inputs.end(), [&](int ti) { return inner.count(ti) > 0; });
    if (n.op_type == "Sub" && n.inputs.size() == 2) {
      const model::Node* mean = producer_op(n.inputs[1]);
      if (mean && mean->op_type == "ReduceMean" && !mean->inputs.empty() &&
          mean->inputs[0] == n.inputs[0])
        inner.insert(n.outputs[0]);
    } else if (reads_inner && (n.op_type == "Pow" || n.op_type == "ReduceMean" ||
                               n.op_type == "Add" || n.op_type == "Sqrt")) {
      inner.insert(n.outputs[0]);
    }
  }
  return inner;
}

BlockProfile profile_block(const Graph& g, const model::Block& b, std::int64_t seq,
                           double dtype_bytes) {
  BlockProfile p;
  const std::set<int> ln_inner = layer_norm_intermediates(g, b);
  p.name = b.name;
  p.parameters = static_cast<double>(b.parameters);
  p.fwd_flops = b.flops;
  int weighted = 0;
  std::set<int> saved;    // activation tensors kept for the backward pass, each once
  std::set<int> experts;  // stacked expert weights, each once
  for (int ni : b.nodes) {
    const auto& n = g.node(ni);
    bool quad = false, kernel = false;
    auto keep = [&](int ti) {
      if (ti >= 0 && g.tensor(ti).kind == model::TensorKind::activation && !ln_inner.count(ti))
        saved.insert(ti);
    };
    auto is_act = [&](std::size_t i) {
      return i < n.inputs.size() && n.inputs[i] >= 0 &&
             g.tensor(n.inputs[i]).kind == model::TensorKind::activation;
    };
    // A product or quotient with a constant (x * 0.5, scores / sqrt(d)) needs only the constant.
    const bool by_constant =
        (n.op_type == "Mul" || n.op_type == "Div") && !(is_act(0) && is_act(1));
    switch (by_constant ? Saves::nothing : saved_by(n.op_type)) {
      case Saves::nothing: break;
      case Saves::inputs:
        for (int ti : n.inputs) keep(ti);
        break;
      case Saves::first_input:
        if (!n.inputs.empty()) keep(n.inputs[0]);
        break;
      case Saves::output:
        if (!n.outputs.empty()) keep(n.outputs[0]);
        break;
    }
    if (n.op_type == "Dropout" && n.outputs.size() > 1) keep(n.outputs[1]);
    for (int ti : n.outputs) {
      if (ti < 0) continue;
      const Tensor& t = g.tensor(ti);
      if (t.kind != model::TensorKind::activation) continue;
      kernel = true;
      if (quadratic(t, seq)) quad = true;
    }
    for (int ti : n.inputs)
      if (ti >= 0 && quadratic(g.tensor(ti), seq)) quad = true;
    // The score tensor (batch 1 x heads x seq x seq) gives the head count TP must divide.
    for (int ti : n.outputs)
      if (ti >= 0 && quadratic(g.tensor(ti), seq)) {
        std::int64_t h = 1, seqs = 0;
        for (const auto& d : g.tensor(ti).dims) {
          if (d.value == seq && seqs < 2)
            ++seqs;
          else if (d.value > 0)
            h *= d.value;
        }
        p.heads = std::max(p.heads, h);
      }
    if (quad) p.quadratic_flops += n.cost.flops();
    if (kernel) p.kernels += 1;
    const bool matmul = n.op_type == "MatMul" || n.op_type == "Gemm" || n.op_type == "Einsum";
    if (matmul && n.cost.parameters > 0) ++weighted;
    // Routed experts: a matmul over a stacked weight (experts x in x out) read by the whole block.
    for (int ti : n.inputs) {
      if (!matmul || ti < 0 || !g.tensor(ti).is_parameter() || g.tensor(ti).dims.size() < 3 ||
          !experts.insert(ti).second)
        continue;
      const Tensor& t = g.tensor(ti);
      if (auto numel = t.numel()) p.expert_parameters += static_cast<double>(*numel);
      p.experts = std::max(p.experts, t.dims[0].value);
    }
    if (n.op_type == "TopK" && !n.outputs.empty() && n.outputs[0] >= 0) {
      const Tensor& t = g.tensor(n.outputs[0]);
      if (t.has_shape && !t.dims.empty()) p.top_k = std::max(p.top_k, t.dims.back().value);
    }
  }
  if (p.experts == 0 && p.top_k > 0) {  // no stacked expert weights: a ModuleList routed by top-k?
    const ListExperts list = module_list_experts(g, b);
    if (list.experts >= 2) {
      p.experts = list.experts;
      p.expert_parameters = list.parameters;
      const double active =
          std::min(1.0, static_cast<double>(p.top_k) / static_cast<double>(list.experts));
      p.unrouted_flops = list.flops * (1.0 - active);
      p.fwd_flops -= p.unrouted_flops;
    }
  }
  if (p.experts == 0 && p.top_k > 0) {  // or experts added into a sum in a loop?
    double extra = 0;
    const ListExperts summed = summed_experts(g, b, p.top_k, extra);
    if (summed.experts >= 2) {
      p.experts = summed.experts;
      p.expert_parameters = summed.parameters;
      p.routed_flops = extra;
      p.summed = true;
      p.fwd_flops += extra;  // routed rows' matmuls, which the block's count leaves out
    }
  }
  if (p.experts == 0) p.expert_parameters = 0, p.top_k = 0;
  if (p.experts > 0 && p.top_k <= 0) p.top_k = 1;
  for (int ti : saved) {
    const double bytes = tensor_bytes(g.tensor(ti), dtype_bytes);
    p.act_bytes += bytes;
    if (quadratic(g.tensor(ti), seq)) p.quadratic_act_bytes += bytes;
  }
  p.tp_collectives = weighted >= 3 ? 2 : weighted >= 1 ? 1 : 0;
  return p;
}

double cut_bytes(const Graph& g, const model::Cut& c, double dtype_bytes) {
  double bytes = 0;
  for (int ti : c.tensors) bytes += tensor_bytes(g.tensor(ti), dtype_bytes);
  return bytes;
}

}  // namespace

Expected<ModelProfile> profile_model(const model::ModelSummary& s, std::int64_t seq,
                                     double dtype_bytes) {
  if (!s.unknown_dims.empty())
    return Error(Errc::bad_input,
                 fmt::format("input dim '{}' is not bound", s.unknown_dims.front()), s.model,
                 "bind it with --dim NAME=VALUE");
  const Graph& g = s.graph;
  const auto& lay = s.layering;
  ModelProfile m;
  m.seq = seq;
  m.dtype_bytes = dtype_bytes;
  m.prologue = profile_block(g, lay.prologue, seq, dtype_bytes);
  m.epilogue = profile_block(g, lay.epilogue, seq, dtype_bytes);
  for (const auto& b : lay.blocks) m.blocks.push_back(profile_block(g, b, seq, dtype_bytes));
  // Cuts are prologue|b0, b0|b1, ..., last|epilogue: cut i is the input of block i.
  for (std::size_t i = 0; i < m.blocks.size() && i < lay.cuts.size(); ++i)
    m.blocks[i].boundary_bytes = cut_bytes(g, lay.cuts[i], dtype_bytes);
  for (const auto& c : lay.cuts)
    m.hidden_bytes = std::max(m.hidden_bytes, cut_bytes(g, c, dtype_bytes));
  if (m.blocks.empty()) {
    // No repeated structure: the whole model is one block that cannot be split across stages.
    m.blocks.push_back(m.prologue);
    m.prologue = BlockProfile{"prologue"};
  }
  for (auto& b : m.blocks) {
    if (b.boundary_bytes == 0) b.boundary_bytes = m.hidden_bytes;
    m.heads = std::max(m.heads, b.heads);
  }
  if (m.total_fwd_flops() <= 0)
    return Error(Errc::bad_input, "the model has no countable FLOPs at the bound dims", s.model,
                 "check 'hp plan --summary' for unknown shapes");
  return m;
}

// The planned sequence length and the dims bound for profiling: the batch axis (whatever the
// export named it) at 1, the sequence axis at the planned length. The length is --seq, a binding
// of the model's own sequence dim, or the model's static length; a model without a sequence axis
// (images, feature rows) is planned per sample, at length 1.
Expected<std::int64_t> bind_profile_dims(const ProfileRequest& request,
                                         const model::InputAxes& axes, model::DimBindings& dims) {
  if (!axes.batch_dim.empty()) dims[axes.batch_dim] = 1;
  if (!axes.sequence) {
    dims.erase("seq");  // --seq binds "seq" for sequence models; here there is none to bind
    return 1;
  }
  std::int64_t seq = request.seq;
  if (seq <= 0 && dims.count("seq")) seq = dims.at("seq");
  if (seq <= 0 && !axes.seq_dim.empty() && dims.count(axes.seq_dim)) seq = dims.at(axes.seq_dim);
  if (axes.static_seq > 0) {
    if (seq > 0 && seq != axes.static_seq)
      return Error(Errc::usage,
                   fmt::format("the model's sequence length is static ({} on input '{}'); "
                               "--seq {} cannot run it",
                               axes.static_seq, axes.seq_input, seq),
                   request.model.string(),
                   "drop --seq, or export the model with a dynamic sequence axis");
    seq = axes.static_seq;
  }
  if (seq <= 0)
    return Error(Errc::usage,
                 fmt::format("planning needs a sequence length: axis 1 of input '{}' ('{}') is "
                             "symbolic",
                             axes.seq_input, axes.seq_dim),
                 request.model.string(), "pass --seq S");
  dims["seq"] = seq;
  if (!axes.seq_dim.empty()) dims[axes.seq_dim] = seq;
  return seq;
}

// A static-batch export was summarised at its own batch: its per-sequence figures are that batch's
// divided by it (weights and their counts are per model, not per sequence).
void per_sequence(ModelProfile& m, std::int64_t batch) {
  if (batch <= 1) return;
  const double b = static_cast<double>(batch);
  auto scale = [b](BlockProfile& p) {
    p.fwd_flops /= b, p.quadratic_flops /= b, p.act_bytes /= b, p.unrouted_flops /= b;
    p.routed_flops /= b;
    p.quadratic_act_bytes /= b, p.boundary_bytes /= b;
  };
  scale(m.prologue);
  scale(m.epilogue);
  for (auto& p : m.blocks) scale(p);
  m.hidden_bytes /= b;
}

Expected<LoadedProfile> load_profile(const ProfileRequest& request) {
  // A malformed model is bad input whatever else is missing, so it is read before the sequence
  // length is checked; it is read once, for the summary and the profile alike.
  model::LoadOptions lo;
  lo.mode = request.require_data ? model::LoadMode::require_data : model::LoadMode::shapes_only;
  HP_ASSIGN_OR_RETURN(const model::Model loaded, model::load_model(request.model, lo));
  const model::InputAxes axes = model::input_axes(loaded);
  model::DimBindings dims = request.dims;
  HP_ASSIGN_OR_RETURN(const std::int64_t seq, bind_profile_dims(request, axes, dims));
  HP_ASSIGN_OR_RETURN(model::Graph graph, model::build_graph(loaded, dims));
  model::ModelSummary summary = model::summarize_graph(loaded, std::move(graph), dims);
  HP_ASSIGN_OR_RETURN(ModelProfile profile,
                      profile_model(summary, seq, dtype_bytes(request.dtype)));
  profile.sequence = axes.sequence;
  profile.static_batch = axes.static_batch;
  profile.batch_dim = axes.batch_dim;
  profile.seq_dim = axes.sequence ? axes.seq_dim : std::string();
  per_sequence(profile, axes.static_batch);
  std::vector<std::string> warnings = summary.warnings;
  return LoadedProfile{std::move(profile), std::move(summary), std::move(warnings)};
}

}  // namespace hp::planner
