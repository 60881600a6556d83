// Control flow in the executor: If and Loop (Scan: exec_scan.cpp) run their subgraphs
// (exec_subgraph.cpp) through the executor's own node loop, so every kernel a main-graph node can
// use is available in a body.
//
// Values move between the node and its body by slot: a body input is filled from the node's input
// (a copy: the outer value stays the node's), a body output is taken out of the body before the
// body's tensors are cleared. Taking steals the buffers when the output is the body's own tensor
// (no copy: a Loop's carried state passes from one iteration to the next by pointer) and copies
// when it is an outer value or appears twice among the outputs (take/put: exec_values.cpp). Loop's
// scan outputs go through host tensors (join_axis), since they are assembled piece by piece.
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

}  // namespace
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

}  // namespace hp::exec
