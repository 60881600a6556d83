// What the fusion passes (exec_fuse.cpp, exec_fuse_norm.cpp) see of the prepared graph: each
// tensor's producer and reader count, and the constant scalars that identify an exported chain.
#pragma once

#include <cmath>
#include <optional>

#include "exec_internal.h"

namespace hp::exec {

struct FuseGraph {
  Executor::Impl& im;
  std::vector<int> producer;  ///< tensor id -> node index, -1 for none
  std::vector<int> readers;   ///< tensor id -> number of reading nodes (+1 when a graph output)

  explicit FuseGraph(Executor::Impl& impl) : im(impl) {
    producer.assign(im.tensor_names.size(), -1);
    readers.assign(im.tensor_names.size(), 0);
    for (std::size_t k = 0; k < im.nodes.size(); ++k) {
      const PreparedNode& n = im.nodes[k];
      if (n.dead) continue;  // fused away by an earlier pass: reads nothing any more
      for (int t : n.outputs)
        if (t >= 0) producer[static_cast<std::size_t>(t)] = static_cast<int>(k);
      for (const auto* list : {&n.inputs, &n.captured})
        for (int t : *list)
          if (t >= 0) ++readers[static_cast<std::size_t>(t)];
    }
    for (int t : im.output_ids) ++readers[static_cast<std::size_t>(t)];
  }

  /// The node producing `t` when `t` has exactly one reader, else null.
  PreparedNode* sole_producer(int t) {
    if (t < 0 || readers[static_cast<std::size_t>(t)] != 1) return nullptr;
    const int p = producer[static_cast<std::size_t>(t)];
    return p < 0 || im.nodes[static_cast<std::size_t>(p)].dead
               ? nullptr
               : &im.nodes[static_cast<std::size_t>(p)];
  }

  /// The one node reading `t` (which has exactly one reader and is no graph output), else null.
  PreparedNode* sole_reader(int t) {
    if (t < 0 || readers[static_cast<std::size_t>(t)] != 1) return nullptr;
    for (int o : im.output_ids)
      if (o == t) return nullptr;
    for (PreparedNode& n : im.nodes)
      if (!n.dead)
        for (int i : n.inputs)
          if (i == t) return &n;
    return nullptr;
  }

  /// The initializer `t`, else null.
  const HostTensor* weight(int t) const {
    for (const auto& [id, h] : im.weights)
      if (id == t) return &h;
    return nullptr;
  }

  /// The value of `t` when it is a weight or a Constant node's output, else null.
  const HostTensor* constant(int t) const {
    if (t < 0) return nullptr;
    if (const HostTensor* h = weight(t)) return h;
    const int p = producer[static_cast<std::size_t>(t)];
    if (p < 0) return nullptr;
    const PreparedNode& n = im.nodes[static_cast<std::size_t>(p)];
    if (n.op_type != "Constant" || !n.domain.empty() || n.store_tensors.size() != 1) return nullptr;
    return &n.store_tensors.front();
  }

  /// The value of a float32 scalar (any rank, one element) weight or Constant-node output.
  std::optional<float> scalar(int t) const {
    const HostTensor* h = constant(t);
    if (!h || h->dtype != HP_F32 || h->numel() != 1) return std::nullopt;
    return h->as<float>()[0];
  }

  /// scalar(t) when that constant has rank 0 or 1: one that broadcasts without raising the rank of
  /// the other operand (a [1, 1, 1, 1] constant would), else nullopt.
  std::optional<float> low_rank_scalar(int t) const {
    auto v = scalar(t);
    return v && constant(t)->dims.size() <= 1 ? v : std::nullopt;
  }

  /// For a binary node with a constant scalar `value` on one side: the other input, else -1.
  int other_than_const(const PreparedNode& n, const char* op, float value, bool commutes) {
    if (n.op_type != op || !n.domain.empty() || n.inputs.size() != 2) return -1;
    auto near = [&](int t) {
      auto v = scalar(t);
      return v && std::fabs(*v - value) <= 1e-6f * std::fabs(value);
    };
    if (near(n.inputs[1])) return n.inputs[0];
    if (commutes && near(n.inputs[0])) return n.inputs[1];
    return -1;
  }
};

/// Turns `n` into the hp.nn node `op` (opset 1) reading `inputs`, its attributes cleared for the
/// caller to set; its outputs stay.
inline void rewrite_as(PreparedNode& n, const char* op, std::vector<int> inputs) {
  n.op_type = op;
  n.domain = "hp.nn";
  n.opset = 1;
  n.inputs = std::move(inputs);
  n.attrs.clear();
}

inline bool is_unary(const PreparedNode& n, const char* op) {
  return n.op_type == op && n.domain.empty() && n.inputs.size() == 1 && n.outputs.size() == 1 &&
         n.inputs[0] >= 0;
}

/// Primitive layer-norm chains as one LayerNormalization node (exec_fuse_norm.cpp); returns how
/// many it fused.
int fuse_layer_norm(FuseGraph& g);
/// Scale -> Where(mask) -> Softmax as one hp.nn.MaskedSoftmax node (exec_fuse_softmax.cpp).
int fuse_masked_softmax(FuseGraph& g);
/// MatMul -> hp.nn.MaskedSoftmax -> MatMul, with the heads' Transposes around them, as one
/// hp.nn.Attention node (exec_fuse_attention.cpp).
int fuse_attention(FuseGraph& g);

}  // namespace hp::exec
