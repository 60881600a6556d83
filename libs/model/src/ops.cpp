// The one table of operators the executor supports (the transformer and CNN ops of exported models,
// plus the basics exporters emit around them).
// Sorted within each group; tests/unit/exec/op_table_test.cpp checks it against the ops the cpu
// plugin runs, both ways.
#include "hp/model/ops.h"

#include <algorithm>
#include <iterator>

namespace hp::model {
namespace {

constexpr std::string_view kSupported[] = {
    // elementwise math
    "Abs",
    "Acos",
    "Acosh",
    "Add",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "Ceil",
    "Clip",
    "Cos",
    "Cosh",
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
    "Sinh",
    "Sqrt",
    "Sub",
    "Sum",
    "Tan",
    // activations
    "Celu",
    "Elu",
    "Erf",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "LeakyRelu",
    "PRelu",
    "Relu",
    "Selu",
    "Sigmoid",
    "Softplus",
    "Softsign",
    "Tanh",
    "ThresholdedRelu",
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
    "BatchNormalization",
    "InstanceNormalization",
    "LRN",
    "MeanVarianceNormalization",
    "LayerNormalization",
    "LogSoftmax",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Softmax",
    // matrix products
    "Conv",
    "ConvTranspose",
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
    "GatherND",
    "OneHot",
    "ScatterElements",
    "ScatterND",
    "Scatter",
    "TopK",
    "Trilu",
    "Where",
    // shapes, constants, types
    "Cast",
    "CastLike",
    "Constant",
    "ConstantOfShape",
    "CumSum",
    "Range",
    "Shape",
    "Size",
    // pooling and resampling (CNNs)
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "MaxPool",
    "MaxUnpool",
    "Resize",
    // recurrent layers
    "GRU",
    "LSTM",
    "RNN",
    // control flow and sequences (run by the executor itself, docs/executor.md)
    "ConcatFromSequence",
    "If",
    "Loop",
    "Scan",
    "SequenceAt",
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceErase",
    "SequenceInsert",
    "SequenceLength",
    "SequenceMap",
    "SplitToSequence",
    "Upsample",
    // no-ops at inference
    "Dropout",
    "Identity",
    // misc
    "ArgMax",
    "ArgMin",
    "IsInf",
    "IsNaN",
    "Pad",
    // training losses
    "NegativeLogLikelihoodLoss",
    "SoftmaxCrossEntropyLoss",
    // selection and data movement
    "BitShift",
    "Compress",
    "DepthToSpace",
    "EyeLike",
    "Hardmax",
    "NonZero",
    "ReverseSequence",
    "Shrink",
    "SpaceToDepth",
    "Unique",
    // quantisation
    "ConvInteger",
    "QLinearConv",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "MatMulInteger",
    "QLinearMatMul",
    "QuantizeLinear",
    // signal processing
    "DFT",
    "MelWeightMatrix",
    "STFT",
    "BlackmanWindow",
    "HammingWindow",
    "HannWindow",
    // detection and sampling
    "GridSample",
    "NonMaxSuppression",
    "RoiAlign",
    // random draws
    "Bernoulli",
    "RandomUniformLike",
    // text features
    "TfIdfVectorizer",
    // linear algebra
    "Det",
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
