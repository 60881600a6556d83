// Channels-last tensors between convolutions, chosen at preparation.
//
// ONNX tensors are N x C x H x W, while oneDNN's float32 convolutions on AVX2/AVX-512 run
// channels-last (N x H x W x C) for most shapes, so each convolution reorders its input in and its
// output back. In the small CNN of tests/bench/executor those two 1 MB reorders around each 0.6 ms
// convolution were about a quarter of the run. So a convolution's output stays channels-last when
// every node reading it is another convolution reading it as X or as Z (a fused residual) and it is
// no graph output: those convolutions become hp.nn.FusedConv, the FusedConv of exec_fuse.cpp with
// the attribute channels_last = [x, z, y] saying which operands are stored N x H x W x C (with
// their dims in that order). Such a tensor is seen by no other node, so the rest of the graph, the
// outputs and the tensors a user reads keep ONNX's layout; a chain's first convolution reads
// N x C x H x W, its last writes it.
//
// Only 2-D convolutions whose weights are 4-D initializers take part, the rank being known before
// the run; a tensor read inside a subgraph stays as it is. The kernel's arithmetic is the same
// convolution in either layout (plugins/cpu/cpu_ops_conv.cpp).
#include <map>

#include "exec_internal.h"

namespace hp::exec {

namespace {

bool is_2d_conv(const PreparedNode& n, const std::map<int, std::size_t>& weight_rank) {
  if (n.dead || n.outputs.size() != 1 || n.inputs.size() < 2 || n.inputs[0] < 0) return false;
  const bool conv = (n.op_type == "Conv" && n.domain.empty()) ||
                    (n.op_type == "FusedConv" && n.domain == "com.microsoft");
  if (!conv) return false;
  auto w = weight_rank.find(n.inputs[1]);
  return w != weight_rank.end() && w->second == 4;
}

}  // namespace

int keep_channels_last(Executor::Impl& im) {
  const plugin::Backend* be = im.be[1] ? im.be[1] : im.be[0];
  if (!be->supports_op_type(0, "FusedConv", "hp.nn", 1)) return 0;
  std::map<int, std::size_t> weight_rank;
  for (const auto& [id, h] : im.weights) weight_rank[id] = h.dims.size();

  const std::size_t nt = im.tensor_names.size();
  std::vector<int> producer(nt, -1);
  // A tensor stays channels-last only if all its readers are 2-D convolutions taking it as X or Z.
  std::vector<char> conv_readers_only(nt, 1), read(nt, 0);
  std::vector<char> conv(im.nodes.size(), 0);
  for (std::size_t k = 0; k < im.nodes.size(); ++k) conv[k] = is_2d_conv(im.nodes[k], weight_rank);
  for (std::size_t k = 0; k < im.nodes.size(); ++k) {
    const PreparedNode& n = im.nodes[k];
    if (n.dead) continue;
    for (int t : n.outputs)
      if (t >= 0) producer[static_cast<std::size_t>(t)] = static_cast<int>(k);
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const int t = n.inputs[i];
      if (t < 0) continue;
      read[static_cast<std::size_t>(t)] = 1;
      if (!conv[k] || (i != 0 && i != 3)) conv_readers_only[static_cast<std::size_t>(t)] = 0;
    }
    for (int t : n.captured)
      if (t >= 0) conv_readers_only[static_cast<std::size_t>(t)] = 0;
  }
  for (int t : im.output_ids) conv_readers_only[static_cast<std::size_t>(t)] = 0;

  auto channels_last = [&](int t) {
    if (t < 0) return false;
    const auto u = static_cast<std::size_t>(t);
    const int p = producer[u];
    return p >= 0 && conv[static_cast<std::size_t>(p)] && read[u] && conv_readers_only[u];
  };
  int changed = 0;
  for (std::size_t k = 0; k < im.nodes.size(); ++k) {
    if (!conv[k]) continue;
    PreparedNode& n = im.nodes[k];
    const bool x = channels_last(n.inputs[0]);
    const bool z = n.inputs.size() > 3 && channels_last(n.inputs[3]);
    const bool y = channels_last(n.outputs[0]);
    if (!x && !z && !y) continue;
    n.op_type = "FusedConv";
    n.domain = "hp.nn";
    n.opset = 1;
    add_ints_attr(n, "channels_last", {x, z, y});
    ++changed;
  }
  return changed;
}

}  // namespace hp::exec
