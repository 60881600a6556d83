// The read-only graph view the planner works on: tensors with inferred shapes at bound dims, nodes
// in topological order, and each node's cost (FLOPs, bytes, parameters).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/model.h"

namespace hp::model {

/// Symbolic input dim name -> value, e.g. {"batch": 8, "seq": 2048}.
using DimBindings = std::map<std::string, std::int64_t>;

/// One dimension: a value, or unknown (optionally with the symbol it is known by).
struct Dim {
  std::int64_t value = -1;  ///< -1 when unknown
  std::string symbol;       ///< dim_param when unknown ("batch", "unk__3"), else empty
  bool known() const { return value >= 0; }
};

/// A node where shapes stop being known although its inputs' shapes are known: what `hp plan
/// --summary` reports instead of the symbols (unk__N) ONNX invents downstream of it.
struct UnresolvedShape {
  std::string node;    ///< node name (may be empty in anonymous graphs)
  std::string op;      ///< op type, "domain.Op" outside ai.onnx
  std::string tensor;  ///< the output without a concrete shape
  std::string reason;  ///< lower-case sentence: "its output size depends on the input data", ...
};

/// Where a tensor's value comes from; layer discovery and costs treat each class differently.
enum class TensorKind {
  input,        ///< graph input (not an initializer)
  initializer,  ///< stored weight or constant table
  constant,     ///< computed from constants only (Constant nodes, weight transposes, ...)
  shape,        ///< computed from tensor shapes only (Shape/Size and arithmetic on them)
  activation,   ///< depends on the data of a graph input
};

struct Tensor {
  std::string name;
  std::int32_t elem_type = 0;  ///< onnx TensorProto::DataType; 0 when unknown
  bool has_shape = false;      ///< rank known
  std::vector<Dim> dims;
  TensorKind kind = TensorKind::activation;
  int producer = -1;           ///< node index, -1 for inputs and initializers
  std::vector<int> consumers;  ///< node indices (a node using it twice appears once)
  /// For an initializer that is a transposed copy of another (the exporter's constant folding of a
  /// tied embedding's transpose): that other initializer's index. Copies are not parameters.
  int copy_of = -1;
  /// A sequence of tensors (SplitToSequence, a Loop building a list): it has no shape of its own,
  /// and its elements' shapes are those of the ops that read it.
  bool sequence = false;

  /// Element count when every dim is known.
  std::optional<std::int64_t> numel() const;
  /// numel() * element size when both are known.
  std::optional<std::int64_t> bytes() const;
  bool is_float() const;  ///< float16/bfloat16/float/double
  /// A floating-point initializer that is not a copy of another: what counts as parameters.
  bool is_parameter() const { return kind == TensorKind::initializer && copy_of < 0 && is_float(); }
};

/// Cost of one node for one forward pass at the bound dims.
struct NodeCost {
  double matmul_flops = 0;      ///< MatMul/Gemm/Conv/Einsum: 2 per multiply-accumulate
  double other_flops = 0;       ///< elementwise, normalisation, softmax, reductions
  std::int64_t bytes_read = 0;  ///< bytes of the data inputs (Shape/Size read none)
  std::int64_t bytes_written = 0;
  std::int64_t parameters = 0;  ///< floating-point initializer elements this node consumes
  bool known = true;            ///< false when a shape it needs is unknown (costs then undercount)
  double flops() const { return matmul_flops + other_flops; }
};

struct Node {
  std::string name;  ///< may be empty (anonymous graphs)
  std::string op_type;
  std::string domain;       ///< "" for ai.onnx
  std::vector<int> inputs;  ///< tensor indices; -1 for an omitted optional input
  std::vector<int> outputs;
  NodeCost cost;
  /// Shape of each initializer input as "AxB" (layer fingerprints use it); empty for other inputs.
  std::vector<std::string> weight_shapes;
};

/// The graph at bound dims. Tensor and node indices are stable; nodes are in topological order.
struct Graph {
  std::vector<Tensor> tensors;
  std::vector<Node> nodes;
  std::vector<int> inputs;  ///< graph inputs that are not initializers
  std::vector<int> outputs;
  /// Symbolic dims of graph inputs that were not bound (only those: a symbol inference invents
  /// inside the graph is never one the user could bind; see `unresolved`).
  std::vector<std::string> unknown_dims;
  /// Nodes whose outputs have no concrete shape although their inputs do, with the reason.
  std::vector<UnresolvedShape> unresolved;
  /// Initializers found to be transposed copies of others (Tensor::copy_of), in file order.
  std::vector<int> copies;
  /// Bindings that matched no input dim, tensors left without shapes, ... (lower-case sentences).
  std::vector<std::string> warnings;

  int find_tensor(const std::string& name) const;  ///< -1 when absent
  const Tensor& tensor(int i) const { return tensors[static_cast<std::size_t>(i)]; }
  const Node& node(int i) const { return nodes[static_cast<std::size_t>(i)]; }

  std::map<std::string, int> index;  ///< tensor name -> index
};

/// Errc::bad_input naming the dim when a binding is negative or above kMaxDim (2^40,
/// hp/core/checked.h): what every command checks before shapes are inferred from the bindings.
Status check_dim_bindings(const DimBindings& dims);

/// Binds `dims` on the graph inputs, infers every tensor's shape (ONNX shape inference plus hp's
/// evaluation of the exporter's shape arithmetic), and computes each node's cost. Never reads
/// external data. Errors: Errc::bad_input for a binding check_dim_bindings refuses, a tensor whose
/// inferred shape exceeds the limits of hp/core/checked.h, or a graph inference rejects.
Expected<Graph> build_graph(const Model& model, const DimBindings& dims);

/// Names a subgraph (an If branch, a Loop or Scan body) reads from the scopes around it, nested
/// subgraphs' included: the values a control-flow node captures besides its inputs.
std::set<std::string> outer_reads(const onnx::GraphProto& g);
/// What a node's subgraphs read from around the node (empty for a node without subgraphs).
std::set<std::string> outer_reads(const onnx::NodeProto& n);

/// Element size in bytes of an onnx data type (hp::dtype_size of its DType), 0 when unknown
/// (strings, undefined, 4-bit types).
int elem_size(std::int32_t elem_type);

}  // namespace hp::model
