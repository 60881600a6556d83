// The loss nodes of the gradient model (docs/training.md, "Loss").
#pragma once

#include <string>

#include "grad_ctx.h"
#include "hp/train/autodiff.h"

namespace hp::train::detail {

struct LossNodes {
  std::string loss;     ///< scalar loss tensor
  std::string dlogits;  ///< d loss / d logits, shaped like the logits
};

/// Adds the labels graph input and the loss and its gradient after the forward nodes.
Expected<LossNodes> emit_loss(GraphWriter& w, const GradSpec& spec);

}  // namespace hp::train::detail
