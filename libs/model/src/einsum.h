// Private: Einsum equation analysis, shared by shape inference (output dims, which ONNX 1.12 does
// not infer) and cost (multiply-accumulates).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hp::model {

struct EinsumDims {
  std::map<char, std::int64_t> letters;  ///< size of every subscript
  std::vector<std::int64_t> ellipsis;    ///< the broadcast "..." dims
  std::vector<std::int64_t> output;      ///< output shape
  /// Multiply-accumulates: one per point of the joint index space (all subscripts and "...").
  double macs() const;
};

/// Sizes from an equation such as "bsh,ehf->bsef" and fully known input shapes; nullopt when the
/// equation and shapes disagree.
std::optional<EinsumDims> analyse_einsum(const std::string& equation,
                                         const std::vector<std::vector<std::int64_t>>& inputs);

}  // namespace hp::model
