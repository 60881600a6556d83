// Graph rewrites around differentiation (autodiff.cpp): the same function, cheaper to
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

/// Every Scan of `g` (not of its subgraphs: a subgraph's backward is built from it as a model of
/// its own, which this rewrites in turn) as the Loop computing the same: trip count the first scan
/// input's length, each scan input sliced at the iteration by a Gather inside the body (from the
/// end for a reversed one), scan outputs stacked by the Loop and a reversed one gathered back.
/// Its gradient is then the Loop's (control_grad.h). Errc::bad_input naming the node for what the
/// Loop cannot express this way: opset 8's Scan (sequence_lens), an output stacked along an axis
/// other than 0 (scan_loop.cpp).
Status scans_to_loops(onnx::GraphProto& g, std::int64_t opset);

/// PyTorch exports the exact GELU as Div(x, sqrt 2) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(.,
/// 0.5): differentiated as one hp.train.GeluGrad(dY, x). Among the first `forward_nodes` nodes of
/// w.graph (`reads`: what each reads), the chains whose intermediates nothing else reads: the
/// index of each chain's last Mul -> its x.
std::map<int, std::string> find_gelu_chains(const GraphWriter& w, int forward_nodes,
                                            const std::vector<std::set<std::string>>& reads);

/// PyTorch exports nn.LayerNorm below opset 17 as ReduceMean -> Sub -> Pow(., 2) -> ReduceMean ->
/// Add(eps) -> Sqrt -> Div -> Mul(gamma) [-> Add(beta)]: differentiated node by node, a dozen
/// passes and as many saved tensors. Among the first `forward_nodes` nodes of w.graph (`reads`:
/// what each reads), the chains over the last axes of an input whose normalised dims are known,
/// gamma (and beta) of exactly those dims, whose intermediates nothing else reads: the index of
/// each chain's last node -> the LayerNormalization node computing the same (its output the last
/// node's), whose gradient is one hp.train.LayerNormGrad. The executor fuses the forward chain into
/// that node (libs/exec/src/exec_fuse_norm.cpp).
std::map<int, onnx::NodeProto> find_layer_norm_chains(
    const GraphWriter& w, int forward_nodes, const std::vector<std::set<std::string>>& reads);

/// After differentiation: moves every backward Shape node that reads a forward tensor (or a graph
/// input or weight) to just after that tensor's producer, into the forward part. A rule asks for
/// shapes at backward time (a Reshape's gradient reshapes back to its input's shape, SumTo reduces
/// to a broadcast input's); left among the backward nodes, the Shape node kept its whole input
/// alive until then, although only eight bytes per dim are needed. The executor runs nodes in file
/// order where it can (libs/exec/src/exec_prepare.cpp), so a hoisted Shape node runs as soon as its
/// input exists and the tensor is freed after its last forward reader. A Shape node of a backward
/// tensor moves to just after its producer as well: a recomputed block's clones (emitted together
/// before the block's backward) would otherwise stay alive through that backward for their shapes.
/// Returns the new forward node count.
int hoist_shape_reads(onnx::GraphProto& g, int forward_nodes);

/// BatchNormalization's running statistics among the first `forward_nodes` nodes of `g`: buffers,
/// never trained (each initializer read as one is added to `untrained` with the reason, unless it
/// is there already). Returns, for the training-mode nodes, each statistic's initializer and the
/// node output holding its new value (a buffer two nodes update: the first's).
std::vector<std::pair<std::string, std::string>> batch_norm_buffers(
    const onnx::GraphProto& g, int forward_nodes, std::map<std::string, std::string>& untrained);

/// A pipeline stage's partition as a stage piece (stages.h): its hp.Recv nodes become graph inputs
/// and its hp.Send nodes go (what they send is a graph output already). Errc::bad_input when a
/// Send sends a tensor that is no graph output (tensor_parallel.cpp).
Status recv_send_to_io(onnx::ModelProto& m);

/// Tensor parallelism (GradSpec::tp): where a node computing a `varying` tensor (one whose values
/// differ across the group) reads a floating-point tensor that is the same on every member, that
/// read goes through Identity(X) -> "<X>.tp_entry" (one per X, before its first such reader), and
/// reduce_grad maps the Identity's output to `group`: the Identity rule all-reduces its gradient,
/// Megatron's f operator. Readers that compute same-valued tensors keep reading X, so their
/// (whole) gradient is added after the reduction, not summed over the members. Node outputs not
/// in `original` (what a rewrite added) vary when one of the node's inputs does. Returns the
/// number of entries.
int mark_parallel_entries(onnx::GraphProto& g, std::set<std::string> varying,
                          const std::set<std::string>& original,
                          const std::vector<std::int64_t>& group,
                          std::map<std::string, std::vector<std::int64_t>>& reduce_grad);

}  // namespace hp::train::detail
