// Cutting one ONNX graph into several that run one after another (stages.h): which tensors a set of
// nodes reads from outside itself, and the model holding only those nodes with the given graph
// inputs and outputs, the initializers it reads and nothing else.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "hp/model/graph.h"
#include "hp/model/model.h"

namespace hp::train::detail {

/// Floating-point element types: the tensors that carry a gradient.
inline bool is_float_type(std::int32_t t) {
  return t == onnx::TensorProto::FLOAT || t == onnx::TensorProto::DOUBLE ||
         t == onnx::TensorProto::FLOAT16 || t == onnx::TensorProto::BFLOAT16;
}

/// Names a node reads, its subgraphs' reads of outer-scope tensors included.
void collect_reads(const onnx::NodeProto& n, std::set<std::string>& out);

/// The element types and dims of a model's tensors at bound dims, to declare the graph inputs and
/// outputs a cut creates. Shape inference knows ai.onnx ops; a tensor it leaves untyped (an
/// hp.train op's output, or what follows one) takes the type of its node's first typed float
/// input, which is what every hp.train op returns.
class TensorInfo {
 public:
  /// Knows nothing: declare() gives names only.
  TensorInfo() = default;
  /// `m`'s initializer, input and output types, `fg`'s inferred types and dims (fg may be null, or
  /// the view of a part of `m`: tensor names are shared), then propagation over `m`'s nodes.
  TensorInfo(const model::Model& m, const model::Graph* fg);
  /// Sets v's name and, where known, its type: its dtype, and its dims where inference knew the
  /// rank (named symbols kept as dim_params).
  void declare(onnx::ValueInfoProto& v, const std::string& name) const;

 private:
  std::map<std::string, std::int32_t> types_;
  std::map<std::string, std::vector<model::Dim>> dims_;
};

/// What one part is: the source graph's nodes it runs (indices, ascending, so topologically
/// ordered) and its graph inputs and outputs in order.
struct PartSpec {
  std::vector<int> nodes;
  std::vector<std::string> inputs, outputs;
};

/// Tensors `nodes` of `g` read that none of them writes, in order of first reading.
std::vector<std::string> outside_reads(const onnx::GraphProto& g, const std::vector<int>& nodes);

/// The model of one part of `src`: the nodes, the initializers they read, the inputs and outputs
/// declared as in `src` where they are its graph inputs or outputs, else from `info`; value_info
/// of the tensors the part writes. path, opsets and ir version are the source's (so external data
/// resolves), the graph is named `name`.
model::Model part_model(const model::Model& src, const PartSpec& part, const TensorInfo& info,
                        const std::string& name);

/// Indices of the nodes `g` needs to compute `targets` from `stops` (tensors taken as given),
/// its graph inputs and its initializers, ascending. Tensors no node writes are taken as given.
std::vector<int> needed_nodes(const onnx::GraphProto& g, const std::vector<std::string>& targets,
                              const std::set<std::string>& stops);

}  // namespace hp::train::detail
