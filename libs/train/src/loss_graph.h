// The loss nodes of the gradient model (docs/training.md, "Loss").
#pragma once

#include <optional>

#include <string>

#include "grad_ctx.h"
#include "hp/train/autodiff.h"

namespace hp::train::detail {

struct LossNodes {
  std::string loss;     ///< scalar loss tensor
  std::string dlogits;  ///< d loss / d logits, shaped like the logits
  /// The tensor dlogits is the gradient of: the logits, or under a vocabulary-parallel loss this
  /// member's block of them (the all-gather's input; loss_vocab.cpp).
  std::string dlogits_of;
};

/// Adds the labels graph input and the loss and its gradient after the forward nodes.
Expected<LossNodes> emit_loss(GraphWriter& w, const GradSpec& spec);

/// Cross entropy of tensor-parallel logits that hp shard all-gathers along the class axis from
/// each member's block: computed on the blocks with three row all-reduces, not on the gathered
/// logits (loss_vocab.cpp). nullopt where the logits are not such a gather (then emit_loss's
/// ordinary loss applies).
std::optional<Expected<LossNodes>> emit_vocab_parallel_loss(GraphWriter& w, const GradSpec& spec);

}  // namespace hp::train::detail
