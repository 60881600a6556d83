// The schedule checker: a step-by-step simulation of every rank's action list.
//
// Model: in each step a rank runs zero-cost SEND/RECV actions at the head of its list as long as it
// can, and at most one compute action (unit cost). Data produced in step t is usable from step t+1.
// Buffered sends complete at once (the runtime copies and uses MPI_Isend); rendezvous sends
// complete only together with the matching RECV at the head of the peer's list. Lists without
// SEND/RECV are compute-only: a compute action then waits for its producer on the other rank
// directly.
//
// A W (weight gradient, split-backward schedules) is compute with one input, the B of its own
// (stage, micro-batch) on the same rank; it sends and receives nothing.
//
// Static checks first (each (stage, micro-batch) computed exactly once per kind, on the rank that
// owns the stage; W exactly when the schedule splits its backward and trains), then the simulation:
// no step makes progress while some rank is unfinished -> deadlock, or a RECV without any matching
// SEND left anywhere; at the end, a sent message nobody received is an error.
#include <fmt/core.h>

#include <map>
#include <set>
#include <tuple>

#include "hp/job/schedule.h"

namespace hp::job {
namespace {

// A message between stages: (direction is forward, producing stage, micro-batch, src rank, dst
// rank).
using MsgKey = std::tuple<bool, int, int, int, int>;
// Data a rank holds for a computation: (forward?, producing stage, micro-batch) -> step it became
// usable.
using DataKey = std::tuple<bool, int, int>;

struct Sim {
  const PipelineSchedule& s;
  SendMode mode;
  bool lowered = false;
  int last = 0;
  std::vector<std::size_t> pc;
  std::vector<std::map<DataKey, int>> have;  // per rank: data it may use, and the step it arrived
  std::multimap<MsgKey, int> inflight;       // buffered messages and the step they were sent
  std::map<DataKey, int> done;               // global: compute finished at step
  std::vector<std::string> grid_rows;

  explicit Sim(const PipelineSchedule& sched, SendMode m) : s(sched), mode(m) {
    last = s.stages() - 1;
    pc.assign(static_cast<std::size_t>(s.ranks), 0);
    have.resize(static_cast<std::size_t>(s.ranks));
    for (const auto& l : s.per_rank)
      for (const auto& a : l) lowered |= !a.is_compute();
  }

  const Action* head(int r) const {
    const auto& l = s.per_rank[static_cast<std::size_t>(r)];
    return pc[static_cast<std::size_t>(r)] < l.size() ? &l[pc[static_cast<std::size_t>(r)]]
                                                      : nullptr;
  }

  // The message a SEND puts on the wire or a RECV expects.
  MsgKey msg_of(int r, const Action& a) const {
    switch (a.kind) {
      case ActionKind::send_f: return {true, a.stage, a.micro_batch, r, a.peer};
      case ActionKind::send_b: return {false, a.stage, a.micro_batch, r, a.peer};
      case ActionKind::recv_f: return {true, a.stage - 1, a.micro_batch, a.peer, r};
      default: return {false, a.stage + 1, a.micro_batch, a.peer, r};
    }
  }

  // Whether compute action `a` on rank r may run at step t; fills `why` when the reason is an
  // error.
  bool inputs_ready(int r, const Action& a, int t, std::string& why) const {
    if (a.kind == ActionKind::weight) {
      auto it = done.find({false, a.stage, a.micro_batch});
      // The B is on this rank too: if it has not run, it comes later in this very list.
      if (it == done.end())
        why = fmt::format("rank {}: {} runs before {}B{}", r, format_action(a), a.stage,
                          a.micro_batch);
      return it != done.end() && it->second < t;
    }
    const bool fwd = a.kind == ActionKind::forward;
    if (!fwd) {
      auto it = done.find({true, a.stage, a.micro_batch});
      if (it == done.end() || it->second >= t) {
        if (it == done.end() && s.rank_of(a.stage) == r)
          why = fmt::format("rank {}: {} runs before {}F{}", r, format_action(a), a.stage,
                            a.micro_batch);
        return false;
      }
    }
    const int from = fwd ? a.stage - 1 : a.stage + 1;
    if (from < 0 || from > last) return true;
    const DataKey need{fwd, from, a.micro_batch};
    if (s.rank_of(from) == r || !lowered) {
      auto it = done.find(need);
      return it != done.end() && it->second < t;
    }
    auto it = have[static_cast<std::size_t>(r)].find(need);
    if (it == have[static_cast<std::size_t>(r)].end()) {
      why = fmt::format(
          "rank {}: {} uses the output of stage {} for micro-batch {} without a {} first", r,
          format_action(a), from, a.micro_batch, fwd ? "RECV_F" : "RECV_B");
      return false;
    }
    return it->second < t;
  }

  bool has_pending_send(const MsgKey& k) const {
    for (int q = 0; q < s.ranks; ++q) {
      const auto& l = s.per_rank[static_cast<std::size_t>(q)];
      for (std::size_t i = pc[static_cast<std::size_t>(q)]; i < l.size(); ++i)
        if ((l[i].kind == ActionKind::send_f || l[i].kind == ActionKind::send_b) &&
            msg_of(q, l[i]) == k)
          return true;
    }
    return false;
  }

  // Completes a rendezvous when r's head and its peer's head are a matching SEND/RECV pair.
  bool rendezvous(int r, const Action& a, int t) {
    const Action* b = head(a.peer);
    if (!b) return false;
    const bool a_send = a.kind == ActionKind::send_f || a.kind == ActionKind::send_b;
    const bool b_recv = b->kind == ActionKind::recv_f || b->kind == ActionKind::recv_b;
    const bool b_send = b->kind == ActionKind::send_f || b->kind == ActionKind::send_b;
    if (!(a_send ? b_recv : b_send) || b->peer != r || msg_of(r, a) != msg_of(a.peer, *b))
      return false;
    const MsgKey k = msg_of(r, a);
    const int dst = std::get<4>(k);
    have[static_cast<std::size_t>(dst)][{std::get<0>(k), std::get<1>(k), std::get<2>(k)}] = t;
    ++pc[static_cast<std::size_t>(r)];
    ++pc[static_cast<std::size_t>(a.peer)];
    return true;
  }
};

std::string static_problems(const PipelineSchedule& s) {
  // (kind: 0 F, 1 B, 2 W; stage; micro-batch) -> times computed.
  std::map<std::tuple<int, int, int>, int> count;
  const bool split = s.training && splits_backward(s.kind);
  for (int r = 0; r < s.ranks; ++r)
    for (const auto& a : s.per_rank[static_cast<std::size_t>(r)]) {
      if (a.stage < 0 || a.stage >= s.stages() || a.micro_batch < 0 ||
          a.micro_batch >= s.micro_batches)
        return fmt::format(
            "rank {}: {} names a stage or micro-batch outside the pipeline ({} stages, {} "
            "micro-batches)",
            r, format_action(a), s.stages(), s.micro_batches);
      if (!a.is_compute() && (a.peer < 0 || a.peer >= s.ranks || a.peer == r))
        return fmt::format("rank {}: {} has peer {}, not another rank", r, format_action(a),
                           a.peer);
      if (!a.is_compute()) continue;
      if (s.rank_of(a.stage) != r)
        return fmt::format("rank {}: {} belongs to rank {}", r, format_action(a),
                           s.rank_of(a.stage));
      if (a.kind == ActionKind::weight && !split)
        return fmt::format(
            "rank {}: {} is a weight-gradient action, but {} {} does not split the backward", r,
            format_action(a), schedule_kind_name(s.kind), s.training ? "training" : "inference");
      const int kind = a.kind == ActionKind::forward ? 0 : a.kind == ActionKind::backward ? 1 : 2;
      if (++count[{kind, a.stage, a.micro_batch}] > 1)
        return fmt::format("rank {}: {} appears twice", r, format_action(a));
    }
  for (int st = 0; st < s.stages(); ++st)
    for (int k = 0; k < s.micro_batches; ++k) {
      if (!count.count({0, st, k}))
        return fmt::format("rank {}: {}F{} is missing", s.rank_of(st), st, k);
      if (s.training && !count.count({1, st, k}))
        return fmt::format("rank {}: {}B{} is missing", s.rank_of(st), st, k);
      if (split && !count.count({2, st, k}))
        return fmt::format("rank {}: {}W{} is missing", s.rank_of(st), st, k);
    }
  return {};
}

}  // namespace

ScheduleCheck check_schedule(const PipelineSchedule& s, SendMode mode) {
  ScheduleCheck c;
  if (static_cast<int>(s.per_rank.size()) != s.ranks) {
    c.problem = fmt::format("{} action lists for {} ranks", s.per_rank.size(), s.ranks);
    return c;
  }
  c.problem = static_problems(s);
  if (!c.problem.empty()) return c;
  Sim sim(s, mode);
  for (const auto& l : s.per_rank) {
    int n = 0;
    for (const auto& a : l) n += a.is_compute();
    c.compute_per_rank = std::max(c.compute_per_rank, n);
  }
  for (int t = 0;; ++t) {
    bool finished = true, progress = false;
    std::string row = fmt::format("{:>4} |", t);
    for (int r = 0; r < s.ranks; ++r) {
      bool computed = false;
      std::string cell = ".";
      while (const Action* a = sim.head(r)) {
        if (a->is_compute()) {
          if (computed) break;
          std::string why;
          if (!sim.inputs_ready(r, *a, t, why)) {
            if (!why.empty()) {
              c.problem = why;
              return c;
            }
            break;
          }
          if (a->kind != ActionKind::weight)  // nothing waits on a W
            sim.done[{a->kind == ActionKind::forward, a->stage, a->micro_batch}] = t;
          cell = format_action(*a);
          computed = true;
          ++sim.pc[static_cast<std::size_t>(r)];
          progress = true;
          c.makespan = t + 1;
          continue;
        }
        const bool is_send = a->kind == ActionKind::send_f || a->kind == ActionKind::send_b;
        if (is_send) {
          // A send needs its data: the stage's own compute for this micro-batch.
          if (!sim.done.count({a->kind == ActionKind::send_f, a->stage, a->micro_batch})) {
            c.problem =
                fmt::format("rank {}: {} sends before {}{}{} ran", r, format_action(*a), a->stage,
                            a->kind == ActionKind::send_f ? "F" : "B", a->micro_batch);
            return c;
          }
          if (mode == SendMode::buffered) {
            sim.inflight.emplace(sim.msg_of(r, *a), t);
            ++sim.pc[static_cast<std::size_t>(r)];
            progress = true;
            continue;
          }
          if (!sim.rendezvous(r, *a, t)) break;
          progress = true;
          continue;
        }
        const MsgKey k = sim.msg_of(r, *a);
        auto it = sim.inflight.find(k);
        if (mode == SendMode::buffered && it != sim.inflight.end()) {
          sim.have[static_cast<std::size_t>(r)][{std::get<0>(k), std::get<1>(k), std::get<2>(k)}] =
              it->second;
          sim.inflight.erase(it);
          ++sim.pc[static_cast<std::size_t>(r)];
          progress = true;
          continue;
        }
        if (mode == SendMode::rendezvous && sim.rendezvous(r, *a, t)) {
          progress = true;
          continue;
        }
        break;
      }
      if (sim.head(r)) finished = false;
      row += fmt::format(" {:>9}", cell);
    }
    if (c.grid.size() < 64 * 1024) c.grid += row + "\n";
    if (finished) break;
    if (!progress) {
      // Nothing moved in a whole step: name every blocked rank and what it waits on.
      std::string blocked;
      for (int r = 0; r < s.ranks; ++r) {
        const Action* a = sim.head(r);
        if (!a) continue;
        std::string what = format_action(*a);
        if (a->kind == ActionKind::recv_f || a->kind == ActionKind::recv_b) {
          if (mode == SendMode::buffered && !sim.has_pending_send(sim.msg_of(r, *a))) {
            c.problem =
                fmt::format("rank {}: {} from rank {} has no matching SEND", r, what, a->peer);
            return c;
          }
          what += fmt::format(" (from rank {})", a->peer);
        } else if (!a->is_compute()) {
          what += fmt::format(" (to rank {})", a->peer);
        }
        blocked += fmt::format("{}rank {} at {}", blocked.empty() ? "" : ", ", r, what);
      }
      c.problem = fmt::format("deadlock at step {}: {}", t, blocked);
      c.grid += fmt::format("{:>4} | !\n", t);
      return c;
    }
  }
  if (!sim.inflight.empty()) {
    const auto& [fwd, stage, mb, src, dst] = sim.inflight.begin()->first;
    c.problem = fmt::format("rank {}: {}{}{} sent to rank {} is never received", src, stage,
                            fwd ? "SEND_F" : "SEND_B", mb, dst);
    return c;
  }
  c.ok = true;
  return c;
}

}  // namespace hp::job
