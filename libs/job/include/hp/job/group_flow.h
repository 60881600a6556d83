// Tensors flowing between MPMD process groups (HyperMPMD, the paper's Listing 1).
//
// A recipe's [[groups]] each run their own module on their own ranks. A tensor named in group A's
// `outputs` and in group B's `inputs` *flows* from A to B: after A's forward, A's ranks send it to
// B's ranks over MPI point-to-point, and B runs its forward once it has all of its inputs. A recipe
// "has flows" when at least one tensor flows or a group's module is "scheduler"; recipes without
// flows keep the plain group semantics (every rank reads --inputs whole; `outputs` names the job's
// outputs, replicas may list the same one).
//
// Which rank sends what to which rank. Every group of a flow recipe is data parallel over the
// request batch: with B requests (axis 0 of the request tensors), rank i of a group of n ranks
// serves rows [i*B/n, (i+1)*B/n) (integer division, so any B >= n works) of every tensor it reads
// or produces. Rank j of a consumer group receives from each producer rank the rows both of them
// hold, in producer rank order, and concatenates them along axis 0. So two text-encoder ranks each
// encode half of the requests and a one-rank fusion group receives both halves; a one-rank
// scheduler sends each rank of a two-rank group its half. Each piece is two messages: a header
// (dtype, dims) then the bytes, with tags 30001 + 2k and 30002 + 2k for the k-th flow (above the
// tags MPI_Comm_create_group uses here). B itself is agreed at start-up by a max-AllReduce over all
// ranks of what the ranks that read
// --inputs saw (the scheduler, or groups fed from --inputs directly).
//
// The scheduler (module = "scheduler", one rank) runs no model: it reads --inputs, sends every
// tensor in its `outputs` to the groups that read it, then receives every tensor in its `inputs`
// (the final results) and writes them whole as the job's outputs. Without a scheduler, a group
// input that no group produces is read from --inputs (its rows), and a group output that no group
// reads is a job output (it must then come from a one-rank group, whose rows are the whole batch).
//
// Ranks never deadlock: the flow graph has no cycle (checked), every rank receives all of its
// inputs before its forward and sends afterwards, and sends are buffered (comm.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/recipe/recipe.h"
#include "hp/recipe/source_map.h"

namespace hp::job {

struct Job;  // job.h

/// The module name of a scheduler group.
inline constexpr const char* kSchedulerModule = "scheduler";
bool is_scheduler(const recipe::Group& g);

/// One tensor that moves from its producer group to one or more consumer groups.
struct Flow {
  std::string tensor;
  std::size_t producer = 0;            ///< index into recipe.groups
  std::vector<std::size_t> consumers;  ///< indices into recipe.groups, ascending
};

struct FlowGraph {
  std::vector<Flow> flows;               ///< in order of first appearance in the groups' outputs
  std::optional<std::size_t> scheduler;  ///< the scheduler group, when there is one
  /// Group inputs no group produces: read from --inputs (only without a scheduler). Per group.
  std::vector<std::vector<std::string>> external_inputs;
  /// Group outputs no group reads: job outputs (only without a scheduler). Per group.
  std::vector<std::vector<std::string>> job_outputs;
  bool active() const { return !flows.empty() || scheduler.has_value(); }
  /// The index of the flow of `tensor`, or -1.
  int find(const std::string& tensor) const;
};

/// True when the recipe's groups exchange tensors (see the file comment).
bool has_flows(const recipe::Recipe& r);

/// The flows of the recipe's [[groups]], from their names alone (no file is read). Errors
/// (bad_input, every problem at once, located with `where`): a tensor with two producer groups, a
/// group reading what it produces, a cycle between groups, a scheduler with other than one rank or
/// a second scheduler, with a scheduler: an input nothing produces or an output nothing reads;
/// without one: a job output of a group with more than one rank.
Expected<FlowGraph> build_flows(const recipe::Recipe& r, const recipe::SourceMap& where);

/// `hp verify` / `hp launch` before starting ranks: build_flows, then every group's module (shapes
/// only): each listed input and output exists in the module, every module input is fed (with a
/// scheduler, by a flow), and producer and consumer agree on dtype and on every dim, axis 0 as the
/// whole batch (ranks x rows per rank). A job of another kind passes untouched. bad_input with
/// every problem, located in the recipe.
Status check_group_flows(const Job& job);

/// Rows [first, first + count) of the batch that rank `index` of a group of `ranks` serves.
struct RowRange {
  std::int64_t first = 0, count = 0;
};
RowRange rows_of(std::int64_t batch, std::int64_t ranks, std::int64_t index);

/// MPI tags of the k-th flow's header and data messages.
int flow_header_tag(int flow);
int flow_data_tag(int flow);

}  // namespace hp::job
