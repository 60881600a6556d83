// The batch and sequence axes of a model's inputs, read off the graph inputs the way a user reads
// them: axis 0 of every input is the batch (symbolic in a dynamic export, a number in a static
// one); a model whose inputs include token ids [batch, seq] (integers) or a sequence of vectors
// [batch, seq, features] has a sequence axis, axis 1 of that input. Images [batch, C, H, W] and
// feature rows [batch, features] have none, and are planned per sample instead of per token.
#pragma once

#include <cstdint>
#include <string>

#include "hp/model/model.h"

namespace hp::model {

struct InputAxes {
  std::string batch_dim;          ///< the symbolic batch dim's name; empty when it is static
  std::int64_t static_batch = 0;  ///< axis 0 when it is a number in every input; 0 = symbolic
  bool sequence = false;          ///< some input has a sequence axis
  std::string seq_input;          ///< the first such input
  std::string seq_dim;            ///< its axis 1 when symbolic
  std::int64_t static_seq = 0;    ///< its axis 1 when a number
};

/// The axes of `m`'s graph inputs (initializers listed as inputs are not inputs).
InputAxes input_axes(const Model& m);

}  // namespace hp::model
