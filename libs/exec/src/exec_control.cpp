// Control flow in the executor: If, Loop and Scan run their subgraphs (exec_subgraph.cpp) through
// the executor's own node loop, so every kernel a main-graph node can use is available in a body.
//
// Values move between the node and its body by slot: a body input is filled from the node's input
// (a copy: the outer value stays the node's), a body output is taken out of the body before the
// body's tensors are cleared. Taking steals the buffers when the output is the body's own tensor
// (no copy: a Loop's carried state passes from one iteration to the next by pointer) and copies
// when it is an outer value or appears twice among the outputs. Scan outputs and Scan's sliced
// inputs go through host tensors (slice_axis / join_axis), since they are assembled piece by piece.
// docs/executor.md, "Control flow", describes the semantics implemented here.
#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "exec_internal.h"

namespace hp::exec {

std::int64_t attr_int(const PreparedNode& n, const char* name, std::int64_t dflt) {
  for (const hp_op_attr& a : n.attrs)
    if (std::strcmp(a.name, name) == 0 && a.kind == HP_ATTR_INT) return a.i;
  return dflt;
}

std::vector<std::int64_t> attr_ints(const PreparedNode& n, const char* name) {
  for (const hp_op_attr& a : n.attrs)
    if (std::strcmp(a.name, name) == 0 && a.kind == HP_ATTR_INTS) return {a.ints, a.ints + a.n};
  return {};
}

namespace {

/// Detached slots that go back to the pool when the holder dies (an error mid-loop included).
struct Held {
  Executor::Impl& im;
  std::vector<Slot> v;
  explicit Held(Executor::Impl& i) : im(i) {}
  ~Held() {
    for (Slot& s : v) im.drop(s);
  }
};

std::string where_of(const PreparedNode& n) { return n.name.empty() ? n.op_type : n.name; }

HostTensor scalar_tensor(int dtype, std::int64_t v) {
  HostTensor t;
  t.dtype = dtype;
  t.data.resize(static_cast<std::size_t>(dtype_size(dtype)));
  if (dtype == HP_I64) std::memcpy(t.data.data(), &v, 8);
  if (dtype == HP_BOOL) t.data[0] = v ? 1 : 0;
  return t;
}

/// Takes outputs [first, first + count) of a body that has just run.
Status take_outputs(Executor::Impl& im, const Body& b, std::size_t first, std::size_t count,
                    Held& into) {
  for (std::size_t k = first; k < first + count; ++k) {
    const int id = b.outputs[k];
    const bool steal = b.local(id) && std::count(b.outputs.begin(), b.outputs.end(), id) == 1;
    HP_ASSIGN_OR_RETURN(auto s, im.take(id, steal));
    into.v.push_back(std::move(s));
  }
  return {};
}

/// An empty scan output: no iteration ran, so its shape comes from the body's declaration.
HostTensor empty_scan_output(const GraphIO& io) {
  HostTensor t;
  t.dtype = io.dtype >= 0 ? io.dtype : HP_F32;
  t.dims = {0};
  if (io.has_shape && std::all_of(io.dims.begin(), io.dims.end(), [](auto d) { return d >= 0; }))
    t.dims.insert(t.dims.end(), io.dims.begin(), io.dims.end());
  return t;
}

}  // namespace

Expected<Slot> Executor::Impl::take(int id, bool steal) {
  Slot& s = slots[static_cast<std::size_t>(id)];
  if (!s.live)
    return Error(Errc::internal, fmt::format("tensor '{}' read before it was written",
                                             tensor_names[static_cast<std::size_t>(id)]));
  Slot out;
  out.dtype = s.dtype;
  out.dims = s.dims;
  out.bytes = s.bytes;
  out.seq = s.seq;
  out.live = true;
  if (steal) {
    for (int w = 0; w < 2; ++w) {
      out.ptr[w] = s.ptr[w];
      s.ptr[w] = nullptr;
    }
    s.seq.reset();
    s.live = false;
    return out;
  }
  if (s.seq) return out;
  HP_TRY(place(id, 0));
  HP_TRY(be[0]->stream_sync(stream[0]));
  HP_ASSIGN_OR_RETURN(auto p, alloc(0, s.bytes, id));
  const Slot& src = slots[static_cast<std::size_t>(id)];
  if (src.bytes) std::memcpy(p, src.ptr[0], src.bytes);
  out.ptr[0] = p;
  return out;
}

void Executor::Impl::put(int id, Slot&& s) {
  if (id < 0) {
    drop(s);
    return;
  }
  if (slots[static_cast<std::size_t>(id)].live) free_slot(id);
  Slot& d = slots[static_cast<std::size_t>(id)];
  d.dtype = s.dtype;
  d.dims = std::move(s.dims);
  d.bytes = s.bytes;
  d.seq = std::move(s.seq);
  for (int w = 0; w < 2; ++w) {
    d.ptr[w] = s.ptr[w];
    s.ptr[w] = nullptr;
  }
  d.live = true;
  s.live = false;
}

void Executor::Impl::drop(Slot& s) {
  for (int w = 0; w < 2; ++w) {
    release(w, s.ptr[w], s.bytes);
    s.ptr[w] = nullptr;
  }
  s.seq.reset();
  s.live = false;
}

Expected<std::int64_t> Executor::Impl::read_int(int id, const char* what, const PreparedNode& n) {
  HP_TRY(place(id, 0));
  HP_TRY(be[0]->stream_sync(stream[0]));
  const Slot& s = slots[static_cast<std::size_t>(id)];
  std::int64_t count = 1;
  for (std::int64_t d : s.dims) count *= d;
  if (count != 1)
    return Error(Errc::runtime,
                 fmt::format("{}: {} must hold one value, it has shape {}", n.op_type, what,
                             dims_label(s.dims)),
                 where_of(n));
  switch (s.dtype) {
    case HP_BOOL:
    case HP_U8: return static_cast<std::int64_t>(*static_cast<const std::uint8_t*>(s.ptr[0]));
    case HP_I32: return static_cast<std::int64_t>(*static_cast<const std::int32_t*>(s.ptr[0]));
    case HP_I64: return *static_cast<const std::int64_t*>(s.ptr[0]);
    default:
      return Error(Errc::runtime,
                   fmt::format("{}: {} must be bool or an integer, it is {}", n.op_type, what,
                               dtype_label(s.dtype)),
                   where_of(n));
  }
}

Status Executor::Impl::run_body(Body& b) {
  for (PreparedNode& n : b.nodes) {
    HP_TRY(run_node(n));
    for (int t : n.release_after) free_slot(t);
  }
  return {};
}

void Executor::Impl::clear_body(Body& b) {
  for (int t : b.locals)
    if (slots[static_cast<std::size_t>(t)].live) free_slot(t);
}

Status Executor::Impl::run_builtin(PreparedNode& n) {
  switch (n.builtin) {
    case Builtin::If: HP_TRY(run_if(n)); break;
    case Builtin::Loop: HP_TRY(run_loop(n)); break;
    case Builtin::Scan: HP_TRY(run_scan(n)); break;
    case Builtin::SequenceMap: HP_TRY(run_sequence_map(n)); break;
    default: HP_TRY(run_sequence(n)); break;
  }
  ++stats.nodes;
  return {};
}

Status Executor::Impl::run_if(PreparedNode& n) {
  if (n.inputs.empty() || n.inputs[0] < 0)
    return Error(Errc::bad_input, "If needs its condition input", where_of(n));
  HP_ASSIGN_OR_RETURN(auto cond, read_int(n.inputs[0], "the condition", n));
  Body& b = *n.bodies[cond ? 0 : 1];
  HP_TRY(run_body(b));
  Held out(*this);
  HP_TRY(take_outputs(*this, b, 0, b.outputs.size(), out));
  clear_body(b);
  for (std::size_t k = 0; k < out.v.size(); ++k) put(n.outputs[k], std::move(out.v[k]));
  return {};
}

Status Executor::Impl::run_loop(PreparedNode& n) {
  Body& b = *n.bodies[0];
  const std::size_t carried = n.inputs.size() - 2, scans = n.outputs.size() - carried;
  std::int64_t trips = std::numeric_limits<std::int64_t>::max();
  if (n.inputs[0] >= 0) {
    HP_ASSIGN_OR_RETURN(trips, read_int(n.inputs[0], "the trip count M", n));
  }
  bool cond = true;
  if (n.inputs[1] >= 0) {
    HP_ASSIGN_OR_RETURN(auto c, read_int(n.inputs[1], "the condition", n));
    cond = c != 0;
  }
  Held state(*this);
  for (std::size_t j = 0; j < carried; ++j) {
    const int id = n.inputs[2 + j];
    if (id < 0)
      return Error(Errc::not_implemented,
                   fmt::format("Loop: carried value {} is omitted (an optional value, which the "
                               "executor does not hold)",
                               j),
                   where_of(n));
    HP_ASSIGN_OR_RETURN(auto s, take(id, false));
    state.v.push_back(std::move(s));
  }
  std::vector<std::vector<HostTensor>> outs(scans);
  for (std::int64_t i = 0; i < trips && cond; ++i) {
    HP_TRY(load_tensor(b.inputs[0], scalar_tensor(HP_I64, i)));
    HP_TRY(load_tensor(b.inputs[1], scalar_tensor(HP_BOOL, 1)));
    for (std::size_t j = 0; j < carried; ++j) put(b.inputs[2 + j], std::move(state.v[j]));
    state.v.clear();
    HP_TRY(run_body(b));
    HP_ASSIGN_OR_RETURN(auto c, read_int(b.outputs[0], "the body's condition", n));
    cond = c != 0;
    for (std::size_t k = 0; k < scans; ++k) {
      HP_ASSIGN_OR_RETURN(auto h, to_host(b.outputs[1 + carried + k]));
      outs[k].push_back(std::move(h));
    }
    HP_TRY(take_outputs(*this, b, 1, carried, state));
    clear_body(b);
  }
  for (std::size_t j = 0; j < carried; ++j) put(n.outputs[j], std::move(state.v[j]));
  state.v.clear();
  for (std::size_t k = 0; k < scans; ++k) {
    const int id = n.outputs[carried + k];
    if (id < 0) continue;
    if (outs[k].empty()) {
      HP_TRY(load_tensor(id, empty_scan_output(b.output_io[1 + carried + k])));
      continue;
    }
    std::vector<const HostTensor*> items;
    for (const HostTensor& h : outs[k]) items.push_back(&h);
    HP_ASSIGN_OR_RETURN(auto joined, join_axis(items, 0, true, where_of(n)));
    HP_TRY(load_tensor(id, joined));
  }
  return {};
}

namespace {

/// The scan itself, on host tensors: `steps` iterations over `xs` (sliced along in_axes, backwards
/// where in_dirs says), `states` updated in place, every iteration's scan outputs appended to `ys`.
Status scan_steps(Executor::Impl& im, Body& b, std::vector<HostTensor>& states,
                  const std::vector<HostTensor>& xs, const std::vector<int>& in_axes,
                  const std::vector<std::int64_t>& in_dirs, std::int64_t steps,
                  std::vector<std::vector<HostTensor>>& ys) {
  const std::size_t ns = states.size();
  for (std::int64_t t = 0; t < steps; ++t) {
    for (std::size_t j = 0; j < ns; ++j) HP_TRY(im.load_tensor(b.inputs[j], states[j]));
    for (std::size_t m = 0; m < xs.size(); ++m) {
      const std::int64_t at = in_dirs[m] ? steps - 1 - t : t;
      HP_TRY(im.load_tensor(b.inputs[ns + m], slice_axis(xs[m], in_axes[m], at)));
    }
    HP_TRY(im.run_body(b));
    for (std::size_t j = 0; j < ns; ++j) {
      HP_ASSIGN_OR_RETURN(states[j], im.to_host(b.outputs[j]));
    }
    for (std::size_t k = 0; k < ys.size(); ++k) {
      HP_ASSIGN_OR_RETURN(auto h, im.to_host(b.outputs[ns + k]));
      ys[k].push_back(std::move(h));
    }
    im.clear_body(b);
  }
  return {};
}

/// An axis attribute in [-rank, rank) made non-negative; Errc::bad_input otherwise.
Expected<int> norm_axis(std::int64_t a, std::size_t rank, const PreparedNode& n) {
  const auto r = static_cast<std::int64_t>(rank);
  if (a < -r || a >= r)
    return Error(Errc::bad_input,
                 fmt::format("{}: axis {} is out of range for rank {}", n.op_type, a, r),
                 where_of(n));
  return static_cast<int>(a < 0 ? a + r : a);
}

}  // namespace

Status Executor::Impl::run_scan(PreparedNode& n) {
  Body& b = *n.bodies[0];
  const bool v8 = n.opset < 9;  // Scan-8: a leading batch axis and a sequence_lens input
  const std::size_t first = v8 ? 1 : 0;
  const std::size_t m = static_cast<std::size_t>(attr_int(n, "num_scan_inputs", 0));
  if (m < 1 || m > n.inputs.size() - first)
    return Error(Errc::bad_input,
                 fmt::format("Scan: num_scan_inputs {} does not fit {} inputs", m, n.inputs.size()),
                 where_of(n));
  const std::size_t ns = n.inputs.size() - first - m, ks = n.outputs.size() - ns;
  std::vector<HostTensor> states, xs;
  for (std::size_t j = first; j < n.inputs.size(); ++j) {
    HP_ASSIGN_OR_RETURN(auto h, to_host(n.inputs[j]));
    (j < first + ns ? states : xs).push_back(std::move(h));
  }
  auto dirs_of = [&](const char* name, std::size_t count) {
    auto v = attr_ints(n, name);
    v.resize(count, 0);
    return v;
  };
  const auto in_dirs = dirs_of(v8 ? "directions" : "scan_input_directions", m);
  std::vector<std::int64_t> ys_axes(ks, 0), out_dirs = dirs_of("scan_output_directions", ks);
  if (!v8) {
    auto a = attr_ints(n, "scan_output_axes");
    for (std::size_t k = 0; k < a.size() && k < ks; ++k) ys_axes[k] = a[k];
  }
  std::vector<int> in_axes(m, 0);
  std::int64_t steps = -1;
  const int batch_dims = v8 ? 1 : 0;
  {
    auto a = attr_ints(n, "scan_input_axes");
    for (std::size_t k = 0; k < m; ++k) {
      const std::size_t rank = xs[k].dims.size() - (v8 && !xs[k].dims.empty() ? 1 : 0);
      HP_ASSIGN_OR_RETURN(in_axes[k], norm_axis(!v8 && k < a.size() ? a[k] : 0, rank, n));
      const std::int64_t len = xs[k].dims[static_cast<std::size_t>(in_axes[k] + batch_dims)];
      if (steps >= 0 && len != steps)
        return Error(Errc::runtime,
                     fmt::format("Scan: scan inputs have {} and {} steps", steps, len),
                     where_of(n));
      steps = len;
    }
  }
  std::vector<HostTensor> results(ns + ks);
  auto finish_outputs = [&](std::vector<std::vector<HostTensor>>& ys,
                            std::vector<HostTensor>& st) -> Status {
    for (std::size_t j = 0; j < ns; ++j) results[j] = std::move(st[j]);
    for (std::size_t k = 0; k < ks; ++k) {
      if (out_dirs[k]) std::reverse(ys[k].begin(), ys[k].end());
      if (ys[k].empty()) {
        results[ns + k] = empty_scan_output(b.output_io[ns + k]);
        continue;
      }
      std::vector<const HostTensor*> items;
      for (const HostTensor& h : ys[k]) items.push_back(&h);
      const std::size_t rank = ys[k][0].dims.size() + 1;
      HP_ASSIGN_OR_RETURN(auto ax, norm_axis(ys_axes[k], rank, n));
      HP_ASSIGN_OR_RETURN(results[ns + k], join_axis(items, ax, true, where_of(n)));
    }
    return {};
  };
  if (!v8) {
    std::vector<std::vector<HostTensor>> ys(ks);
    HP_TRY(scan_steps(*this, b, states, xs, in_axes, in_dirs, steps, ys));
    HP_TRY(finish_outputs(ys, states));
  } else {
    // Scan-8: the batch is a loop around the scan; sequence_lens shortens a batch entry's scan,
    // whose scan outputs are then padded with zeros to the full length.
    const std::int64_t batch = xs[0].dims.empty() ? 0 : xs[0].dims[0];
    std::vector<std::int64_t> lens(static_cast<std::size_t>(batch), steps);
    if (n.inputs[0] >= 0) {
      HP_ASSIGN_OR_RETURN(auto l, to_host(n.inputs[0]));
      for (std::int64_t i = 0; i < batch && i < l.numel(); ++i)
        lens[static_cast<std::size_t>(i)] =
            l.dtype == HP_I32 ? l.as<std::int32_t>()[i] : l.as<std::int64_t>()[i];
    }
    std::vector<std::vector<HostTensor>> per_state(ns), per_out(ks);
    for (std::int64_t bi = 0; bi < batch; ++bi) {
      std::vector<HostTensor> st, xb;
      for (const HostTensor& s : states) st.push_back(slice_axis(s, 0, bi));
      for (const HostTensor& x : xs) xb.push_back(slice_axis(x, 0, bi));
      const std::int64_t len = lens[static_cast<std::size_t>(bi)];
      if (len < 0 || len > steps)
        return Error(Errc::runtime,
                     fmt::format("Scan: sequence length {} of batch entry {} is "
                                 "outside [0, {}]",
                                 len, bi, steps),
                     where_of(n));
      std::vector<std::vector<HostTensor>> ys(ks);
      HP_TRY(scan_steps(*this, b, st, xb, in_axes, in_dirs, len, ys));
      for (std::size_t k = 0; k < ks; ++k) {
        if (ys[k].empty() && steps > 0)
          return Error(Errc::not_implemented, "Scan: an empty sequence in a Scan-8 batch",
                       where_of(n));
        while (static_cast<std::int64_t>(ys[k].size()) < steps) {
          HostTensor z = ys[k][0];
          std::fill(z.data.begin(), z.data.end(), 0);
          ys[k].push_back(std::move(z));
        }
        std::vector<const HostTensor*> items;
        for (const HostTensor& h : ys[k]) items.push_back(&h);
        HP_ASSIGN_OR_RETURN(auto j, join_axis(items, 0, true, where_of(n)));
        per_out[k].push_back(std::move(j));
      }
      for (std::size_t j = 0; j < ns; ++j) per_state[j].push_back(std::move(st[j]));
    }
    for (std::size_t j = 0; j < ns; ++j) per_state[j].resize(static_cast<std::size_t>(batch));
    for (std::size_t idx = 0; idx < ns + ks; ++idx) {
      auto& list = idx < ns ? per_state[idx] : per_out[idx - ns];
      std::vector<const HostTensor*> items;
      for (const HostTensor& h : list) items.push_back(&h);
      if (items.empty()) return Error(Errc::not_implemented, "Scan: an empty batch", where_of(n));
      HP_ASSIGN_OR_RETURN(results[idx], join_axis(items, 0, true, where_of(n)));
    }
  }
  for (std::size_t k = 0; k < results.size(); ++k)
    if (n.outputs[k] >= 0) HP_TRY(load_tensor(n.outputs[k], results[k]));
  return {};
}

}  // namespace hp::exec
