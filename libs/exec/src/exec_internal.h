// Private state of the executor, shared by exec_prepare.cpp (ordering, op checks, attributes,
// initializers, lifetimes), exec_run.cpp (buffers, placement, the node loop) and exec_comm.cpp
// (communication nodes).
#pragma once

#include <onnx/onnx_pb.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "hp/exec/executor.h"
#include "hp/plugin/hp_plugin.h"

namespace hp::exec {

struct Body;

/// Ops the executor runs itself rather than a backend (exec_control.cpp, exec_sequence.cpp): the
/// control-flow ops, whose subgraphs reuse the executor's node dispatch, and the sequence ops,
/// whose values (SeqValue) no backend kernel sees. docs/executor.md describes both.
enum class Builtin {
  none,
  If,
  Loop,
  Scan,
  SequenceEmpty,
  SequenceConstruct,
  SequenceInsert,
  SequenceAt,
  SequenceErase,
  SequenceLength,
  SplitToSequence,
  ConcatFromSequence,
  SequenceMap,
};

/// The Builtin of an ai.onnx op type ("" or "ai.onnx" domain), Builtin::none for the others.
Builtin builtin_of(const std::string& domain, const std::string& op_type);

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
  /// Graph outputs run() hands to the output hook: released after this node (their producer or
  /// last reader) when run() has a hook, since the hook's copy is what run() returns.
  std::vector<int> release_hooked;
  bool comm = false;  ///< an "hp"-domain node for CommOps
  CommNode comm_node;
  std::vector<std::int32_t> placed_dtypes;  ///< input dtypes of the last placement decision
  int placed_where = -1;                    ///< the backend slot chosen for them
  bool dead = false;                        ///< fused into a later node (exec_fuse.cpp): never runs
  /// A view op (Reshape, Flatten, Squeeze, Unsqueeze, Identity) that is its data input's last
  /// reader: on the cpu backend its output takes that input's buffer (exec_run.cpp alloc_output).
  bool donate_input0 = false;
  /// Index in `attrs` of hp_weight_b (a constant B's or filter's key, refreshed from
  /// Slot::weight_key before each launch), -1 for none.
  int weight_attr = -1;
  int op_slot = 0;  ///< index of its op type in Impl::op_types (time accounting)
  /// Constant folding across runs. A `cached` node reads only weights and outputs of cached nodes
  /// (or, for Shape/Size, only its input's dims), so its outputs stay alive between runs and it
  /// reruns only when `memo` (its inputs' versions, or the dims a Shape node saw) differs from the
  /// last time.
  bool cached = false;
  bool memo_valid = false;
  std::vector<std::int64_t> memo;
  Builtin builtin = Builtin::none;
  /// The node's subgraphs: If: then_branch, else_branch; Loop, Scan, SequenceMap: body.
  std::vector<std::shared_ptr<Body>> bodies;
  /// Tensor ids of the enclosing scopes that the subgraphs read: they count as inputs of this node
  /// for ordering and lifetimes, so they are alive until it has run.
  std::vector<int> captured;
};

/// A prepared subgraph (exec_subgraph.cpp). Its tensors have ids in the executor's one tensor table
/// (names are resolved in the subgraph first, then outwards), so its nodes run through the same
/// run_node as the main graph's and read outer values directly.
struct Body {
  std::string name;
  std::deque<PreparedNode> nodes;  ///< in a valid order; release_after covers only its own tensors
  std::vector<int> inputs, outputs;  ///< the subgraph's formal inputs and outputs
  std::vector<GraphIO> input_io, output_io;
  std::vector<int> locals;     ///< ids defined here (inputs, node outputs): cleared after a run
  std::vector<char> is_local;  ///< by tensor id (sized when the subgraph was prepared)
  bool local(int id) const {
    return id >= 0 && static_cast<std::size_t>(id) < is_local.size() &&
           is_local[static_cast<std::size_t>(id)];
  }
};

/// A sequence value (ONNX seq(tensor)): immutable once built, so copying one between slots shares
/// it. The elements live in host memory; a SequenceAt copies one into a pool buffer.
struct SeqValue {
  int elem_dtype = -1;  ///< hp_dtype of the elements (-1: unknown, e.g. an empty sequence)
  std::vector<std::shared_ptr<const HostTensor>> items;
};

/// One tensor's buffers: at most one replica per backend slot (0 = cpu, 1 = primary).
struct Slot {
  int dtype = -1;
  std::vector<std::int64_t> dims;
  std::size_t bytes = 0;
  void* ptr[2] = {nullptr, nullptr};
  bool live = false;
  std::shared_ptr<const SeqValue> seq;  ///< set when the value is a sequence (no buffers then)
  bool persistent = false;    ///< a weight or a cached node's output: kept alive across runs
  std::uint64_t version = 0;  ///< bumped whenever a cached node rewrites it (memo keys)
  /// A weight read as a MatMul/Gemm B or a convolution's filter: a process-wide unique key under
  /// which the backend may keep it packed; 0 once set_weight has changed it (tag_constant_weights,
  /// exec_fuse.cpp). The backend keeps the copies it made under an older key.
  std::int64_t weight_key = 0;
};

/// Bytes a buffer of `bytes` takes from the pool and the backend (256-byte granules, 64 for empty).
inline std::size_t pool_size(std::size_t bytes) {
  return bytes == 0 ? 64 : (bytes + 255) / 256 * 256;
}

/// Offload state and schedule of an executor (exec_offload.cpp); null when offload is off.
struct OffloadState;
/// Weights lent by a WeightSource and their uses (exec_gather.cpp); null without a source.
struct GatherState;

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
  Executor::OutputHook output_hook;
  /// With output_hook: the output indices of each tensor id (most have none), and the copies made
  /// for the hook during a run, which run() returns.
  std::map<int, std::vector<std::size_t>> hooked_outputs;
  std::vector<std::optional<HostTensor>> early_outputs;
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
  std::vector<CommTensor> scratch_comm;  ///< a comm node's inputs (exec_comm.cpp)
  std::vector<char> scratch_given;       ///< which of them an output took over
  /// Where a comm node writes an output nobody reads, per output index.
  std::vector<std::vector<unsigned char>> comm_discard;

  std::shared_ptr<OffloadState> off;
  std::shared_ptr<GatherState> gather;

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
  /// Puts a host tensor into slot `id` on the cpu backend.
  Status load_tensor(int id, const HostTensor& h);

  // exec_control.cpp, exec_sequence.cpp: the builtins.
  Status run_builtin(PreparedNode& n);
  /// Runs a subgraph's nodes once; its outputs stay alive until clear_body.
  Status run_body(Body& b);
  /// Frees whatever the subgraph still holds of its own tensors.
  void clear_body(Body& b);
  /// The contents of slot `id` detached from it: its buffers themselves when `steal` (the slot is
  /// then empty), else a fresh cpu copy (a sequence is shared either way).
  Expected<Slot> take(int id, bool steal);
  /// Installs detached contents into slot `id` (freeing what it held); -1 drops them.
  void put(int id, Slot&& s);
  void drop(Slot& s);
  /// Value of a scalar (bool, i32 or i64) tensor.
  Expected<std::int64_t> read_int(int id, const char* what, const PreparedNode& n);
  Status run_if(PreparedNode& n);
  Status run_loop(PreparedNode& n);
  Status run_scan(PreparedNode& n);
  Status run_sequence(PreparedNode& n);
  Status run_sequence_map(PreparedNode& n);
  Expected<const SeqValue*> seq_of(int id, const PreparedNode& n);
  /// Makes slot `id` hold the sequence `v` (-1: nothing).
  void set_seq(int id, std::shared_ptr<const SeqValue> v);

  /// One run of the main graph up to its outputs: weights, inputs (`load_input(k, id)`), nodes.
  /// On failure the run's state is dropped (fail_run) and the error returned.
  Status run_graph(std::size_t n_inputs, const std::function<Status(std::size_t, int)>& load_input);
  /// After the outputs were read: frees the run's tensors, records its figures.
  void end_run();
  /// Drops a failed run's state (every memo too) and returns `e`.
  Error fail_run(Error e);
  std::chrono::steady_clock::time_point run_started;
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

/// Which nodes are cached (constant-folded across runs), which tensors persist between runs and
/// which node releases each of the others (exec_prepare.cpp). Rerun by set_weight_source, whose
/// weights stop being persistent.
void plan_lifetimes(Executor::Impl& im);
/// The release_hooked lists for the output hook set now (exec_prepare.cpp).
void plan_hooked_release(Executor::Impl& im);

/// Initializer `name`: its tensor id and decoded host copy, {-1, nullptr} when the model has no
/// initializer of that name (exec_weights.cpp).
std::pair<int, HostTensor*> find_weight(Executor::Impl& im, const std::string& name);

// exec_gather.cpp: weights lent by a WeightSource (Executor::set_weight_source).
/// True when weight `id` comes from the weight source (not loaded with the others).
bool gathered_weight(const Executor::Impl& im, int id);
/// At the start of a run: asks the source for the first use's group.
void gather_begin_run(Executor::Impl& im);
/// Fetches the groups whose use begins at node k, and asks for the next use's.
Status gather_before_node(Executor::Impl& im, std::size_t k);
/// Frees the groups whose use ended with node k.
void gather_after_node(Executor::Impl& im, std::size_t k);

/// Rewrites node chains into fused nodes the backend implements (exec_fuse.cpp); returns how many.
int fuse_nodes(Executor::Impl& im);
/// Attributes the rewrites give a node, their data in the node's own storage (exec_fuse.cpp):
/// a string (added, or replaced when present), an int (added; returns its index in `attrs`), a
/// float and ints (added).
void set_string_attr(PreparedNode& n, const char* name, const std::string& value);
int add_int_attr(PreparedNode& n, const char* name, std::int64_t value);
void add_float_attr(PreparedNode& n, const char* name, double value);
void add_ints_attr(PreparedNode& n, const char* name, std::vector<std::int64_t> values);
/// Keeps tensors between 2-D convolutions channels-last (exec_layout.cpp); returns the convolutions
/// rewritten. Runs after fuse_nodes.
int keep_channels_last(Executor::Impl& im);
/// Names each weight that a MatMul, Gemm or hp.nn.MatMulAdd reads as B with a unique key (the
/// node attribute hp_weight_b) so that the backend packs it once (exec_fuse.cpp). Needs the slots.
void tag_constant_weights(Executor::Impl& im);

/// Prepares the subgraphs of `np` (graph attributes) into `n.bodies` and `n.captured`; unsupported
/// nodes inside them are appended to `unsupported` (exec_subgraph.cpp).
struct Scope;
Status prepare_bodies(Executor::Impl& im, const onnx::NodeProto& np, PreparedNode& n,
                      const Scope& scope, const model::Model& model,
                      std::vector<Diagnostic>& unsupported);
/// Names `g` reads from enclosing scopes (its nodes' inputs and its outputs, nested subgraphs
/// included, minus what it defines itself).
std::set<std::string> free_names(const onnx::GraphProto& g);
/// Names the node reads: its inputs and the free names of its subgraphs.
std::vector<std::string> node_reads(const onnx::NodeProto& np);

/// Name resolution while preparing: the main graph resolves through Impl::tensor_ids, a subgraph
/// through its own names first and then its parent's.
struct Scope {
  const Scope* parent = nullptr;
  bool main = false;                 ///< the main graph: names are Impl::tensor_ids
  std::map<std::string, int> names;  ///< unused for the main graph
  /// The tensor id of `name` visible here, or -1.
  int lookup(const Executor::Impl& im, const std::string& name) const;
};

/// Shared by the main graph and subgraphs: the ordered, prepared nodes of `g` (exec_prepare.cpp).
/// `resolve(name)` gives the id of a tensor that is read; `define(name)` the id of one written.
Status prepare_nodes(Executor::Impl& im, const onnx::GraphProto& g, const model::Model& model,
                     const Scope& scope, std::deque<PreparedNode>& out,
                     std::vector<Diagnostic>& unsupported,
                     const std::function<int(const std::string&)>& resolve,
                     const std::function<int(const std::string&)>& define);

/// A node attribute for the builtins: an int (or `dflt`), an int list (empty when absent).
std::int64_t attr_int(const PreparedNode& n, const char* name, std::int64_t dflt);
std::vector<std::int64_t> attr_ints(const PreparedNode& n, const char* name);

// Host-tensor data movement shared by Scan, Loop and the sequence ops (exec_sequence.cpp).
/// `t` at `index` of `axis`, that axis removed.
HostTensor slice_axis(const HostTensor& t, int axis, std::int64_t index);
/// `t`'s indices [start, start + len) of `axis`, the axis kept.
HostTensor narrow_axis(const HostTensor& t, int axis, std::int64_t start, std::int64_t len);
/// `items` joined along `axis` (an existing axis, or a new one inserted there when `stack`). They
/// must agree in dtype and in every other dim; Errc::runtime naming `where` otherwise.
Expected<HostTensor> join_axis(const std::vector<const HostTensor*>& items, int axis, bool stack,
                               const std::string& where);

/// An empty scan output of Loop or Scan: no iteration ran, so its shape comes from the body's
/// declaration, [0] plus the element dims when they are static (exec_values.cpp).
HostTensor empty_scan_output(const GraphIO& io);

/// Converts a graph value's declared type into a GraphIO.
GraphIO graph_io_of(const onnx::ValueInfoProto& v);

}  // namespace hp::exec
