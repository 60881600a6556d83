// The offload policy of policy.h at the executor's granularity, for `hp launch` (docs/offload.md,
// "Offload at run time").
//
// offload-profile plans a training step of planner units (blocks x micro-batches); a rank's
// executor runs ONNX nodes one after another. This is the same policy on that finer trace: one slot
// per node, the offloadable tensors (weights by the nodes that read them, activations from their
// producer to their last reader) with their byte sizes, and the bytes that never move. Tensors a
// node reads must be on the device while it runs; when the budget would be exceeded, the resident
// tensor whose next use is furthest ahead is evicted first (Belady), written back first when the
// host has no copy (activations; weights keep theirs). Tensors come back before their next use: on
// demand, and up to `lookahead` nodes early when the budget has room (the copy can then overlap the
// nodes in between).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/core/expected.h"

namespace hp::offload {

/// One tensor the schedule may keep in the host pool.
struct NodeTensor {
  std::string name;
  double bytes = 0;  ///< as the device allocates it (rounded)
  std::int64_t created =
      -1;                 ///< the node that writes it; -1: before node 0, on the host (a weight)
  std::int64_t last = 0;  ///< the last node it must stay allocated for (its last reader)
  std::vector<std::int64_t> uses;  ///< nodes that read it, ascending
  bool dirty = true;               ///< written on the device: eviction copies it back (activations)
};

/// A rank's run as the policy sees it.
struct NodeTrace {
  std::vector<double> base;  ///< per node: device bytes that never move, while it runs
  std::vector<NodeTensor> tensors;
  std::vector<std::string> node_names;  ///< for messages; may be shorter than base
};

/// One copy issued before a node runs.
struct NodeMove {
  std::size_t tensor = 0;  ///< index into NodeTrace::tensors
  bool to_device = true;   ///< H2D fetch, or an eviction (a D2H write-back when `writeback`)
  bool writeback = false;
};

struct NodeSchedule {
  /// Per node: what happens before it runs, evictions first, then fetches (on demand and
  /// prefetches).
  std::vector<std::vector<NodeMove>> before;
  std::vector<double> memory;  ///< per node: device bytes while it runs
  double peak_bytes = 0;
  std::int64_t peak_node = 0;
  double unplanned_peak =
      0;  ///< the peak with every tensor on the device from creation to last use
  std::int64_t fetches = 0, prefetches = 0, evictions = 0, writebacks = 0;
  double fetched_bytes = 0, written_bytes = 0;
  std::int64_t max_lookahead = 0;  ///< furthest ahead (nodes) a fetch was issued
};

/// Plans the moves under `budget` bytes. A node whose own needs (the bytes that never move plus the
/// tensors it reads and writes) exceed the budget: Errc::infeasible naming the node, the need and
/// the budget. A use before creation or a use after `last` is Errc::internal (a malformed trace).
Expected<NodeSchedule> plan_node_offload(const NodeTrace& trace, double budget,
                                         std::int64_t lookahead);

}  // namespace hp::offload
