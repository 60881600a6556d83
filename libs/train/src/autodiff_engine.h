// The state of one autodiff transformation (autodiff.cpp builds it and runs the backward,
// autodiff_finish.cpp writes the gradient model's outputs and prunes it).
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "control_grad.h"
#include "grad_ctx.h"
#include "hp/train/autodiff.h"

namespace hp::train::detail {

struct Engine {
  Engine(const model::Model& m, const GradSpec& s, model::Graph g)
      : model(m), spec(s), fg(std::move(g)), proto(std::make_shared<onnx::ModelProto>(*m.proto)) {}
  const model::Model& model;
  const GradSpec& spec;
  const onnx::GraphProto* exported = nullptr;  ///< the forward before rewrites (rewrite.h)
  model::Graph fg;
  std::shared_ptr<onnx::ModelProto> proto;
  GraphWriter w;
  std::vector<std::set<std::string>> reads;  ///< per forward node
  std::set<std::string> requires_grad, reaches_loss;
  std::map<std::string, std::vector<std::string>> contrib;
  std::map<std::string, std::string> rename;  ///< forward tensor -> recomputed clone
  std::map<int, int> block_of;                ///< forward node -> recomputed block
  std::map<int, std::vector<int>> block_nodes;
  std::set<int> recomputed;
  int forward_nodes = 0;
  int clones = 0;
  std::vector<std::string> notes;

  const std::string& renamed(const std::string& t) const {
    auto it = rename.find(t);
    return it == rename.end() ? t : it->second;
  }

  /// The gradient of `t` (Sum of its contributions), "" when none.
  std::string accumulated(const std::string& t) {
    auto it = contrib.find(t);
    if (it == contrib.end() || it->second.empty()) return "";
    if (it->second.size() == 1) return it->second.front();
    std::string s = w.emit("Sum", it->second, 1)[0];
    it->second = {s};
    return s;
  }

  /// What the loss reads of the forward: the logits, or this member's block of them under a
  /// vocabulary-parallel loss (loss_graph.h); kept as a forward output.
  std::string loss_reads;
  std::map<int, std::string> gelu_tail;  ///< forward node ending an exact-GELU chain -> its x
  /// Forward node ending a primitive layer-norm chain -> the LayerNormalization it computes.
  std::map<int, onnx::NodeProto> norm_tail;
  detail::ControlContext control{
      &model, &spec, [this](const std::string& t) { return requires_grad.count(t) > 0; },
      [this](const std::string& t) { return renamed(t); }};

  Status check_loss_names() const;
  Status check_and_mark(GradGraph& out);
  Status recompute_setup();
  void emit_clones(int block);
  void replay_dropout(const onnx::NodeProto& n);
  Status backward(std::vector<Diagnostic>& errors);
  Status finish(GradGraph& out, const std::string& loss);
};

}  // namespace hp::train::detail
