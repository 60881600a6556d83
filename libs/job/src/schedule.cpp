// Pipeline schedule generation (GPipe, 1F1B, Megatron-style interleaved) and lowering to SEND/RECV.
// The orders follow docs/schedules.md ("Generating the lists"): 1F1B warms up with min(p-s-1, m)
// forwards and then alternates F and B; interleaved walks micro-batches in groups of p per chunk
// and warms up with 2(p-s-1) + (v-1)p forwards. The checker is in schedule_check.cpp.
#include <fmt/core.h>

#include <algorithm>

#include "hp/job/schedule.h"

namespace hp::job {

Expected<ScheduleKind> parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::gpipe;
  if (name == "1f1b") return ScheduleKind::one_f_one_b;
  if (name == "interleaved") return ScheduleKind::interleaved;
  return Error(Errc::bad_input, fmt::format("unknown pipeline schedule '{}'", name), "",
               "schedules: gpipe, 1f1b, interleaved");
}

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
  }
  return "?";
}

std::string format_action(const Action& a) {
  const char* k = "";
  switch (a.kind) {
    case ActionKind::forward: k = "F"; break;
    case ActionKind::backward: k = "B"; break;
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

}  // namespace

Expected<PipelineSchedule> make_schedule(ScheduleKind kind, int p, int m, int v, bool training) {
  if (p < 1 || m < 1 || v < 1)
    return Error(
        Errc::usage,
        fmt::format(
            "a pipeline needs at least 1 rank, micro-batch and chunk (got p={}, m={}, v={})", p, m,
            v));
  if (v > 1 && kind != ScheduleKind::interleaved)
    return Error(Errc::usage,
                 fmt::format("{} runs one chunk per rank, got v={}", schedule_kind_name(kind), v),
                 "", "several chunks per rank need schedule = \"interleaved\"");
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
  for (int r = 0; r < p; ++r) {
    auto& out = s.per_rank[static_cast<std::size_t>(r)];
    std::vector<Action> fwd, bwd;
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
      if (!a.is_compute()) {
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

double bubble_fraction(ScheduleKind kind, int p, int m, int v) {
  if (kind != ScheduleKind::interleaved) v = 1;
  if (p < 1 || m < 1 || v < 1) return 0;
  return static_cast<double>(p - 1) / (static_cast<double>(v) * m + p - 1);
}

}  // namespace hp::job
