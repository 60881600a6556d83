// Pipeline-parallel training's models (docs/training.md, "Stages and the split backward").
//
// A pipeline stage is a piece of the forward model: split_forward_at cuts a model in two at
// tensors, split_pipeline applies it again to the second piece for more stages. Each stage's
// gradient model comes from build_grad_graph (autodiff.h) with the gradient of the cut tensors it
// sends arriving as inputs (GradSpec::output_grads) and the gradient of those it received leaving
// as outputs (GradSpec::input_grads). split_backward then cuts a gradient model where a schedule
// needs it: forward | backward, so the backward runs later from stashed activations (GPipe, 1F1B),
// or forward | input gradients (B) | weight gradients (W), so B, which the previous stage waits
// for, runs first and W fills the pipeline's bubbles (zero-bubble schedules).
//
// Every part is an ordinary ONNX model for the executor. Tensors keep the names they have in the
// whole model: what one part writes and a later part reads is passed by that name, and a weight is
// an initializer of every part that reads it, under its forward name, so Executor::set_weight
// updates each part's copy.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/graph.h"
#include "hp/model/model.h"
#include "hp/train/autodiff.h"

namespace hp::train {

/// A forward model cut in two.
struct ForwardStages {
  /// The nodes the cut tensors need. Inputs: the model's graph inputs it reads, in the model's
  /// order. Outputs: the cut tensors, in the order given.
  model::Model first;
  /// The nodes the model's outputs need given the cut tensors. Inputs: the cut tensors, then the
  /// model's graph inputs it reads (an attention mask computed from the ids is computed again
  /// here). Outputs: the model's.
  model::Model second;
  /// Floating-point initializers both stages read (an embedding tied to the head): each stage's
  /// gradient model gives a part of the gradient, and the parts add up to the whole.
  std::vector<std::string> shared_weights;
};

/// Cuts `model` at `cut` (tensors written by nodes): see ForwardStages. `dims` bind symbolic input
/// dims for the cut tensors' declared shapes (unbound ones stay symbolic). Errc::bad_input for an
/// empty cut, a name listed twice or written by no node, a node writing a cut tensor and another
/// the second stage needs (a Split cut at one output), and a cut that does not separate the
/// stages: a node reading a floating-point initializer that both stages would need (an activation
/// crossing the cut, such as a residual, that the cut does not list), named with its weight.
Expected<ForwardStages> split_forward_at(const model::Model& model,
                                         const std::vector<std::string>& cut,
                                         const model::DimBindings& dims = {});

/// A forward model cut into a pipeline's stages.
struct PipelinePieces {
  /// Stage s: inputs the tensors of cuts[s - 1], then the model's graph inputs it reads; outputs
  /// the tensors of cuts[s] (the last stage: the model's outputs).
  std::vector<model::Model> stages;
  /// For each floating-point initializer more than one stage reads (an embedding tied to the
  /// head), the stages reading it, ascending: each holds a part of its gradient.
  std::map<std::string, std::vector<int>> shared;
};

/// Cuts `model` at cuts[0], the second piece at cuts[1], and so on: cuts[b] are the tensors stage b
/// sends to stage b + 1. Errors: split_forward_at's for each cut; Errc::not_implemented when a
/// stage reads a tensor of an earlier boundary than the one before it (an activation that would
/// skip a stage; a pipeline passes activations to the next stage only), named with both stages.
Expected<PipelinePieces> split_pipeline(const model::Model& model,
                                        const std::vector<std::vector<std::string>>& cuts,
                                        const model::DimBindings& dims = {});

/// Where split_backward cuts.
enum class BackwardSplit {
  whole,         ///< forward | backward
  input_weight,  ///< forward | input gradients (B) | weight gradients (W)
};

/// One part of a split gradient model.
struct GradPart {
  model::Model model;
  std::vector<std::string> inputs;   ///< its graph inputs, in order
  std::vector<std::string> outputs;  ///< its graph outputs, in order
  /// The GradGraph::params it holds as initializers (call set_weight on this part for each).
  std::vector<std::string> params;
  /// The GradGraph::grads among its outputs.
  std::vector<std::string> grads;
  bool empty() const { return outputs.empty(); }
};

/// A gradient model cut for a schedule; every part's nodes are in the whole model's order.
struct GradParts {
  /// The forward nodes, and the Shape/Size nodes of the backward that read forward tensors (so only
  /// the shape is stashed). Inputs: the data inputs it reads. Outputs: GradGraph::forward_outputs,
  /// then the stash tensors not among them.
  GradPart forward;
  /// whole: the loss and every gradient. Inputs: the graph inputs it reads (data inputs, labels,
  /// "<output>.grad"s, in the whole model's order), then the stash it reads. Outputs: as the whole
  /// model's (loss, grads, input grads).
  /// input_weight: B, the nodes the loss and the input gradients need. Inputs as for whole.
  /// Outputs: the loss (with one), GradSpec::input_grads' "<input>.grad"s, the parameter gradients
  /// B's nodes write themselves (LayerNormalization's weight gradients come with its input
  /// gradient), then `carried`. Empty (no nodes, no outputs) for a stage without loss or
  /// input_grads (the first stage), where W does all.
  GradPart backward;
  /// input_weight: W, the nodes left, which write the other parameter gradients. Inputs: the
  /// graph inputs it reads, the stash it reads, then the carried tensors it reads. Outputs: its
  /// parameter gradients in GradGraph::grads order. Empty when B wrote them all, and with whole.
  GradPart weight;
  /// Forward tensors the backward parts read (activations, Dropout masks, shapes), in node order.
  /// Constant nodes are copied into the parts that read them instead of being stashed.
  std::vector<std::string> stash;
  /// Tensors B writes and W reads (the gradients arriving at MatMul outputs, ...), in node order.
  std::vector<std::string> carried;
};

/// Cuts `gg`'s model; see GradParts. Running forward, then backward (then weight) on the same data
/// gives the whole model's outputs. Errc::bad_input when gg.forward_nodes is out of range.
Expected<GradParts> split_backward(const GradGraph& gg, BackwardSplit how);

}  // namespace hp::train
