// Pipeline schedules as data: for every pipeline rank, the ordered list of actions it performs.
//
// Notation (docs/schedules.md, "Notation"): p ranks (pipeline stages per chunk), m micro-batches, v
// model chunks per rank ("virtual stages"). Virtual stage vs = chunk * p + rank, so the model runs
// through vs = 0 .. p*v-1 and chunk c of rank r is vs = c*p + r (Megatron's interleaving). With v =
// 1 the virtual stage is the rank. ZB-V is the exception: its two chunks per rank form a V, chunk 0
// of rank r is virtual stage r and chunk 1 is 2p-1-r (rank_of() knows both mappings).
//
// make_schedule() writes compute-only lists (F = forward, B = backward; backward only when
// `training`). The zero-bubble schedules split the backward: B is then the input-gradient half only
// and W the weight-gradient half, which needs the B of its own (stage, micro-batch) and nothing
// from another rank, so it can be deferred to fill idle time (docs/schedules.md, "Split backward");
// lower_send_recv() inserts the SEND/RECV pairs between neighbouring virtual stages.
// check_schedule() simulates all ranks' lists step by step with unit compute cost and zero-cost,
// buffered sends (the runtime sends with MPI_Isend from a copy), or rendezvous sends on request: it
// reports a deadlock (which ranks wait on what), receives without a matching send, sends never
// received, missing or repeated work, and data used before it arrived; on success it gives the
// makespan, from which the measured bubble follows. bubble_fraction() is the closed form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/core/expected.h"

namespace hp::job {

enum class ScheduleKind { gpipe, one_f_one_b, interleaved, zb_h1, zbv };
/// "gpipe", "1f1b", "interleaved", "zb-h1", "zbv"; Errc::bad_input otherwise.
Expected<ScheduleKind> parse_schedule_kind(const std::string& name);
const char* schedule_kind_name(ScheduleKind k);

/// Whether the kind's training lists split the backward into B (input gradient) and W (weight
/// gradient): ZB-H1 and ZB-V.
bool splits_backward(ScheduleKind k);

enum class ActionKind { forward, backward, send_f, recv_f, send_b, recv_b, weight };

struct Action {
  ActionKind kind = ActionKind::forward;
  int stage = 0;  ///< virtual stage the action belongs to (for SEND/RECV: this rank's stage)
  int micro_batch = 0;
  int peer = -1;  ///< SEND/RECV: the other rank
  bool is_compute() const {
    return kind == ActionKind::forward || kind == ActionKind::backward ||
           kind == ActionKind::weight;
  }
  friend bool operator==(const Action&, const Action&) = default;
};

/// "1F0", "3B2", "1W2", "1SEND_F0", "2RECV_B3" (docs/schedules.md, "Notation").
std::string format_action(const Action& a);

struct PipelineSchedule {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int ranks = 1, micro_batches = 1, chunks = 1;
  bool training = false;
  std::vector<std::vector<Action>> per_rank;
  int stages() const { return ranks * chunks; }
  /// The rank that runs virtual stage `stage`: stage mod p (Megatron's interleaving), except for
  /// ZB-V, whose chunk 1 runs back up the ranks (stage p..2p-1 on ranks p-1..0).
  int rank_of(int stage) const {
    if (kind == ScheduleKind::zbv && stage >= ranks) return 2 * ranks - 1 - stage;
    return stage % ranks;
  }
};

/// Compute-only lists. Errc::usage for p, m or v below 1, v > 1 outside interleaved and zbv,
/// interleaved with m not a multiple of p (Megatron's micro-batch groups of size p), zbv with v
/// other than 2 (its V needs exactly two chunks per rank).
Expected<PipelineSchedule> make_schedule(ScheduleKind kind, int ranks, int micro_batches,
                                         int chunks, bool training);
/// Inserts RECV before and SEND after each compute action whose neighbour stage lives on another
/// rank.
PipelineSchedule lower_send_recv(const PipelineSchedule& compute_only);

struct ScheduleCheck {
  bool ok = false;
  std::string problem;       ///< empty when ok
  int makespan = 0;          ///< steps of unit compute until every rank is done
  int compute_per_rank = 0;  ///< busiest rank's compute actions
  /// 1 - compute / makespan on the busiest rank: the bubble as a fraction of wall time.
  double bubble() const {
    return makespan ? 1.0 - static_cast<double>(compute_per_rank) / makespan : 0;
  }
  std::string grid;  ///< step x rank table of what ran; "!" marks the blocked cells
};

enum class SendMode { buffered, rendezvous };
/// Simulates the lists (lowered ones, or compute-only ones, whose cross-rank data flow is then
/// implied).
ScheduleCheck check_schedule(const PipelineSchedule& s, SendMode mode = SendMode::buffered);

/// Idle time as a fraction of wall time with unit costs: (p-1) / (v*m + p-1) (GPipe and 1F1B: v =
/// 1). Training with a split backward (F = B = W): ZB-H1 (p-1) / (3m + p-1) for m >= p, ZB-V
/// (p-1) / (6m + p-1) for m >= 2p (docs/schedules.md, "Split backward"); their inference lists
/// have 1F1B's (p-1) / (m + p-1).
double bubble_fraction(ScheduleKind kind, int ranks, int micro_batches, int chunks,
                       bool training = false);

}  // namespace hp::job
