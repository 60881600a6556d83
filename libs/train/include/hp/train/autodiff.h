// Autodiff as a graph transformation (docs/training.md).
//
// From a forward ONNX model, the loss to put on one of its outputs and the trainable initializers,
// build_grad_graph writes ONE ordinary ONNX model that computes the loss and the gradient of every
// trainable tensor: the forward nodes as exported, the loss nodes, then the backward nodes in
// reverse order of the forward. The executor runs it like any model; shard and the schedules can
// inspect and partition it. Gradients that ONNX cannot express in one op (a broadcast reduced back
// to its input's shape, a slice's scatter, softmax, layer norm, embedding scatter-add, the loss)
// use ops of the "hp.train" domain, which the cpu backend implements (docs/training.md lists them).
//
// Everything that can make the transformation fail is found before anything runs: an op without a
// gradient rule on a path from a trainable tensor to the loss is an error naming the node (all such
// nodes in one error), a loss output that does not exist, an opset older than 13.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/graph.h"
#include "hp/model/model.h"

namespace hp::train {

/// The loss put on the model's output.
enum class LossKind {
  cross_entropy,  ///< logits [..., C] (class axis last), int64 labels [...], mean over labels !=
                  ///< -100
  mse,            ///< mean((output - target)^2), target of the output's shape and dtype
};

/// "cross_entropy" | "mse"; Errc::bad_input otherwise.
Expected<LossKind> parse_loss(const std::string& name);
const char* loss_name(LossKind k);

/// Recomputation of one block (model::layers' numbering): its forward nodes run again just before
/// its backward instead of keeping their outputs alive from the forward.
struct GradSpec {
  LossKind loss = LossKind::cross_entropy;
  std::string logits = "output";  ///< the graph output the loss reads
  std::string labels = "labels";  ///< name of the new graph input holding labels / targets
  /// Initializers not trained (globs, '*' and '?'): buffers such as RoPE tables or masks that an
  /// export stores as initializers beside the parameters.
  std::vector<std::string> frozen;
  /// Blocks (layer indices of model::discover_layers) whose forward is recomputed in backward.
  std::vector<std::int64_t> recompute_blocks;
  /// Symbolic input dims at which the gradient model will run (batch, seq). Shape inference at
  /// these dims tells the rules ranks and which broadcasts need reducing; the gradient model is
  /// specialised to them (a different batch needs a new transformation).
  model::DimBindings dims;
};

/// The gradient model and how to read it.
struct GradGraph {
  model::Model model;  ///< forward + loss + backward; path = the forward model's (external data)
  std::string loss;    ///< graph output: the scalar loss (f32)
  /// Trainable initializers in file order, and the graph output holding each one's gradient.
  std::vector<std::string> params;
  std::vector<std::string> grads;
  /// Graph inputs in order: the forward model's data inputs, then `labels`.
  std::vector<std::string> inputs;
  /// Initializers left untrained: frozen by the spec, not floating point, or not on a path to the
  /// loss (their gradient is zero), each with the reason.
  std::map<std::string, std::string> untrained;
  /// Trainable tensors read by several nodes (tied weights, Identity aliases): their gradient is
  /// the sum of each reader's; name -> number of readers.
  std::map<std::string, int> tied;
  /// Of those, the ones read through an Identity: eval-mode exports merge initializers that happen
  /// to hold equal values (fresh LayerNorm weights) this way, tying what PyTorch trains apart.
  std::vector<std::string> aliased;
  /// Forward nodes cloned for recomputation.
  int recomputed_nodes = 0;
  /// Things the user should know that do not stop training (lower-case sentences).
  std::vector<std::string> notes;
};

/// Builds the gradient model; see the file comment. `model` must be loaded (weights may be absent:
/// the transformation reads no weight values).
Expected<GradGraph> build_grad_graph(const model::Model& model, const GradSpec& spec);

}  // namespace hp::train
