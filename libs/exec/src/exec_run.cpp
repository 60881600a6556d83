// Executor run: buffers, placement and the node loop.
//
// Buffers come from the backends' alloc through a pool: a released buffer is kept in a size-keyed
// free list and handed to the next request of the same rounded size on the same backend, so a
// steady state run allocates nothing. live_bytes counts buffers in use; its maximum is the reported
// peak.
//
// A node runs on the primary backend when that backend's supports_op accepts the node's actual
// input dtypes, else on the cpu backend. Inputs that live on the other backend are copied once
// (through host-visible cpu memory: D2H on the primary backend's stream, or H2D); the replica is
// kept until the tensor's last reader has run. Outputs are allocated when the plugin calls
// alloc_output, on the backend that runs the node. supports_op sees only dtypes, so a primary
// backend may still refuse a node once it sees the shapes (HP_UNSUPPORTED before allocating any
// output, e.g. a broadcast it lacks); the node then runs on the cpu backend instead.
//
// Persistent tensors (weights, outputs of cached nodes; exec_prepare.cpp) are loaded or computed
// once and stay alive across runs: the weights are not copied again each run, and a cached node
// reruns only when its memo changes (the versions of its inputs; for Shape/Size the dims of its
// input). A failed run forgets every memo, so the next run recomputes from scratch. Each node's
// wall time is added to its op type (ExecStats::by_op).
#include <fmt/core.h>

#include <chrono>
#include <cstring>

#include "exec_internal.h"

namespace hp::exec {

namespace {

std::size_t rounded(std::size_t bytes) { return pool_size(bytes); }

struct AllocCtx {
  Executor::Impl* impl;
  PreparedNode* node;
  int where;
  std::vector<int> temps;  ///< output slots used only for unused outputs
  int allocated = 0;       ///< outputs handed out so far
  Status error;
};

}  // namespace

Expected<void*> Executor::Impl::alloc(int where, std::size_t bytes, int id) {
  const std::size_t size = rounded(bytes);
  auto& fl = pool.free[where];
  auto it = fl.find(size);
  void* p = nullptr;
  if (it != fl.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
  } else {
    auto got = be[where]->alloc(0, size);
    if (!got) {
      // Under a device budget the pool's idle buffers count against it: hand them back and retry.
      for (auto& [sz, list] : fl)
        for (void* q : list) (void)be[where]->free_mem(0, q);
      fl.clear();
      got = be[where]->alloc(0, size);
    }
    if (!got) {
      Error e = std::move(got).error();
      const std::string name = id >= 0 && static_cast<std::size_t>(id) < tensor_names.size()
                                   ? tensor_names[static_cast<std::size_t>(id)]
                                   : "";
      e.what.message =
          fmt::format("cannot allocate {} bytes for {} on {}: {}", size,
                      name.empty() ? std::string("an unnamed output") : "tensor '" + name + "'",
                      be[where]->name(), e.what.message);
      if (e.what.hint.empty())
        e.what.hint =
            "the run needs more device memory than the budget: offload to the host pool ([offload] "
            "in the "
            "recipe, planned by 'hp offload-profile -o') or raise the budget";
      return e;
    }
    p = *got;
  }
  live_bytes += static_cast<std::int64_t>(size);
  stats.peak_bytes = std::max(stats.peak_bytes, live_bytes);
  return p;
}

void Executor::Impl::release(int where, void* p, std::size_t bytes) {
  if (!p) return;
  const std::size_t size = rounded(bytes);
  pool.free[where][size].push_back(p);
  live_bytes -= static_cast<std::int64_t>(size);
}

void Executor::Impl::free_slot(int id) {
  Slot& s = slots[static_cast<std::size_t>(id)];
  for (int w = 0; w < 2; ++w) {
    release(w, s.ptr[w], s.bytes);
    s.ptr[w] = nullptr;
  }
  s.seq.reset();
  s.live = false;
}

Status Executor::Impl::place(int id, int where) {
  Slot& s = slots[static_cast<std::size_t>(id)];
  if (!s.live)
    return Error(Errc::internal, fmt::format("tensor '{}' read before it was written",
                                             tensor_names[static_cast<std::size_t>(id)]));
  if (s.seq)
    return Error(Errc::runtime, fmt::format("'{}' is a sequence where a tensor is expected",
                                            tensor_names[static_cast<std::size_t>(id)]));
  if (s.ptr[where] || s.bytes == 0) return {};
  HP_ASSIGN_OR_RETURN(auto p, alloc(where, s.bytes, id));
  s.ptr[where] = p;
  ++stats.copies;
  // The other replica exists; copy through the backend that is not the cpu (slot 1).
  plugin::Backend* acc = be[1];
  hp_stream* st = stream[1];
  const hp_copy_dir dir = where == 1 ? HP_H2D : HP_D2H;
  HP_TRY(acc->copy_async(st, s.ptr[where], s.ptr[1 - where], s.bytes, dir));
  return acc->stream_sync(st);
}

namespace {

int32_t alloc_output(void* user, int32_t index, int32_t dtype, int32_t rank, const int64_t* dims,
                     hp_tensor_desc* out) {
  auto* c = static_cast<AllocCtx*>(user);
  Executor::Impl& im = *c->impl;
  if (index < 0 || static_cast<std::size_t>(index) >= c->node->outputs.size() || !out) return 0;
  const int esz = dtype_size(dtype);
  if (esz == 0 || rank < 0 || rank > HP_MAX_RANK) {
    c->error = Error(Errc::runtime,
                     fmt::format("backend asked for an output of dtype {} rank {}", dtype, rank),
                     c->node->name);
    return 0;
  }
  int id = c->node->outputs[static_cast<std::size_t>(index)];
  if (id < 0) {  // an output the model does not use: a temporary slot
    id = static_cast<int>(im.slots.size());
    im.slots.emplace_back();
    im.tensor_names.push_back("");
    c->temps.push_back(id);
  }
  Slot& s = im.slots[static_cast<std::size_t>(id)];
  if (s.live) im.free_slot(id);
  s.dtype = dtype;
  s.dims.assign(dims, dims + rank);
  std::int64_t n = 1;
  for (int k = 0; k < rank; ++k) n *= dims[k];
  s.bytes = static_cast<std::size_t>(n * esz);
  void* p = nullptr;
  if (index == 0 && c->node->donate_input0 && c->where == 0) {
    // The view's input dies here (PreparedNode::donate_input0): its cpu buffer changes hands and
    // the cpu kernel, seeing the same address, copies nothing. Its slot stays live without the
    // buffer until released after this node, so the pool's byte count is unchanged.
    Slot& from = im.slots[static_cast<std::size_t>(c->node->inputs[0])];
    if (from.live && !from.seq && from.ptr[0] && from.bytes == s.bytes && from.dtype == dtype) {
      p = from.ptr[0];
      from.ptr[0] = nullptr;
    }
  }
  if (!p) {
    auto got = im.alloc(c->where, s.bytes, id);
    if (!got) {
      c->error = std::move(got).error();
      return 0;
    }
    p = *got;
  }
  s.ptr[c->where] = p;
  s.live = true;
  ++c->allocated;
  out->dtype = dtype;
  out->rank = rank;
  for (int k = 0; k < rank; ++k) out->dims[k] = dims[k];
  out->data = p;
  return 1;
}

}  // namespace

Status Executor::Impl::run_node(PreparedNode& n) {
  if (n.comm) return run_comm(n);
  if (n.builtin != Builtin::none) return run_builtin(n);
  // Identity passes a sequence on as it is (shared: sequences are immutable).
  if (n.op_type == "Identity" && n.domain.empty() && n.inputs.size() == 1 && n.inputs[0] >= 0 &&
      slots[static_cast<std::size_t>(n.inputs[0])].seq) {
    set_seq(n.outputs[0], slots[static_cast<std::size_t>(n.inputs[0])].seq);
    ++stats.nodes;
    return {};
  }
  std::vector<int32_t>& dts = scratch_dtypes;
  dts.clear();
  for (int t : n.inputs) dts.push_back(t < 0 ? -1 : slots[static_cast<std::size_t>(t)].dtype);
  const char* dom = n.domain.c_str();
  int where = 0;
  // The placement depends on the input dtypes only: decided again only when they change.
  if (n.placed_where >= 0 && dts == n.placed_dtypes)
    where = n.placed_where;
  else if (be[1] && be[1]->supports_op(0, n.op_type.c_str(), dom, n.opset, dts))
    where = 1;
  else if (!be[0]->supports_op(0, n.op_type.c_str(), dom, n.opset, dts)) {
    std::string list;
    for (int32_t d : dts)
      list += (list.empty() ? "" : ", ") + (d < 0 ? std::string("-") : dtype_label(d));
    return Error(Errc::not_implemented,
                 fmt::format("op {} is not supported for input types ({})", n.op_type, list),
                 n.name.empty() ? n.op_type : n.name);
  }
  n.placed_dtypes = dts;
  n.placed_where = where;
  Status st = launch_on(n, where);
  // A backend may find out only when it sees the shapes that it lacks this form of the op
  // (HP_UNSUPPORTED before any output was allocated): the cpu backend then runs the node.
  if (!st.ok() && where == 1 && st.error().code == Errc::not_implemented &&
      last_launch_allocated_ == 0) {
    where = 0;
    n.placed_where = -1;  // shapes decided it: ask again next run
    st = launch_on(n, where);
  }
  if (!st.ok()) return st;
  if (be[1] && where == 0) ++stats.nodes_on_fallback;
  ++stats.nodes;
  return {};
}

Status Executor::Impl::launch_on(PreparedNode& n, int where) {
  const char* dom = n.domain.c_str();
  std::vector<hp_tensor_desc>& ins = scratch_inputs;
  ins.resize(n.inputs.size());
  for (std::size_t k = 0; k < n.inputs.size(); ++k) {
    hp_tensor_desc& d = ins[k];
    std::memset(&d, 0, sizeof d);
    d.dtype = -1;
    if (n.inputs[k] < 0) continue;
    HP_TRY(place(n.inputs[k], where));
    const Slot& s = slots[static_cast<std::size_t>(n.inputs[k])];
    d.dtype = s.dtype;
    d.rank = static_cast<std::int32_t>(s.dims.size());
    for (std::size_t j = 0; j < s.dims.size(); ++j) d.dims[j] = s.dims[j];
    d.data = s.ptr[where];
  }
  AllocCtx actx{this, &n, where, {}, 0, {}};
  hp_op_desc desc{};
  desc.struct_size = sizeof desc;
  desc.op_type = n.op_type.c_str();
  desc.domain = dom;
  desc.opset = n.opset;
  desc.node_name = n.name.c_str();
  if (n.weight_attr >= 0)  // a weight set_weight has changed is no longer packed (key 0)
    n.attrs[static_cast<std::size_t>(n.weight_attr)].i =
        slots[static_cast<std::size_t>(n.inputs[1])].weight_key;
  desc.attrs = n.attrs.data();
  desc.n_attrs = static_cast<std::int64_t>(n.attrs.size());
  desc.inputs = ins.data();
  desc.n_inputs = static_cast<std::int64_t>(ins.size());
  desc.n_outputs = static_cast<std::int64_t>(n.outputs.size());
  desc.alloc_output = alloc_output;
  desc.alloc_user = &actx;
  Status st = be[where]->run_op(stream[where], desc);
  last_launch_allocated_ = actx.allocated;
  for (int t : actx.temps) free_slot(t);
  if (!actx.error.ok()) return actx.error;
  if (!st.ok()) {
    Error e = std::move(st).error();
    // not_implemented (HP_UNSUPPORTED: an attribute value or op form the kernel lacks) stays as it
    // is.
    if (e.code == Errc::unavailable) e.code = Errc::runtime;
    if (e.what.where.empty()) e.what.where = n.name.empty() ? n.op_type : n.name;
    return e;
  }
  for (int t : n.outputs)
    if (t >= 0 && !slots[static_cast<std::size_t>(t)].live)
      return Error(Errc::runtime,
                   fmt::format("backend produced no tensor for output '{}'",
                               tensor_names[static_cast<std::size_t>(t)]),
                   n.name);
  return {};
}

Expected<HostTensor> Executor::Impl::to_host(int id) {
  HP_TRY(place(id, 0));
  const Slot& s = slots[static_cast<std::size_t>(id)];
  HostTensor h;
  h.name = tensor_names[static_cast<std::size_t>(id)];
  h.dtype = s.dtype;
  h.dims = s.dims;
  h.data.resize(s.bytes);
  if (s.bytes) {
    HP_TRY(be[0]->stream_sync(stream[0]));
    std::memcpy(h.data.data(), s.ptr[0], s.bytes);
  }
  return h;
}

void Executor::Impl::drain(bool all) {
  for (std::size_t id = 0; id < slots.size(); ++id)
    if (slots[id].live && (all || !slots[id].persistent)) free_slot(static_cast<int>(id));
}

Status Executor::Impl::run_or_reuse(PreparedNode& n, bool* ran) {
  *ran = false;
  if (!n.cached) {
    *ran = true;
    return run_node(n);
  }
  std::vector<std::int64_t>& key = scratch_key;
  key.clear();
  if (n.domain.empty() && (n.op_type == "Shape" || n.op_type == "Size")) {
    const int t = n.inputs.empty() ? -1 : n.inputs[0];
    if (t >= 0) {
      const Slot& s = slots[static_cast<std::size_t>(t)];
      key.push_back(s.live ? static_cast<std::int64_t>(s.dims.size()) : -1);
      key.insert(key.end(), s.dims.begin(), s.dims.end());
    }
  } else {
    for (int t : n.inputs)
      key.push_back(t < 0 ? -1
                          : static_cast<std::int64_t>(slots[static_cast<std::size_t>(t)].version));
  }
  bool outputs_live = true;
  for (int t : n.outputs)
    if (t >= 0 && !slots[static_cast<std::size_t>(t)].live) outputs_live = false;
  if (n.memo_valid && outputs_live && key == n.memo) return {};
  n.memo_valid = false;
  *ran = true;
  HP_TRY(run_node(n));
  for (int t : n.outputs)
    if (t >= 0) ++slots[static_cast<std::size_t>(t)].version;
  n.memo.assign(key.begin(), key.end());
  n.memo_valid = true;
  return {};
}

Executor::Impl::~Impl() {
  drain(true);
  for (int w = 0; w < 2; ++w) {
    if (!be[w]) continue;
    for (auto& [size, list] : pool.free[w])
      for (void* p : list) (void)be[w]->free_mem(0, p);
    if (stream[w]) (void)be[w]->stream_destroy(stream[w]);
  }
}
Error Executor::Impl::fail_run(Error e) {
  drain();
  for (PreparedNode& n : nodes) n.memo_valid = false;
  return e;
}

Status Executor::Impl::run_graph(std::size_t n_inputs,
                                 const std::function<Status(std::size_t, int)>& load_input) {
  run_started = std::chrono::steady_clock::now();
  stats.nodes = stats.nodes_on_fallback = stats.copies = stats.nodes_cached = 0;
  stats.by_op.clear();
  if (n_inputs != input_ids.size())
    return Error(Errc::bad_input,
                 fmt::format("the graph has {} inputs, {} were given", input_ids.size(), n_inputs));
  if (!weights_loaded) {
    for (auto& [id, h] : weights)
      if (offload_keeps_on_host(*this, id) || gathered_weight(*this, id))
        continue;  // copied in before its readers (exec_offload.cpp, exec_gather.cpp)
      else if (Status st = load_tensor(id, h); !st)
        return fail_run(std::move(st).error());
    weights_loaded = true;
    // The slots hold the weights from now on; the decoded copies would only double the memory.
    for (auto& w : weights)
      if (!offload_keeps_on_host(*this, w.first)) std::vector<unsigned char>().swap(w.second.data);
  }
  // Persistent tensors from earlier runs count towards this run's peak from the start.
  live_bytes = 0;
  for (const Slot& s : slots)
    if (s.live)
      for (void* p : s.ptr)
        if (p) live_bytes += static_cast<std::int64_t>(rounded(s.bytes));
  stats.peak_bytes = live_bytes;
  read_device_peak(*this, true);
  for (std::size_t k = 0; k < n_inputs; ++k)
    if (Status st = load_input(k, input_ids[k]); !st) return fail_run(std::move(st).error());
  if (off) {  // offload plans for the inputs' dims (data not needed)
    std::vector<HostTensor> shapes(n_inputs);
    for (std::size_t k = 0; k < n_inputs; ++k)
      shapes[k].dims = slots[static_cast<std::size_t>(input_ids[k])].dims;
    if (Status st = offload_begin_run(*this, shapes); !st) return fail_run(std::move(st).error());
  } else {
    stats.offload_fetches = stats.offload_evictions = stats.offload_bytes = 0;
  }
  op_time.assign(op_types.size(), OpTime{});
  stats.timeline.clear();
  gather_begin_run(*this);
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    PreparedNode& n = nodes[k];
    if (n.dead) continue;
    if (Status st = offload_before_node(*this, k); !st) return fail_run(std::move(st).error());
    if (Status st = gather_before_node(*this, k); !st) return fail_run(std::move(st).error());
    const auto s0 = std::chrono::steady_clock::now();
    bool ran = false;
    if (Status st = run_or_reuse(n, &ran); !st) return fail_run(std::move(st).error());
    if (ran) {
      OpTime& ot = op_time[static_cast<std::size_t>(n.op_slot)];
      const auto s1 = std::chrono::steady_clock::now();
      ++ot.nodes;
      ot.seconds += std::chrono::duration<double>(s1 - s0).count();
      if (opts.profile) {
        const std::string& op = op_types[static_cast<std::size_t>(n.op_slot)];
        stats.timeline.push_back(
            {n.name.empty() ? op + " #" + std::to_string(k) : n.name, op, s0, s1});
      }
    } else {
      ++stats.nodes_cached;
    }
    if (!early_outputs.empty())  // run() with an output hook: hand over what is final now
      for (int t : n.outputs)
        if (auto it = hooked_outputs.find(t); it != hooked_outputs.end()) {
          auto h = to_host(t);
          if (!h) return fail_run(std::move(h).error());
          for (std::size_t j = 0; j < it->second.size(); ++j) {
            const std::size_t idx = it->second[j];
            if (j + 1 < it->second.size())
              early_outputs[idx] = *h;  // one tensor named by several outputs: a copy each
            else
              early_outputs[idx] = std::move(*h);
            output_hook(idx, *early_outputs[idx]);
          }
        }
    for (int t : n.release_after) free_slot(t);
    if (!early_outputs.empty())  // handed over: run() returns the hook's copy
      for (int t : n.release_hooked) free_slot(t);
    offload_after_node(*this, k);
    gather_after_node(*this, k);
  }
  for (std::size_t k = 0; k < op_types.size(); ++k)
    if (op_time[k].nodes) stats.by_op[op_types[k]] = op_time[k];
  return {};
}

void Executor::Impl::end_run() {
  drain();
  offload_end_run(*this);
  read_device_peak(*this, false);
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - run_started).count();
}
}  // namespace hp::exec

namespace hp::exec {

double comm_seconds(const ExecStats& stats) {
  double s = 0;
  for (const auto& [op, t] : stats.by_op)
    // "hp.AllReduce": the comm layer's ops (domain "hp"; not "hp.train.SoftmaxGrad").
    if (op.rfind("hp.", 0) == 0 && op.find('.', 3) == std::string::npos) s += t.seconds;
  return s;
}

}  // namespace hp::exec
