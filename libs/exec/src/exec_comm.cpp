// Communication nodes in the executor: an "hp"-domain node goes to the CommOps of ExecOptions with
// its inputs where they lie in the cpu backend's memory (copied there first when another backend
// wrote them) and its outputs allocated from the executor's pool, like any node's outputs. Nothing
// is copied on the way in or out: the buffers are pool buffers reused from run to run, which is
// what keeps a collective's cost at the transport's (tests/bench/comm measures both). An input
// whose last reader is this node is donatable: an output of its size may take over its buffer (the
// tensor- parallel partial sum into its AllReduce), so the collective runs in place as a
// hand-written MPI_Allreduce(MPI_IN_PLACE) would. Not under offload, whose schedule tracks buffers
// itself.
#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "exec_internal.h"

namespace hp::exec {

std::int64_t CommTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= d;
  return n;
}

Status CommOps::run_into(const CommNode& node, const std::vector<CommTensor>& inputs,
                         const CommAlloc& alloc) {
  std::vector<HostTensor> host(inputs.size());
  std::vector<const HostTensor*> ptrs;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const CommTensor& c = inputs[k];
    if (!c.data && c.dtype < 0) {
      ptrs.push_back(nullptr);
      continue;
    }
    host[k].name = k < node.inputs.size() ? node.inputs[k] : "";
    host[k].dtype = c.dtype;
    host[k].dims.assign(c.dims.begin(), c.dims.end());
    const auto* b = static_cast<const unsigned char*>(c.data);
    host[k].data.assign(b, b + c.bytes);
    ptrs.push_back(&host[k]);
  }
  std::vector<HostTensor> outs(node.outputs.size());
  HP_TRY(run(node, ptrs, outs));
  for (std::size_t k = 0; k < outs.size(); ++k) {
    if (outs[k].dtype < 0) continue;  // an output this layer did not produce
    HP_ASSIGN_OR_RETURN(auto p, alloc(k, outs[k].dtype, outs[k].dims, -1));
    if (!outs[k].data.empty()) std::memcpy(p, outs[k].data.data(), outs[k].data.size());
  }
  return {};
}

Expected<void*> Executor::Impl::comm_output(PreparedNode& n, std::size_t k, int dtype,
                                            std::span<const std::int64_t> dims, int reuse) {
  const std::vector<CommTensor>& ins = scratch_comm;
  std::vector<char>& given = scratch_given;  // inputs whose buffer an output took
  const int esz = dtype_size(dtype);
  if (k >= n.outputs.size() || esz == 0)
    return Error(Errc::internal,
                 fmt::format("the comm layer asked for output {} of dtype {}", k, dtype), n.name);
  std::int64_t count = 1;
  for (std::int64_t d : dims) count *= d;
  const std::size_t bytes = static_cast<std::size_t>(count * esz);
  const int id = n.outputs[k];
  if (id < 0) {  // an output the model does not read: somewhere to write it
    // One buffer per output index: a node with several outputs (hp.Dispatch) asks for all of them
    // before writing any, so a shared buffer grown for a later one would move an earlier one's.
    if (comm_discard.size() <= k) comm_discard.resize(k + 1);
    if (comm_discard[k].size() < bytes) comm_discard[k].resize(bytes);
    return static_cast<void*>(comm_discard[k].data());
  }
  Slot& s = slots[static_cast<std::size_t>(id)];
  if (s.live) free_slot(id);
  s.dtype = dtype;
  s.dims.assign(dims.begin(), dims.end());
  s.bytes = bytes;
  const auto r = static_cast<std::size_t>(reuse);
  if (reuse >= 0 && r < ins.size() && ins[r].donatable && !given[r] && ins[r].bytes == bytes) {
    // The input's cpu buffer changes hands; its slot stays live (without it) until released after
    // this node, so the pool's byte count is unchanged.
    Slot& from = slots[static_cast<std::size_t>(n.inputs[r])];
    s.ptr[0] = from.ptr[0];
    from.ptr[0] = nullptr;
    given[r] = 1;
    s.live = true;
    return s.ptr[0];
  }
  auto p = alloc(0, bytes, id);
  if (!p) return p;
  s.ptr[0] = *p;
  s.live = true;
  return p;
}

Status Executor::Impl::run_comm(PreparedNode& n) {
  std::vector<CommTensor>& ins = scratch_comm;
  ins.assign(n.inputs.size(), CommTensor{});
  for (std::size_t k = 0; k < n.inputs.size(); ++k) {
    const int t = n.inputs[k];
    if (t < 0) continue;
    HP_TRY(place(t, 0));
    const Slot& s = slots[static_cast<std::size_t>(t)];
    ins[k] = CommTensor{s.dtype, s.dims, s.ptr[0], s.bytes};
    ins[k].donatable = !off && s.ptr[0] && s.bytes > 0 &&
                       std::count(n.release_after.begin(), n.release_after.end(), t) == 1 &&
                       std::count(n.inputs.begin(), n.inputs.end(), t) == 1;
  }
  // The cpu backend's kernels may still be writing what the comm layer is about to read.
  if (!n.inputs.empty()) HP_TRY(be[0]->stream_sync(stream[0]));
  scratch_given.assign(ins.size(), 0);
  // Two pointers of capture: std::function keeps them inline (no allocation per node).
  auto alloc_out = [this, &n](std::size_t k, int dtype, std::span<const std::int64_t> dims,
                              int reuse) { return comm_output(n, k, dtype, dims, reuse); };
  HP_TRY(opts.comm->run_into(n.comm_node, ins, alloc_out));
  for (int id : n.outputs)
    if (id >= 0 && !slots[static_cast<std::size_t>(id)].live)
      return Error(Errc::runtime,
                   fmt::format("the comm layer produced no tensor for output '{}'",
                               tensor_names[static_cast<std::size_t>(id)]),
                   n.name);
  ++stats.nodes;
  return {};
}

}  // namespace hp::exec
