// Forward rewrites applied before differentiation (autodiff.cpp): the same function, cheaper to
// train.
#pragma once

#include <onnx/onnx_pb.h>

namespace hp::train::detail {

/// nn.Linear exported for training reads its weight through a Transpose: MatMul(x, Transpose(W)).
/// Each step changes W, so that transposed copy would be rebuilt every step, and its gradient
/// transposed back. Rewritten as Reshape(x, [-1, k]) -> Gemm(x2, W, transB=1) -> Reshape(.., [...,
/// n]), which reads W as stored, forward and backward. Returns how many MatMuls it rewrote.
int fold_weight_transposes(onnx::GraphProto& g);

}  // namespace hp::train::detail
