// Forward rewrites applied before differentiation (autodiff.cpp): the same function, cheaper to
// train.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "grad_ctx.h"

namespace hp::train::detail {

/// nn.Linear exported for training reads its weight through a Transpose: MatMul(x, Transpose(W)).
/// Each step changes W, so that transposed copy would be rebuilt every step, and its gradient
/// transposed back. Rewritten as Reshape(x, [-1, k]) -> Gemm(x2, W, transB=1) -> Reshape(.., [...,
/// n]), which reads W as stored, forward and backward. Returns how many MatMuls it rewrote.
int fold_weight_transposes(onnx::GraphProto& g);

/// PyTorch exports the exact GELU as Div(x, sqrt 2) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(.,
/// 0.5): differentiated as one hp.train.GeluGrad(dY, x). Among the first `forward_nodes` nodes of
/// w.graph (`reads`: what each reads), the chains whose intermediates nothing else reads: the
/// index of each chain's last Mul -> its x.
std::map<int, std::string> find_gelu_chains(const GraphWriter& w, int forward_nodes,
                                            const std::vector<std::set<std::string>>& reads);

}  // namespace hp::train::detail
