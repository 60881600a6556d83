// Pipeline schedule generation (GPipe, 1F1B, Megatron-style interleaved, and the zero-bubble ZB-H1
// and ZB-V of Qi et al. 2024) and lowering to SEND/RECV. The orders follow docs/schedules.md
// ("Generating the lists", "Split backward"): 1F1B warms up with min(p-s-1, m) forwards and then
// alternates F and B; interleaved walks micro-batches in groups of p per chunk and warms up with
// 2(p-s-1) + (v-1)p forwards. ZB-H1 is 1F1B with each W run s backwards late on rank s, so the last
// ranks pass gradients upstream without stopping for weight gradients and the deferred Ws fill the
// cool-down. ZB-V has no such closed order: its lists come from a unit-cost list scheduler (see
// zbv_lists). The checker is in schedule_check.cpp.
#include <fmt/core.h>

#include <algorithm>
#include <climits>
#include <tuple>

#include "hp/job/schedule.h"

namespace hp::job {

Expected<ScheduleKind> parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::gpipe;
  if (name == "1f1b") return ScheduleKind::one_f_one_b;
  if (name == "interleaved") return ScheduleKind::interleaved;
  if (name == "zb-h1") return ScheduleKind::zb_h1;
  if (name == "zbv") return ScheduleKind::zbv;
  return Error(Errc::bad_input, fmt::format("unknown pipeline schedule '{}'", name), "",
               "schedules: gpipe, 1f1b, interleaved, zb-h1, zbv");
}

bool splits_backward(ScheduleKind k) { return k == ScheduleKind::zb_h1 || k == ScheduleKind::zbv; }

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
    case ScheduleKind::zb_h1: return "zb-h1";
    case ScheduleKind::zbv: return "zbv";
  }
  return "?";
}

std::string format_action(const Action& a) {
  const char* k = "";
  switch (a.kind) {
    case ActionKind::forward: k = "F"; break;
    case ActionKind::backward: k = "B"; break;
    case ActionKind::weight: k = "W"; break;
    case ActionKind::send_f: k = "SEND_F"; break;
    case ActionKind::recv_f: k = "RECV_F"; break;
    case ActionKind::send_b: k = "SEND_B"; break;
    case ActionKind::recv_b: k = "RECV_B"; break;
  }
  return fmt::format("{}{}{}", a.stage, k, a.micro_batch);
}

namespace {

Action compute(ActionKind k, int stage, int mb) { return Action{k, stage, mb, -1}; }

// Emits warm-up forwards, then F/B pairs, then the remaining backwards (the 1F1B shape); with
// warmup >= the number of forwards this degenerates to all forwards, then all backwards.
void one_f_one_b(std::vector<Action>& out, const std::vector<Action>& fwd,
                 const std::vector<Action>& bwd, std::size_t warmup, bool training) {
  warmup = std::min(warmup, fwd.size());
  std::size_t f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back(fwd[f]);
  if (!training) {
    for (; f < fwd.size(); ++f) out.push_back(fwd[f]);
    return;
  }
  while (f < fwd.size()) {
    out.push_back(fwd[f++]);
    out.push_back(bwd[b++]);
  }
  while (b < bwd.size()) out.push_back(bwd[b++]);
}

// ZB-H1 on rank s (Qi et al. 2024, section 3): 1F1B's order with the backward split, where the W of
// micro-batch k waits until B of k + s has run. Rank s then holds at most (p - s) + s = p
// micro-batches between their F and their W, rank 0's 1F1B peak; the Ws deferred on the later
// ranks are run after their last B, in the time 1F1B leaves them idle while the last gradients
// travel upstream.
void zb_h1(std::vector<Action>& out, int p, int s, int m) {
  const int lag = s;
  int f = 0, b = 0, w = 0;
  auto backward = [&] {
    out.push_back(compute(ActionKind::backward, s, b++));
    if (b - w > lag) out.push_back(compute(ActionKind::weight, s, w++));
  };
  for (const int warmup = std::min(p - s - 1, m); f < warmup;)
    out.push_back(compute(ActionKind::forward, s, f++));
  while (f < m) {
    out.push_back(compute(ActionKind::forward, s, f++));
    backward();
  }
  while (b < m) backward();
  while (w < m) out.push_back(compute(ActionKind::weight, s, w++));
}

// ZB-V: a list scheduler run with unit costs. At every step each rank picks, among its ready
// actions, a forward before a backward before a weight gradient, the earliest micro-batch first and
// chunk 1 before chunk 0 on a tie; a forward only while the rank holds fewer than 2p chunk
// activations (F run, W not yet), the activation memory of 1F1B's rank 0 (p micro-batches of a
// p-th of the model, here chunks half that size). Every stage runs each kind in micro-batch order,
// so "ready" needs only the next index per (stage, kind). With F = B = W the result idles p-1 steps
// in all (the last rank's wait for its first input) once m >= 2p; docs/schedules.md, "Split
// backward", has the measured table. The step at which a rank ran an action is where it lands in
// the rank's list, so check_schedule replays exactly this timeline.
Expected<std::vector<std::vector<Action>>> zbv_lists(int p, int m, bool training) {
  const int stages = 2 * p;
  const auto idx = [&](int st, int k) { return static_cast<std::size_t>(st) * m + k; };
  std::vector<int> f_at(static_cast<std::size_t>(stages) * m, INT_MAX), b_at = f_at;
  std::vector<int> next_f(stages, 0), next_b(stages, 0), next_w(stages, 0), live(p, 0);
  std::vector<std::vector<Action>> out(static_cast<std::size_t>(p));
  const long total = static_cast<long>(stages) * m * (training ? 3 : 1);
  long ran = 0;
  for (int t = 0; ran < total; ++t) {
    std::vector<Action> picked(static_cast<std::size_t>(p));
    std::vector<bool> any(static_cast<std::size_t>(p), false);
    for (int r = 0; r < p; ++r) {
      // (kind rank, micro-batch, chunk 1 first) -> smaller is preferred.
      std::tuple<int, int, int> best{INT_MAX, 0, 0};
      for (int chunk : {1, 0}) {
        const int st = chunk == 0 ? r : stages - 1 - r;
        auto consider = [&](int rank, ActionKind k, int mb) {
          const std::tuple<int, int, int> key{rank, mb, -chunk};
          if (key < best) {
            best = key;
            picked[static_cast<std::size_t>(r)] = compute(k, st, mb);
            any[static_cast<std::size_t>(r)] = true;
          }
        };
        if (int k = next_f[st];
            k < m && (st == 0 || f_at[idx(st - 1, k)] < t) && (!training || live[r] < 2 * p))
          consider(0, ActionKind::forward, k);
        if (!training) continue;
        if (int k = next_b[st];
            k < m && f_at[idx(st, k)] < t && (st == stages - 1 || b_at[idx(st + 1, k)] < t))
          consider(1, ActionKind::backward, k);
        if (int k = next_w[st]; k < m && b_at[idx(st, k)] < t) consider(2, ActionKind::weight, k);
      }
    }
    bool progress = false;
    for (int r = 0; r < p; ++r) {
      if (!any[static_cast<std::size_t>(r)]) continue;
      const Action& a = picked[static_cast<std::size_t>(r)];
      progress = true;
      ++ran;
      out[static_cast<std::size_t>(r)].push_back(a);
      if (a.kind == ActionKind::forward) {
        f_at[idx(a.stage, a.micro_batch)] = t;
        ++next_f[a.stage];
        ++live[r];
      } else if (a.kind == ActionKind::backward) {
        b_at[idx(a.stage, a.micro_batch)] = t;
        ++next_b[a.stage];
      } else {
        ++next_w[a.stage];
        --live[r];
      }
    }
    // Cannot happen while a rank may hold 2p >= 2 activations (something is always ready), but a
    // scheduler that stops making progress must not loop forever.
    if (!progress)
      return Error(Errc::internal,
                   fmt::format("zbv list scheduler stalled at step {} (p={}, m={})", t, p, m));
  }
  return out;
}

}  // namespace

Expected<PipelineSchedule> make_schedule(ScheduleKind kind, int p, int m, int v, bool training) {
  if (p < 1 || m < 1 || v < 1)
    return Error(
        Errc::usage,
        fmt::format(
            "a pipeline needs at least 1 rank, micro-batch and chunk (got p={}, m={}, v={})", p, m,
            v));
  if (kind == ScheduleKind::zbv && v != 2)
    return Error(Errc::usage, fmt::format("zbv runs exactly 2 chunks per rank, got v={}", v), "",
                 "pass 2 chunks (the V: chunk 0 of rank r is stage r, chunk 1 is stage 2p-1-r)");
  if (v > 1 && kind != ScheduleKind::interleaved && kind != ScheduleKind::zbv)
    return Error(Errc::usage,
                 fmt::format("{} runs one chunk per rank, got v={}", schedule_kind_name(kind), v),
                 "", "several chunks per rank need schedule = \"interleaved\" (or \"zbv\", 2)");
  if (kind == ScheduleKind::interleaved && m % p != 0)
    return Error(Errc::usage, fmt::format("interleaved schedules need micro-batches ({}) to be a "
                                          "multiple of the pipeline ranks ({})",
                                          m, p));
  PipelineSchedule s;
  s.kind = kind;
  s.ranks = p;
  s.micro_batches = m;
  s.chunks = v;
  s.training = training;
  s.per_rank.resize(static_cast<std::size_t>(p));
  if (kind == ScheduleKind::zbv) {
    HP_ASSIGN_OR_RETURN(s.per_rank, zbv_lists(p, m, training));
    return s;
  }
  for (int r = 0; r < p; ++r) {
    auto& out = s.per_rank[static_cast<std::size_t>(r)];
    std::vector<Action> fwd, bwd;
    if (kind == ScheduleKind::zb_h1 && training) {
      zb_h1(out, p, r, m);
      continue;
    }
    if (kind != ScheduleKind::interleaved) {
      for (int k = 0; k < m; ++k) {
        fwd.push_back(compute(ActionKind::forward, r, k));
        bwd.push_back(compute(ActionKind::backward, r, k));
      }
      const std::size_t warmup = kind == ScheduleKind::gpipe
                                     ? static_cast<std::size_t>(m)
                                     : static_cast<std::size_t>(std::min(p - r - 1, m));
      one_f_one_b(out, fwd, bwd, warmup, training);
      continue;
    }
    // Interleaved: virtual id k -> (micro-batch, chunk) in groups of p micro-batches per chunk.
    for (int k = 0; k < m * v; ++k) {
      const int mb = (k / (p * v)) * p + k % p;
      const int chunk_f = (k / p) % v, chunk_b = v - 1 - (k / p) % v;
      fwd.push_back(compute(ActionKind::forward, chunk_f * p + r, mb));
      bwd.push_back(compute(ActionKind::backward, chunk_b * p + r, mb));
    }
    const std::size_t warmup =
        static_cast<std::size_t>(std::min(2 * (p - r - 1) + (v - 1) * p, m * v));
    one_f_one_b(out, fwd, bwd, warmup, training);
  }
  return s;
}

PipelineSchedule lower_send_recv(const PipelineSchedule& in) {
  PipelineSchedule s = in;
  const int last = in.stages() - 1;
  for (int r = 0; r < in.ranks; ++r) {
    auto& out = s.per_rank[static_cast<std::size_t>(r)];
    out.clear();
    for (const Action& a : in.per_rank[static_cast<std::size_t>(r)]) {
      // A weight gradient uses only its own rank's B output: no message.
      if (!a.is_compute() || a.kind == ActionKind::weight) {
        out.push_back(a);
        continue;
      }
      const bool fwd = a.kind == ActionKind::forward;
      const int from = fwd ? a.stage - 1 : a.stage + 1;  // where this action's input comes from
      const int to = fwd ? a.stage + 1 : a.stage - 1;    // where its output goes
      if (from >= 0 && from <= last && in.rank_of(from) != r)
        out.push_back({fwd ? ActionKind::recv_f : ActionKind::recv_b, a.stage, a.micro_batch,
                       in.rank_of(from)});
      out.push_back(a);
      if (to >= 0 && to <= last && in.rank_of(to) != r)
        out.push_back({fwd ? ActionKind::send_f : ActionKind::send_b, a.stage, a.micro_batch,
                       in.rank_of(to)});
    }
  }
  return s;
}

double bubble_fraction(ScheduleKind kind, int p, int m, int v, bool training) {
  if (kind != ScheduleKind::interleaved) v = 1;
  if (p < 1 || m < 1 || v < 1) return 0;
  // Split backward, F = B = W: each rank computes 3m (ZB-H1) or 6m (ZB-V, two chunks) steps and
  // idles p-1 of them.
  if (training && splits_backward(kind)) v = kind == ScheduleKind::zb_h1 ? 3 : 6;
  return static_cast<double>(p - 1) / (static_cast<double>(v) * m + p - 1);
}

}  // namespace hp::job
