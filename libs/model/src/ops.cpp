// The one table of operators the executor supports (the transformer and CNN ops of exported models,
// plus the basics exporters emit around them).
// Keep it sorted; the runtime's kernel registry is checked against it by its own tests.
#include "hp/model/ops.h"

#include <algorithm>
#include <iterator>

namespace hp::model {
namespace {

constexpr std::string_view kSupported[] = {
    // elementwise math
    "Abs",
    "Add",
    "Ceil",
    "Clip",
    "Cos",
    "Div",
    "Exp",
    "Floor",
    "Log",
    "Max",
    "Mean",
    "Min",
    "Mod",
    "Mul",
    "Neg",
    "Pow",
    "Reciprocal",
    "Round",
    "Sign",
    "Sin",
    "Sqrt",
    "Sub",
    "Sum",
    // activations
    "Elu",
    "Erf",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "LeakyRelu",
    "Relu",
    "Sigmoid",
    "Softplus",
    "Tanh",
    // comparisons and logic
    "And",
    "Equal",
    "Greater",
    "GreaterOrEqual",
    "Less",
    "LessOrEqual",
    "Not",
    "Or",
    "Xor",
    // normalisation, softmax, reductions
    "LayerNormalization",
    "LogSoftmax",
    "ReduceL2",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Softmax",
    // matrix products
    "Conv",
    "Einsum",
    "Gemm",
    "MatMul",
    // layout
    "Concat",
    "Expand",
    "Flatten",
    "Reshape",
    "Slice",
    "Split",
    "Squeeze",
    "Tile",
    "Transpose",
    "Unsqueeze",
    // indexing
    "Gather",
    "GatherElements",
    "ScatterElements",
    "ScatterND",
    "TopK",
    "Trilu",
    "Where",
    // shapes, constants, types
    "Cast",
    "Constant",
    "ConstantOfShape",
    "CumSum",
    "Range",
    "Shape",
    "Size",
    // no-ops at inference
    "Dropout",
    "Identity",
    // misc
    "ArgMax",
    "ArgMin",
    "IsInf",
    "IsNaN",
    "Pad",
};

}  // namespace

bool is_supported_op(std::string_view domain, std::string_view op_type) {
  if (!domain.empty() && domain != "ai.onnx") return false;
  return std::find(std::begin(kSupported), std::end(kSupported), op_type) != std::end(kSupported);
}

std::vector<std::string> supported_ops() {
  std::vector<std::string> out(std::begin(kSupported), std::end(kSupported));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace hp::model
