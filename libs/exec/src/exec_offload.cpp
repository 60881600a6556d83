// Host-pool offload in the executor (offload_run.h): the trace of the run, the schedule, and its
// replay around every node.
//
// The trace needs every tensor's size before the run, which the executor only learns as nodes run;
// so at the first run (and again when the input shapes change) the model's graph is built at the
// dims the inputs bind (model::build_graph: ONNX shape inference plus the exporter's shape
// arithmetic) and each executor tensor is sized from it, rounded as the buffer pool rounds.
// Lifetimes are the executor's own: a tensor lives from its producer to its last reader; graph
// outputs to the end; weights and cached-node outputs (persistent) for the whole run. The schedule
// is then hp::offload::plan_node_offload over the executor's node order.
//
// Replay: before node k, the schedule's evictions (a D2H write-back into the tensor's host copy
// first when it is dirty) and fetches (H2D from the weight's decoded data or the activation's host
// copy); after node k, tracked weights whose last reader it was are freed. A tensor the node reads
// that is still on the host (the plan's sizes were off) is fetched on demand, so a wrong estimate
// costs memory, which the backend's budget then reports, never a wrong result.
#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "exec_internal.h"
#include "hp/core/units.h"
#include "hp/model/graph.h"
#include "hp/offload/node_schedule.h"

namespace hp::exec {

struct OffloadState {
  OffloadConfig cfg;
  model::Model model;  ///< for sizes at the bound dims
  double budget = 0;
  int dev = 0;  ///< backend slot of the device memory: 1 when an accelerator is primary
  std::vector<bool> weight_on_host;       ///< by tensor id
  std::vector<std::int64_t> planned_for;  ///< the input dims the schedule is for
  bool planned = false;
  offload::NodeTrace trace;
  offload::NodeSchedule sched;
  std::vector<int> ids;      ///< trace tensor -> executor tensor id
  std::vector<int> tracked;  ///< executor tensor id -> trace tensor, -1 when not tracked
  std::vector<std::vector<unsigned char>> host;  ///< activations' host copies, by trace tensor
  /// Per node: tensors the executor keeps across runs that offload frees after this, their last
  /// reader (tracked weights; outputs of cached nodes, which then recompute next run)
  std::vector<std::vector<int>> free_after;
  std::vector<const HostTensor*> weight_data;  ///< by tensor id: a weight's decoded data
};

namespace {

/// The host copy of trace tensor `t`: a weight's decoded data or an activation's written-back copy.
const unsigned char* host_copy(const OffloadState& o, std::size_t t) {
  const int id = o.ids[t];
  if (const HostTensor* w = o.weight_data[static_cast<std::size_t>(id)]) return w->data.data();
  return o.host[t].data();
}

Status fetch(Executor::Impl& im, std::size_t t) {
  OffloadState& o = *im.off;
  const int id = o.ids[t];
  Slot& s = im.slots[static_cast<std::size_t>(id)];
  if (s.live && s.ptr[o.dev]) return {};
  HP_ASSIGN_OR_RETURN(auto p, im.alloc(o.dev, s.bytes, id));
  s.ptr[o.dev] = p;
  s.live = true;
  if (s.bytes) {
    HP_TRY(im.be[o.dev]->copy_async(im.stream[o.dev], p, host_copy(o, t), s.bytes, HP_H2D));
    HP_TRY(im.be[o.dev]->stream_sync(im.stream[o.dev]));
  }
  ++im.stats.offload_fetches;
  im.stats.offload_bytes += static_cast<std::int64_t>(s.bytes);
  return {};
}

Status evict(Executor::Impl& im, std::size_t t, bool writeback) {
  OffloadState& o = *im.off;
  const int id = o.ids[t];
  Slot& s = im.slots[static_cast<std::size_t>(id)];
  if (!s.live) return {};
  if (writeback && s.bytes) {
    // The device replica is the one the schedule counts; a cpu-side replica would do as well.
    const int from = s.ptr[o.dev] ? o.dev : 1 - o.dev;
    o.host[t].resize(s.bytes);
    HP_TRY(
        im.be[from]->copy_async(im.stream[from], o.host[t].data(), s.ptr[from], s.bytes, HP_D2H));
    HP_TRY(im.be[from]->stream_sync(im.stream[from]));
    im.stats.offload_bytes += static_cast<std::int64_t>(s.bytes);
  }
  im.free_slot(id);
  ++im.stats.offload_evictions;
  return {};
}

/// Binds the graph inputs' symbolic dims to the given inputs' dims.
model::DimBindings bind_dims(const Executor::Impl& im, const model::Model& m,
                             const std::vector<HostTensor>& inputs) {
  model::DimBindings b;
  const auto& g = m.proto->graph();
  for (std::size_t k = 0; k < im.inputs.size() && k < inputs.size(); ++k)
    for (const auto& v : g.input()) {
      if (v.name() != im.inputs[k].name || !v.type().has_tensor_type() ||
          !v.type().tensor_type().has_shape())
        continue;
      const auto& dims = v.type().tensor_type().shape().dim();
      for (int d = 0; d < dims.size() && static_cast<std::size_t>(d) < inputs[k].dims.size(); ++d)
        if (dims[d].has_dim_param() && !dims[d].dim_param().empty())
          b[dims[d].dim_param()] = inputs[k].dims[static_cast<std::size_t>(d)];
    }
  return b;
}

/// Builds the trace of this run and plans it.
Status plan(Executor::Impl& im, const std::vector<HostTensor>& inputs) {
  OffloadState& o = *im.off;
  auto g = model::build_graph(o.model, bind_dims(im, o.model, inputs));
  if (!g) {
    Error e = std::move(g).error();
    e.what.message = "offload: cannot size the run's tensors: " + e.what.message;
    return e;
  }
  const std::size_t T = im.tensor_names.size();
  const auto N = static_cast<std::int64_t>(im.nodes.size());
  std::vector<std::int64_t> producer(T, -1), last(T, -1);
  std::vector<std::vector<std::int64_t>> readers(T);
  for (std::int64_t k = 0; k < N; ++k) {
    const PreparedNode& n = im.nodes[static_cast<std::size_t>(k)];
    if (n.dead) continue;
    for (int t : n.outputs)
      if (t >= 0) producer[static_cast<std::size_t>(t)] = k;
    for (int t : n.inputs)
      if (t >= 0 && (readers[static_cast<std::size_t>(t)].empty() ||
                     readers[static_cast<std::size_t>(t)].back() != k))
        readers[static_cast<std::size_t>(t)].push_back(k);
  }
  std::vector<bool> is_output(T, false), is_input(T, false);
  for (int t : im.output_ids) is_output[static_cast<std::size_t>(t)] = true;
  for (int t : im.input_ids) is_input[static_cast<std::size_t>(t)] = true;

  o.trace = {};
  o.trace.base.assign(static_cast<std::size_t>(N), 0.0);
  for (const PreparedNode& n : im.nodes)
    o.trace.node_names.push_back(n.name.empty() ? n.op_type : n.name);
  o.ids.clear();
  o.tracked.assign(T, -1);
  o.free_after.assign(static_cast<std::size_t>(N), {});
  std::vector<double> diff(static_cast<std::size_t>(N) + 1, 0.0);
  auto fixed = [&](double bytes, std::int64_t from, std::int64_t to) {
    diff[static_cast<std::size_t>(from)] += bytes;
    diff[static_cast<std::size_t>(to) + 1] -= bytes;
  };
  for (std::size_t t = 0; t < T; ++t) {
    const Slot& s = im.slots[t];
    const auto& rd = readers[t];
    const bool weight = o.weight_data[t] != nullptr;
    if (!weight && producer[t] < 0 && !is_input[t]) continue;  // never materialised (dead, unused)
    double bytes = 0;
    if (s.live || weight) {  // loaded already (weights, inputs, cached outputs of an earlier run)
      bytes = static_cast<double>(pool_size(s.bytes));
    } else {
      const int gi = g->find_tensor(im.tensor_names[t]);
      auto b = gi >= 0 ? g->tensor(gi).bytes() : std::nullopt;
      if (!b)
        return Error(
            Errc::not_implemented,
            fmt::format("offload: the size of tensor '{}' is not known at these input dims, so no "
                        "schedule can be planned",
                        im.tensor_names[t]),
            o.model.path.string());
      bytes = static_cast<double>(pool_size(static_cast<std::size_t>(*b)));
    }
    const std::int64_t end = rd.empty() ? std::max<std::int64_t>(0, producer[t]) : rd.back();
    if (weight && o.weight_on_host[t]) {
      if (rd.empty()) continue;  // never read: stays on the host
      o.tracked[t] = static_cast<int>(o.trace.tensors.size());
      o.trace.tensors.push_back({im.tensor_names[t], bytes, -1, end, rd, false});
      o.ids.push_back(static_cast<int>(t));
      o.free_after[static_cast<std::size_t>(end)].push_back(static_cast<int>(t));
      continue;
    }
    if (weight) {
      fixed(bytes, 0, N - 1);  // loaded once, kept across runs
    } else if (is_input[t]) {
      fixed(bytes, 0, is_output[t] ? N - 1 : end);
    } else if (is_output[t]) {
      fixed(bytes, producer[t], N - 1);
    } else if (o.cfg.activations && !rd.empty()) {
      o.tracked[t] = static_cast<int>(o.trace.tensors.size());
      o.trace.tensors.push_back({im.tensor_names[t], bytes, producer[t], end, rd, true});
      o.ids.push_back(static_cast<int>(t));
    } else {
      fixed(bytes, producer[t], end);
    }
    // A cached node's output (constant folding, exec_prepare.cpp) would stay on the device for
    // good; under a budget it is an activation like the others, and its node recomputes it next
    // run.
    if (s.persistent && !is_output[t] && producer[t] >= 0)
      o.free_after[static_cast<std::size_t>(end)].push_back(static_cast<int>(t));
  }
  double run = 0;
  for (std::int64_t k = 0; k < N; ++k)
    o.trace.base[static_cast<std::size_t>(k)] = run += diff[static_cast<std::size_t>(k)];
  auto sched = offload::plan_node_offload(o.trace, o.budget, o.cfg.lookahead);
  if (!sched) {
    Error e = std::move(sched).error();
    e.what.message = "offload: " + e.what.message;
    if (e.what.where.empty()) e.what.where = o.model.path.string();
    return e;
  }
  o.sched = std::move(*sched);
  o.host.assign(o.trace.tensors.size(), {});
  return {};
}

}  // namespace

Status offload_prepare(Executor::Impl& im, const model::Model& model) {
  auto o = std::make_shared<OffloadState>();
  o->cfg = im.opts.offload;
  o->model = model;
  o->dev = im.be[1] ? 1 : 0;
  if (o->cfg.lookahead < 0)
    return Error(Errc::usage, "offload: the prefetch lookahead must be at least 0");
  o->budget = o->cfg.budget;
  if (o->budget <= 0) {
    HP_ASSIGN_OR_RETURN(auto info, im.be[o->dev]->device_info(0));
    o->budget = static_cast<double>(info.mem_total) * (1 - o->cfg.margin);
  }
  const std::size_t T = im.tensor_names.size();
  o->weight_on_host.assign(T, false);
  o->weight_data.assign(T, nullptr);
  for (auto& [id, h] : im.weights) {
    o->weight_data[static_cast<std::size_t>(id)] = &h;
    if (!o->cfg.weights) continue;
    o->weight_on_host[static_cast<std::size_t>(id)] = true;
    // The slot describes the weight although its buffer exists only between fetch and last reader.
    Slot& s = im.slots[static_cast<std::size_t>(id)];
    s.dtype = h.dtype;
    s.dims = h.dims;
    s.bytes = h.data.size();
  }
  im.off = std::move(o);
  return {};
}

bool offload_keeps_on_host(const Executor::Impl& im, int id) {
  return im.off && im.off->weight_on_host[static_cast<std::size_t>(id)];
}

Status offload_begin_run(Executor::Impl& im, const std::vector<HostTensor>& inputs) {
  im.stats.offload_fetches = im.stats.offload_evictions = im.stats.offload_bytes = 0;
  if (!im.off) return {};
  OffloadState& o = *im.off;
  // Whatever a failed run left on the device goes first (persistent tensors: drain keeps them).
  for (const auto& ids : o.free_after)
    for (int id : ids)
      if (im.slots[static_cast<std::size_t>(id)].live) im.free_slot(id);
  std::vector<std::int64_t> key;
  for (const HostTensor& h : inputs) {
    key.push_back(static_cast<std::int64_t>(h.dims.size()));
    key.insert(key.end(), h.dims.begin(), h.dims.end());
  }
  if (!o.planned || key != o.planned_for) {
    o.planned = false;
    HP_TRY(plan(im, inputs));
    o.planned_for = key;
    o.planned = true;
  }
  im.stats.offload_planned_peak = static_cast<std::int64_t>(o.sched.peak_bytes);
  return {};
}

Status offload_before_node(Executor::Impl& im, std::size_t k) {
  if (!im.off) return {};
  OffloadState& o = *im.off;
  for (const offload::NodeMove& m : o.sched.before[k])
    HP_TRY(m.to_device ? fetch(im, m.tensor) : evict(im, m.tensor, m.writeback));
  // On demand: a tracked input the schedule did not bring (it never should).
  for (int t : im.nodes[k].inputs)
    if (t >= 0 && o.tracked[static_cast<std::size_t>(t)] >= 0 &&
        !im.slots[static_cast<std::size_t>(t)].live)
      HP_TRY(fetch(im, static_cast<std::size_t>(o.tracked[static_cast<std::size_t>(t)])));
  return {};
}

void offload_after_node(Executor::Impl& im, std::size_t k) {
  if (!im.off) return;
  OffloadState& o = *im.off;
  for (int id : o.free_after[k])
    if (im.slots[static_cast<std::size_t>(id)].live) im.free_slot(id);
  // Activations are freed by the executor after their last reader; their host copies go too.
  for (std::size_t t = 0; t < o.trace.tensors.size(); ++t)
    if (o.trace.tensors[t].last == static_cast<std::int64_t>(k) && !o.host[t].empty())
      std::vector<unsigned char>().swap(o.host[t]);
}

void offload_end_run(Executor::Impl& im) {
  if (!im.off) return;
  for (int id : im.off->ids)
    if (im.slots[static_cast<std::size_t>(id)].live) im.free_slot(id);
}

void read_device_peak(Executor::Impl& im, bool reset) {
  plugin::Backend* b = im.be[1] ? im.be[1] : im.be[0];
  if (!b || !b->has_mem_stats()) return;
  auto m = b->mem_stats(0, reset);
  if (!m) return;
  if (!reset) im.stats.device_peak = static_cast<std::int64_t>(m->peak);
}

}  // namespace hp::exec
