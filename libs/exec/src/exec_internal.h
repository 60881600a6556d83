// Private state of the executor, shared by exec_prepare.cpp (ordering, op checks, attributes,
// initializers, lifetimes), exec_run.cpp (buffers, placement, the node loop) and exec_comm.cpp
// (communication nodes).
#pragma once

#include <onnx/onnx_pb.h>

#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "hp/exec/executor.h"
#include "hp/plugin/hp_plugin.h"

namespace hp::exec {

/// A node ready to run: ABI attribute records whose strings and arrays live in `store_*`.
struct PreparedNode {
  std::string name, op_type, domain;
  std::int64_t opset = 0;
  std::vector<int> inputs, outputs;  ///< tensor ids; -1 for an omitted input / unused output
  std::vector<hp_op_attr> attrs;
  std::deque<std::string> store_strings;  ///< deques: element addresses stay valid while growing
  std::deque<std::vector<std::int64_t>> store_ints;
  std::deque<std::vector<double>> store_floats;
  std::deque<HostTensor> store_tensors;
  std::deque<hp_tensor_desc> store_descs;
  std::vector<int> release_after;  ///< tensor ids whose last reader is this node
  bool comm = false;               ///< an "hp"-domain node for CommOps
  CommNode comm_node;
  std::vector<std::int32_t> placed_dtypes;  ///< input dtypes of the last placement decision
  int placed_where = -1;                    ///< the backend slot chosen for them
  bool dead = false;                        ///< fused into a later node (exec_fuse.cpp): never runs
  int op_slot = 0;  ///< index of its op type in Impl::op_types (time accounting)
  /// Constant folding across runs. A `cached` node reads only weights and outputs of cached nodes
  /// (or, for Shape/Size, only its input's dims), so its outputs stay alive between runs and it
  /// reruns only when `memo` (its inputs' versions, or the dims a Shape node saw) differs from the
  /// last time.
  bool cached = false;
  bool memo_valid = false;
  std::vector<std::int64_t> memo;
};

/// One tensor's buffers: at most one replica per backend slot (0 = cpu, 1 = primary).
struct Slot {
  int dtype = -1;
  std::vector<std::int64_t> dims;
  std::size_t bytes = 0;
  void* ptr[2] = {nullptr, nullptr};
  bool live = false;
  bool persistent = false;    ///< a weight or a cached node's output: kept alive across runs
  std::uint64_t version = 0;  ///< bumped whenever a cached node rewrites it (memo keys)
};

/// Bytes a buffer of `bytes` takes from the pool and the backend (256-byte granules, 64 for empty).
inline std::size_t pool_size(std::size_t bytes) {
  return bytes == 0 ? 64 : (bytes + 255) / 256 * 256;
}

/// Offload state and schedule of an executor (exec_offload.cpp); null when offload is off.
struct OffloadState;

/// Size-keyed free lists per backend slot: freed buffers are reused by later allocations. Vectors,
/// not a multimap, so that once warm, releasing and reusing a buffer allocates nothing.
struct Pool {
  std::unordered_map<std::size_t, std::vector<void*>> free[2];
};

struct Executor::Impl {
  ExecOptions opts;
  plugin::Backend* be[2] = {nullptr, nullptr};  ///< [0] cpu, [1] primary (null when cpu is primary)
  hp_stream* stream[2] = {nullptr, nullptr};
  std::vector<std::string> tensor_names;
  std::map<std::string, int> tensor_ids;
  std::vector<GraphIO> inputs, outputs;
  std::vector<int> input_ids, output_ids;
  std::vector<std::pair<int, HostTensor>> weights;  ///< initializer id -> data
  std::deque<PreparedNode> nodes;  // deque: nodes never move (their attrs point into them)
  std::vector<Slot> slots;
  Pool pool;
  std::int64_t live_bytes = 0;
  ExecStats stats;
  bool weights_loaded = false;
  std::vector<std::string> op_types;  ///< distinct op types, indexed by PreparedNode::op_slot
  std::vector<OpTime> op_time;        ///< per op_slot, for the run in progress
  std::vector<std::int32_t> scratch_dtypes;  ///< reused per node (no heap traffic on the hot path)
  std::vector<hp_tensor_desc> scratch_inputs;
  std::vector<std::int64_t> scratch_key;
  std::vector<CommTensor> scratch_comm;     ///< a comm node's inputs (exec_comm.cpp)
  std::vector<char> scratch_given;          ///< which of them an output took over
  std::vector<unsigned char> comm_discard;  ///< where a comm node writes an output nobody reads

  std::shared_ptr<OffloadState> off;

  int id_of(const std::string& name);

  // exec_run.cpp
  /// A buffer from the pool or the backend; when the backend refuses (a device budget), the pool's
  /// cached buffers go back to it and the request is retried once. `id`: the tensor, for the error.
  Expected<void*> alloc(int where, std::size_t bytes, int id = -1);
  void release(int where, void* p, std::size_t bytes);
  void free_slot(int id);
  Status place(int id, int where);
  Status run_node(PreparedNode& n);
  /// Runs `n` unless it is cached and its memo is unchanged; true in *ran when it ran.
  Status run_or_reuse(PreparedNode& n, bool* ran);
  Status launch_on(PreparedNode& n, int where);
  int last_launch_allocated_ = 0;
  Status run_comm(PreparedNode& n);  ///< exec_comm.cpp
  /// Memory for comm node output k (the CommAlloc of run_comm): a donated input's buffer or the
  /// pool.
  Expected<void*> comm_output(PreparedNode& n, std::size_t k, int dtype,
                              std::span<const std::int64_t> dims, int reuse);
  Expected<HostTensor> to_host(int id);
  /// Frees every live tensor except the persistent ones (all of them when `all`).
  void drain(bool all = false);
  ~Impl();
};

// exec_offload.cpp: host-pool offload (offload_run.h), hooked into create and the run loop.
/// At the end of create: checks the configuration and keeps what planning needs.
Status offload_prepare(Executor::Impl& im, const model::Model& model);
/// True when weight `id` lives in the host pool (not loaded onto the device with the others).
bool offload_keeps_on_host(const Executor::Impl& im, int id);
/// After the inputs are loaded: (re)plans for these input shapes, resets the device peak.
Status offload_begin_run(Executor::Impl& im, const std::vector<HostTensor>& inputs);
/// Evictions and fetches the schedule issues before node k.
Status offload_before_node(Executor::Impl& im, std::size_t k);
/// Drops weights whose last reader was node k.
void offload_after_node(Executor::Impl& im, std::size_t k);
/// Frees what is still resident and records the run's figures.
void offload_end_run(Executor::Impl& im);
/// The primary device's peak allocation (mem_stats) into stats; resets it when `reset`.
void read_device_peak(Executor::Impl& im, bool reset);

/// Rewrites node chains into fused nodes the backend implements (exec_fuse.cpp); returns how many.
int fuse_nodes(Executor::Impl& im);

/// Converts a graph value's declared type into a GraphIO.
GraphIO graph_io_of(const onnx::ValueInfoProto& v);

}  // namespace hp::exec
