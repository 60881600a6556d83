// The executor: runs an ONNX graph node by node on backend plugins.
//
// Preparation (Executor::create) does everything that can fail before any work starts: it orders
// the nodes topologically, asks the backends which ops they support and lists *every* unsupported
// op with its node name in one error, converts attributes to the plugin ABI's hp_op_attr form once,
// loads the initializers (external data included) and plans lifetimes: each tensor's last reader is
// known, so its buffer goes back to a per-backend pool right after that node, and later allocations
// of the same size reuse it (no allocator traffic on the hot path once the pool is warm). The peak
// of live bytes is reported.
//
// Placement: every node runs on the primary backend when its supports_op says yes for the node's
// input dtypes, otherwise on the cpu backend (always loaded, the reference). A tensor needed on the
// other backend is copied there once and the copy lives as long as the tensor.
//
// A rank's partition (hp shard) also holds communication nodes of the "hp" domain (hp.AllReduce,
// hp.AllGather, hp.ReduceScatter, hp.AllToAll, hp.Send, hp.Recv). The executor does not know MPI:
// it hands those nodes to a CommOps implementation given in ExecOptions. Without one, such nodes
// are reported as unsupported before the run.
//
// Control flow (If, Loop, Scan, SequenceMap) and the sequence ops run in the executor itself: a
// subgraph is prepared with the main graph into a body whose nodes go through the same dispatch,
// and a slot may hold a sequence of tensors besides a tensor (docs/executor.md).
//
// With ExecOptions::offload (offload_run.h) the weights, and optionally activations, live in a host
// pool and are copied onto the device ahead of the nodes that read them, on a schedule planned for
// the device budget (exec_offload.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/offload.h"
#include "hp/exec/tensor.h"
#include "hp/exec/weight_source.h"
#include "hp/model/model.h"
#include "hp/plugin/backend.h"

namespace hp::exec {

/// One "hp"-domain communication node as the comm layer sees it.
struct CommNode {
  std::string name;
  std::string op_type;  ///< "AllReduce", "Send", ...
  std::vector<std::string> inputs, outputs;
  /// Attributes as text (hp_domain.h): strings as is, ints in decimal, int lists comma-separated.
  std::vector<std::pair<std::string, std::string>> attrs;
};

/// A tensor handed to the comm layer where it lies: host memory owned by the caller, not copied.
struct CommTensor {
  int dtype = -1;  ///< hp_dtype
  std::span<const std::int64_t> dims;
  const void* data = nullptr;
  std::size_t bytes = 0;
  /// The caller does not read it after this node (its last reader; not a weight or a graph output):
  /// an output of the same size may take over its memory, so an AllReduce runs in place.
  bool donatable = false;
  std::int64_t numel() const;
};

/// Memory for a node's output `k` of `dtype` and `dims` (numel * dtype_size bytes, contents
/// undefined). The executor hands out buffers of its pool, which are reused from step to step: MPI
/// on memory it has touched before is many times faster than on fresh pages (tests/bench/comm).
/// `reuse_input` >= 0 asks for that donatable input's memory instead (same byte size); the layer
/// compares the pointer it gets with the input's to know whether it works in place.
using CommAlloc = std::function<Expected<void*>(
    std::size_t k, int dtype, std::span<const std::int64_t> dims, int reuse_input)>;

/// The seam to the communication layer: implemented over MPI by the comm layer (libs/comm), by
/// fakes in tests. Tensors are on the host for now; device-resident collectives come with the comm
/// layer.
class CommOps {
 public:
  virtual ~CommOps() = default;
  /// True when this layer runs `op_type` of the "hp" domain.
  virtual bool handles(const std::string& op_type) const = 0;
  /// Runs one node: `inputs` in node input order; fills `outputs` (one per node output).
  virtual Status run(const CommNode& node, const std::vector<const HostTensor*>& inputs,
                     std::vector<HostTensor>& outputs) = 0;
  /// What the executor calls: inputs read in place, outputs written straight into memory from
  /// `alloc`, so a collective costs what the transport costs. The default copies into HostTensors
  /// and calls run() (enough for fakes); the MPI comm layer overrides it.
  virtual Status run_into(const CommNode& node, const std::vector<CommTensor>& inputs,
                          const CommAlloc& alloc);
};

struct ExecOptions {
  std::shared_ptr<plugin::Backend> backend;  ///< primary backend (nullptr: the cpu backend)
  std::shared_ptr<plugin::Backend>
      cpu;                  ///< the cpu backend: fallback for unsupported ops; required
  CommOps* comm = nullptr;  ///< runs "hp"-domain nodes; not owned
  OffloadConfig offload{};  ///< host-pool offload under a device budget (offload_run.h)
  /// Record every node's start and end in ExecStats::timeline (`hp launch --profile/--trace`).
  bool profile = false;
  /// Let the backend keep constant weights in its kernels' layout (MatMul/Gemm B operands, packed
  /// once, and 3x3 filters' Winograd transforms: exec_fuse.cpp tag_constant_weights). Off where
  /// every step rewrites the weights (training): a packed copy would only cost memory. set_weight
  /// stops it for that weight.
  bool pack_weights = true;
};

/// A declared graph input or output.
struct GraphIO {
  std::string name;
  int dtype = -1;  ///< hp_dtype; -1 when undeclared or not runnable
  std::int32_t onnx_type = 0;
  std::vector<std::int64_t> dims;  ///< -1 for a symbolic or unknown dim
  bool has_shape = false;
  /// A sequence of tensors (seq(tensor)): dtype, onnx_type and dims are then its elements'.
  bool sequence = false;
};

struct ExecStats;
/// Seconds of `stats`' last run spent in "hp"-domain (communication) nodes.
double comm_seconds(const ExecStats& stats);

/// Time spent in one op type during the last run.
struct OpTime {
  int nodes = 0;       ///< nodes of this type that ran
  double seconds = 0;  ///< wall time in their kernels (copies to their backend included)
};

/// One node's run, when ExecOptions::profile is set: kernel time, copies to its backend included.
struct NodeSpan {
  std::string node;  ///< the ONNX node name, or "<op type> #<index>" for an unnamed one
  std::string op;    ///< as in ExecStats::by_op
  std::chrono::steady_clock::time_point start, end;
};

/// Figures of the last run.
struct ExecStats {
  std::int64_t peak_bytes = 0;    ///< most bytes of tensors alive at once (weights included)
  std::int64_t weight_bytes = 0;  ///< initializers
  int nodes = 0;
  int nodes_on_fallback = 0;  ///< nodes run on the cpu backend while another was primary
  int copies = 0;             ///< tensors copied between backends
  int nodes_cached = 0;  ///< constant-input nodes not rerun: their outputs are kept from before
  double seconds = 0;
  std::map<std::string, OpTime>
      by_op;  ///< per op type ("MatMul", "hp.AllReduce"): where the time went
  /// Most device bytes the primary backend had allocated during the run, as it counts them (ABI 1.3
  /// mem_stats: the executor's buffer pool included); -1 when the backend does not report it.
  std::int64_t device_peak = -1;
  // Offload (ExecOptions::offload): the planned peak and the copies of the last run.
  std::int64_t offload_planned_peak = 0;
  std::int64_t offload_fetches = 0, offload_evictions = 0;
  std::int64_t offload_bytes = 0;  ///< bytes copied between the host pool and the device
  std::vector<NodeSpan> timeline;  ///< ExecOptions::profile: the nodes that ran, in order
  /// Groups fetched from the weight source in the last run (Executor::set_weight_source).
  std::int64_t gathers = 0;
};

class Executor {
 public:
  /// Prepares `model` (loaded with LoadMode::require_data) for execution; see the file comment.
  /// Errors: Errc::bad_input listing every unsupported op (node names in `where`), or a weight
  /// whose data is missing or malformed.
  static Expected<std::unique_ptr<Executor>> create(const model::Model& model,
                                                    const ExecOptions& options);
  ~Executor();

  const std::vector<GraphIO>& inputs() const;
  const std::vector<GraphIO>& outputs() const;

  /// Called by run() with each graph output (its index, a host copy) as soon as the node computing
  /// it has finished, before the rest of the graph runs: a data-parallel trainer starts reducing a
  /// gradient while the backward goes on (hp/train/data_parallel.h). The call is on the running
  /// thread, so a hook that does more than hand the tensor over delays the run. run() then returns
  /// those same copies, and the executor frees its own buffer of each as soon as no node reads it
  /// any more (a backward's gradients leave the pool one by one). Empty = none.
  using OutputHook = std::function<void(std::size_t output_index, const HostTensor& value)>;
  void set_output_hook(OutputHook hook);

  /// Runs the graph on `inputs` (graph input order, already checked by bind_inputs or the caller).
  /// Returns the outputs in graph output order, named after the graph outputs.
  /// Errc::bad_input when a graph input is a sequence; Errc::runtime when an output is one.
  Expected<std::vector<HostTensor>> run(const std::vector<HostTensor>& inputs);
  /// As run(), for graphs whose inputs or outputs may be sequences.
  Expected<std::vector<HostValue>> run_values(const std::vector<HostValue>& inputs);
  const ExecStats& stats() const;

  /// Replaces the value of initializer `name` (training writes the updated weights back after each
  /// step). Same dtype and dims as the initializer; nodes computed from it (transposes of the
  /// weight the executor caches across runs) rerun in the next run. Errc::bad_input for an unknown
  /// name or a mismatched value.
  Status set_weight(const std::string& name, const HostTensor& value);
  /// The current value of initializer `name` (a host copy). Errc::bad_input for an unknown name.
  Expected<HostTensor> weight(const std::string& name);
  /// The executor's own storage of float32 initializer `name`, when the caller may write it in
  /// place: after the first run, on the cpu backend (host memory), not kept by offload. Null
  /// otherwise (unknown name included): use set_weight. Valid until set_weight replaces the weight
  /// or the executor goes. Whoever writes it calls weight_written(name) before the next run.
  float* host_weight(const std::string& name);
  /// Tells the executor that `name`'s value changed in place (host_weight): nodes cached from it
  /// rerun, and the backend never uses a packed copy of it again. Errc::bad_input for an unknown
  /// name.
  Status weight_written(const std::string& name);

  /// Lends the weights of `groups` (float32 initializers) to `source` (not owned; it outlives the
  /// runs). From then on the executor holds each group only during its uses: a use is a run of
  /// nodes reading the group with no long gap between them, typically one in the forward and one
  /// in the backward of a layer. The group is fetched as its use begins, the next use's is asked
  /// for at the same time (one use ahead), and it is freed when its use ends (exec_gather.cpp).
  /// The executor's own copies go at once; set_weight, weight and host_weight refuse these names.
  /// Before the first run only. Errc::bad_input for an unknown or non-float32 initializer, one in
  /// two groups or a graph output, a second source, or after a run; Errc::not_implemented with
  /// offload.
  Status set_weight_source(WeightSource* source, std::vector<std::vector<std::string>> groups);
  /// The groups a run asks the weight source for, in order (one per use): collectives behind the
  /// source must see the same sequence on every member, which a caller can check with this.
  std::vector<std::size_t> weight_source_order() const;

  struct Impl;

 private:
  explicit Executor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// True for the ops the executor runs itself rather than a backend plugin: If, Loop, Scan and the
/// sequence ops (docs/executor.md).
bool is_executor_op(std::string_view domain, std::string_view op_type);

/// A model's declared graph inputs (initializers left out: older exporters list them as inputs) and
/// outputs, as the executor would bind them, without preparing it.
struct ModelIO {
  std::vector<GraphIO> inputs, outputs;
};
ModelIO model_io(const model::Model& m);

/// Orders `given` (tensors read from input_K.pb) as the graph inputs and checks them: a tensor
/// named after a graph input binds to it, an unnamed one binds by position; a name the graph lacks,
/// a missing input, a wrong dtype or a shape that contradicts the declared dims is Errc::bad_input,
/// with `where` = `source/input_K.pb`.
Expected<std::vector<HostTensor>> bind_inputs(const std::vector<GraphIO>& graph_inputs,
                                              std::vector<HostTensor> given,
                                              const std::string& source);

}  // namespace hp::exec
