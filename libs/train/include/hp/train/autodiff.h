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
//
// A pipeline stage (docs/training.md, "Stages and the split backward") is differentiated the same
// way with the gradient of some of its outputs arriving from the next stage
// (GradSpec::output_grads, each a new graph input "<output>.grad") instead of, or beside, a loss,
// and with the gradient of some of its float inputs sent back to the previous stage
// (GradSpec::input_grads, each a new graph output "<input>.grad"). hp/train/stages.h cuts a model
// into stages and a gradient model into its forward and backward parts.
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
  /// The graph output the loss reads; empty: no loss (a pipeline stage before the last, whose
  /// gradient arrives through output_grads).
  std::string logits = "output";
  std::string labels = "labels";  ///< name of the new graph input holding labels / targets
  /// Graph outputs whose gradient arrives from outside (the next pipeline stage): each becomes a
  /// graph input named "<output>.grad" of the output's dtype and shape, added after the labels.
  /// Its gradient adds to the loss's where the output also feeds the loss. Errc::bad_input for a
  /// name that is no graph output or not floating point, or whose "<output>.grad" is taken.
  std::vector<std::string> output_grads;
  /// Graph inputs (float activations from the previous stage) whose gradient is wanted: each
  /// becomes a graph output named "<input>.grad" of the input's dtype and shape (zeros where the
  /// input does not reach the loss). Errc::bad_input for a name that is no graph input (an
  /// initializer is not one), an input that is not floating point, or a taken "<input>.grad".
  std::vector<std::string> input_grads;
  /// Initializers not trained (globs, '*' and '?'): buffers such as RoPE tables or masks that an
  /// export stores as initializers beside the parameters.
  std::vector<std::string> frozen;
  /// Blocks (layer indices of model::discover_layers) whose forward is recomputed in backward.
  std::vector<std::int64_t> recompute_blocks;
  /// Symbolic input dims at which the gradient model will run (batch, seq). Shape inference at
  /// these dims tells the rules ranks and which broadcasts need reducing; the gradient model is
  /// specialised to them (a different batch needs a new transformation).
  model::DimBindings dims;
  /// Tensor parallelism: the model is one rank's partition from hp shard (hp/shard/partition.h),
  /// whose "hp"-domain collectives are differentiated into their conjugates (docs/training.md,
  /// "Tensor parallelism"). Empty `group`: an ordinary model.
  struct TensorParallel {
    /// The partition's tensors whose values differ across the tensor-parallel group (split or
    /// partial over it: RankPartition::varying). Where such a tensor is computed from one that is
    /// the same on every member (Megatron's f: the entry of a parallel region), the gradient of the
    /// same-valued tensor is all-reduced over `group`.
    std::vector<std::string> varying;
    std::vector<std::int64_t> group;  ///< global ranks of the tensor-parallel group
    std::int64_t rank = -1;           ///< this rank (its slice of an AllGather's gradient)
  } tp;
  /// Non-empty: a scalar float32 graph input of this name (the last input) multiplies the loss's
  /// gradient. Expert parallelism weights each rank's share of the group's mean by it before the
  /// experts' gradients of several ranks' tokens mix (expert_parallel.h).
  std::string loss_scale;
  /// Expose the buffers the forward updates (GradGraph::buffer_updates), for a loop that writes
  /// them back after each step as PyTorch updates its modules' buffers.
  bool update_buffers = false;
};

/// The gradient model and how to read it. Its graph outputs, in order: `loss` (absent without a
/// loss), `grads` (one per entry of `params`), then `input_grad_outputs`.
struct GradGraph {
  model::Model model;  ///< forward + loss + backward; path = the forward model's (external data)
  std::string loss;    ///< graph output: the scalar loss (f32); empty when the spec has no loss
  /// Trainable initializers in file order, and the graph output holding each one's gradient.
  std::vector<std::string> params;
  std::vector<std::string> grads;
  /// Graph inputs in order: the forward model's data inputs, then `labels` (only with a loss),
  /// then `output_grad_inputs`.
  std::vector<std::string> inputs;
  std::string labels;  ///< GradSpec::labels with a loss, else empty
  /// "<output>.grad" for each GradSpec::output_grads entry, in its order (graph inputs).
  std::vector<std::string> output_grad_inputs;
  /// "<input>.grad" for each GradSpec::input_grads entry, in its order (the last graph outputs).
  std::vector<std::string> input_grad_outputs;
  /// The forward outputs the gradient model still computes: the logits (with a loss; under a
  /// vocabulary-parallel loss this member's block of them, before their all-gather), then the
  /// output_grads names not already listed. A forward output neither names is pruned with the
  /// other nodes nothing reads.
  std::vector<std::string> forward_outputs;
  /// The first forward_nodes nodes of `model` are the forward's (in its order, Dropout masks
  /// added); the rest are the loss and the backward. split_backward (stages.h) cuts there.
  int forward_nodes = 0;
  model::DimBindings dims;  ///< GradSpec::dims, at which the model was specialised
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
  /// Tensor parallelism: the entries of parallel regions whose gradient is all-reduced.
  int parallel_entries = 0;
  /// With GradSpec::update_buffers: initializers the forward computes a new value of, and the graph
  /// output holding it (the last outputs, after input_grad_outputs): BatchNormalization's running
  /// mean and variance in training mode (its outputs 1 and 2, the ONNX momentum update).
  std::vector<std::pair<std::string, std::string>> buffer_updates;
  /// Things the user should know that do not stop training (lower-case sentences).
  std::vector<std::string> notes;
};

/// Builds the gradient model; see the file comment. `model` must be loaded (weights may be absent:
/// the transformation reads no weight values).
Expected<GradGraph> build_grad_graph(const model::Model& model, const GradSpec& spec);

}  // namespace hp::train
