// Finding a tensor by the name a user knows it by. Users name parameters as PyTorch does
// ("blocks.0.attn.in_proj_weight"), and torch.onnx keeps that name for a parameter a node reads
// directly, but a parameter it transposes (nn.MultiheadAttention's in_proj_weight, a Linear lowered
// to MatMul) is constant-folded into a new initializer named after its consumer
// ("onnx::MatMul_179", holding the transpose) and the original name is gone: torch 1.13 leaves no
// doc_string on initializers or nodes. What survives is the module path in the consuming node's
// scope name
// ("/blocks.0/attn/MatMul"), so a parameter "M.p" is found as the one renamed initializer read by
// a node of scope M. When that is ambiguous or absent, the closest names are offered instead.
#pragma once

#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/graph.h"

namespace hp::model {

/// A tensor found for a name, and how.
struct NameMatch {
  int tensor = -1;
  /// Empty for an exact match; for a renamed parameter, a sentence saying which initializer holds
  /// it and why ("exported as 'onnx::MatMul_179', read by '/blocks.0/attn/MatMul' ...").
  std::string note;
};

/// Resolves `name`: a tensor of that name, else a PyTorch parameter name resolved through the
/// scope of the node reading its renamed initializer. Neither is Errc::bad_input "the model has no
/// tensor 'NAME'" with a "did you mean" hint naming the closest tensors (empty `where`: the caller
/// knows the file).
Expected<NameMatch> resolve_tensor_name(const Graph& g, const std::string& name);

/// Up to `limit` tensor names close to `name`, best first: the renamed initializers read in the
/// module scope `name` points at; else the same parameter under the nearest module path that
/// would resolve it (a typo in "blocks.0.atn.in_proj_weight"), and, when the exporter flattened the
/// scopes, the renamed initializers of scopes named like its last module ("c_attn", "c_attn_1");
/// then names of which `name` is the trailing part, then names by edit distance (ties: the longer
/// common suffix). Names too far to be a typo are left out.
std::vector<std::string> similar_tensor_names(const Graph& g, const std::string& name,
                                              std::size_t limit = 3);

}  // namespace hp::model
