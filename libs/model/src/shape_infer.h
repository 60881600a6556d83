// Private: shape inference at bound dims (shape.cpp) and the evaluator of shape arithmetic it uses
// (values.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <onnx/defs/shape_inference.h>

#include "hp/core/expected.h"
#include "hp/model/graph.h"
#include "onnx_util.h"

namespace hp::model {

/// Inferred type and shape of one tensor.
struct ShapeInfo {
  std::int32_t elem_type = 0;
  bool has_shape = false;
  std::vector<Dim> dims;
};
using ShapeMap = std::unordered_map<std::string, ShapeInfo>;

struct InferResult {
  ShapeMap shapes;
  std::vector<std::string> unknown_dims;  ///< symbolic dims of graph inputs left unbound
  std::vector<UnresolvedShape> unresolved;
  std::set<std::string> sequences;  ///< tensors that are sequences (no shape of their own)
  std::set<std::string> valued;     ///< tensors whose values shape arithmetic computed
  std::vector<std::string> warnings;
};

/// Errc::bad_input naming the first node (in `g` or its subgraphs) that its ONNX schema rejects:
/// wrong input/output counts, a required attribute missing (shape_check.cpp). libonnx's inference
/// functions assume these hold and crash when they do not.
Status check_node_schemas(const onnx::GraphProto& g,
                          const std::map<std::string, std::int64_t>& opsets,
                          const std::string& where);

/// Held around every use of libonnx's schema registry on a thread of a process with several (the
/// ranks of a simulated run each build their gradient graph): libonnx fills some of its global maps
/// lazily, during inference, without a lock of its own.
std::mutex& onnx_registry_mutex();

/// ONNX shape inference of `copy` in place, in a forked child so that a crash inside libonnx is an
/// Errc::bad_input naming `where` instead of a dead process (shape_isolated.cpp).
Status infer_shapes_isolated(onnx::ModelProto& copy, const onnx::ShapeInferenceOptions& options,
                             const std::string& where);

/// Runs inference on a weight-less copy of `model` with `dims` bound on the graph inputs.
Expected<InferResult> infer_shapes(const Model& model, const DimBindings& dims);

/// Output shapes of "hp"-domain communication nodes (shape_hp.cpp) whose input shapes are known and
/// whose outputs ONNX left unknown, added to `fixed`; returns how many.
int fix_hp_domain_shapes(const onnx::GraphProto& g, const ShapeMap& shapes, ShapeMap& fixed);
/// libonnx 1.12's data propagation crashes (SIGSEGV) on a Shape node downstream of a tensor that
/// has no type at all, which is what the output of an op it has no schema for is (an "hp"
/// collective, a vendor op) until hp fixes its shape. Before a round of inference, every such
/// output not in `fixed` gets a value_info with an element type and no shape: its first input's
/// type from the previous round (`shapes`), else float. Returns how many it added.
int add_type_stubs(onnx::GraphProto& g, const ShapeMap& fixed, const ShapeMap& shapes, int opset);

/// Drops the declared shapes of every subgraph output (element types stay), so inference writes the
/// inferred ones (shape_control.cpp).
void strip_subgraph_output_shapes(onnx::GraphProto& g);
/// Shapes of Loop-carried outputs whose body keeps the carried input's static shape, added to
/// `fixed`; returns how many (shape_control.cpp).
int fix_loop_shapes(const onnx::GraphProto& g, const ShapeMap& shapes, ShapeMap& fixed);
/// Declares the carried inputs of each Loop body with their initial value's static shape where the
/// body declares them with symbols only, so that inference of the body (and fix_loop_shapes after
/// it) sees bound dims; returns how many it changed (shape_control.cpp).
int bind_loop_body_inputs(onnx::GraphProto& g, const ShapeMap& shapes);

/// A small tensor value computed from shapes and constants (what the exporter's
/// Shape/Gather/Concat arithmetic produces). Values are doubles: exact for any realistic dim.
struct Value {
  std::vector<std::int64_t> shape;
  std::vector<double> data;
  std::int32_t elem_type = onnx::TensorProto::INT64;
};
using ValueMap = std::unordered_map<std::string, Value>;

/// Rewrites the sequence ops of `g` whose lengths are known (and Loops building sequences, when
/// their trip count is known) into plain tensor ops, all or nothing (shape_seq.cpp); adds the
/// names of the lowered sequences to `sequences` and returns how many ops it rewrote.
int lower_sequences(onnx::GraphProto& g, const ShapeMap& shapes, const ValueMap& values, int opset,
                    int& serial, std::set<std::string>& sequences);

/// The nodes where shapes stop being known although their inputs' shapes are (shape_diag.cpp),
/// each with the reason; nodes downstream of an unbound input dim are not listed.
std::vector<UnresolvedShape> find_unresolved(const onnx::GraphProto& g, const InferResult& r);

/// Output shapes of OneHot nodes whose depth value is known and whose outputs ONNX left incomplete,
/// added to `fixed` (shape_gaps.cpp); returns how many.
int fix_onehot_shapes(const onnx::GraphProto& g, const ShapeMap& shapes, const ValueMap& values,
                      ShapeMap& fixed);

/// Whether a shape-deciding input position of `op` (Reshape's shape, Range's bounds, ...).
const std::vector<int>* shape_inputs(const std::string& op);

/// Evaluates every node of `graph` whose inputs have known values (seeded from small inline
/// initializers) and whose op is shape arithmetic; Shape/Size read `shapes`.
ValueMap evaluate_shape_values(const onnx::GraphProto& graph, const ShapeMap& shapes, int opset);

}  // namespace hp::model
