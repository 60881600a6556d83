// Zero-bubble schedules (ZB-H1, ZB-V; docs/schedules.md, "Split backward"): the split backward's W
// actions, the V rank mapping, the checker on W, and the simulated bubble and activation memory
// against the closed forms of the docs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <tuple>

#include "hp/job/schedule.h"

using namespace hp::job;

namespace {

const char* letter(ActionKind k) {
  return k == ActionKind::forward ? "F" : k == ActionKind::backward ? "B" : "W";
}

std::string compute_order(const PipelineSchedule& s, int r) {
  std::string out;
  for (const auto& a : s.per_rank[static_cast<std::size_t>(r)]) {
    if (!a.is_compute()) continue;
    if (!out.empty()) out += ' ';
    out += letter(a.kind) + std::to_string(a.micro_batch);
  }
  return out;
}

PipelineSchedule make(ScheduleKind k, int p, int m, bool training) {
  auto s = make_schedule(k, p, m, k == ScheduleKind::zbv ? 2 : 1, training);
  REQUIRE(s);
  return *s;
}

// Micro-batches (model chunks) whose activations a rank holds: from the F to the W that frees the
// weight gradient's inputs, or to the B when the backward is not split.
int peak_live(const PipelineSchedule& s, int r) {
  int live = 0, peak = 0;
  const bool split = splits_backward(s.kind);
  for (const auto& a : s.per_rank[static_cast<std::size_t>(r)]) {
    if (a.kind == ActionKind::forward) peak = std::max(peak, ++live);
    if (a.kind == (split ? ActionKind::weight : ActionKind::backward)) --live;
  }
  return peak;
}

// The lists replayed with durations (f, b, w per stage; ZB-V chunks take half): each rank runs its
// list in order, an action starting when the rank is free and its inputs are done. Returns the
// makespan less one rank's compute, the idle time of every rank (all do the same work).
double idle_seconds(const PipelineSchedule& s, double f, double b, double w) {
  const double scale = s.kind == ScheduleKind::zbv ? 0.5 : 1.0;
  std::map<std::tuple<ActionKind, int, int>, double> end;
  std::vector<std::size_t> pc(static_cast<std::size_t>(s.ranks), 0);
  std::vector<double> free(static_cast<std::size_t>(s.ranks), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.ranks; ++r) {
      const auto& l = s.per_rank[static_cast<std::size_t>(r)];
      for (auto& i = pc[static_cast<std::size_t>(r)]; i < l.size(); ++i) {
        const Action& a = l[i];
        std::vector<std::tuple<ActionKind, int, int>> deps;
        if (a.kind == ActionKind::forward && a.stage > 0)
          deps.push_back({ActionKind::forward, a.stage - 1, a.micro_batch});
        if (a.kind == ActionKind::backward) {
          deps.push_back({ActionKind::forward, a.stage, a.micro_batch});
          if (a.stage + 1 < s.stages())
            deps.push_back({ActionKind::backward, a.stage + 1, a.micro_batch});
        }
        if (a.kind == ActionKind::weight)
          deps.push_back({ActionKind::backward, a.stage, a.micro_batch});
        double start = free[static_cast<std::size_t>(r)];
        bool ready = true;
        for (const auto& d : deps) {
          auto it = end.find(d);
          if (it == end.end())
            ready = false;
          else
            start = std::max(start, it->second);
        }
        if (!ready) break;
        const double cost = scale * (a.kind == ActionKind::forward    ? f
                                     : a.kind == ActionKind::backward ? b
                                                                      : w);
        end[{a.kind, a.stage, a.micro_batch}] = free[static_cast<std::size_t>(r)] = start + cost;
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.ranks; ++r)
    REQUIRE(pc[static_cast<std::size_t>(r)] == s.per_rank[static_cast<std::size_t>(r)].size());
  return *std::max_element(free.begin(), free.end()) - s.micro_batches * (f + b + w);
}

std::vector<int> micro_batch_counts(int p) {
  return {1, 2, 3, p, p + 1, 2 * p - 1, 2 * p, 2 * p + 1, 3 * p, 3 * p + 2};
}

}  // namespace

TEST_CASE("zb: names, W formatting and the V rank mapping", "[schedule][zb]") {
  CHECK(*parse_schedule_kind("zb-h1") == ScheduleKind::zb_h1);
  CHECK(*parse_schedule_kind("zbv") == ScheduleKind::zbv);
  CHECK(std::string(schedule_kind_name(ScheduleKind::zb_h1)) == "zb-h1");
  CHECK(std::string(schedule_kind_name(ScheduleKind::zbv)) == "zbv");
  auto bad = parse_schedule_kind("zb-h2");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().what.hint.find("zb-h1, zbv") != std::string::npos);
  CHECK(format_action({ActionKind::weight, 1, 0, -1}) == "1W0");
  CHECK(splits_backward(ScheduleKind::zbv));
  CHECK_FALSE(splits_backward(ScheduleKind::one_f_one_b));

  auto v = make(ScheduleKind::zbv, 4, 8, true);
  CHECK(v.stages() == 8);
  const std::vector<int> want{0, 1, 2, 3, 3, 2, 1, 0};
  for (int st = 0; st < 8; ++st) CHECK(v.rank_of(st) == want[static_cast<std::size_t>(st)]);
  // Interleaved keeps Megatron's mapping.
  auto i = *make_schedule(ScheduleKind::interleaved, 4, 8, 2, true);
  CHECK(i.rank_of(5) == 1);
}

TEST_CASE("zb: ZB-H1 order for p=4, m=8 matches the table of docs/schedules.md", "[schedule][zb]") {
  auto s = make(ScheduleKind::zb_h1, 4, 8, true);
  CHECK(compute_order(s, 0) ==
        "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
  CHECK(compute_order(s, 1) ==
        "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7");
  CHECK(compute_order(s, 2) ==
        "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7");
  CHECK(compute_order(s, 3) ==
        "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
  // Inference is 1F1B's forwards.
  auto inf = make(ScheduleKind::zb_h1, 4, 8, false);
  auto ref = make(ScheduleKind::one_f_one_b, 4, 8, false);
  CHECK(inf.per_rank == ref.per_rank);
}

TEST_CASE("zb: every F, B and W appears once per (stage, micro-batch), W after its B",
          "[schedule][zb]") {
  for (auto kind : {ScheduleKind::zb_h1, ScheduleKind::zbv})
    for (int p = 1; p <= 4; ++p)
      for (int m : micro_batch_counts(p)) {
        auto s = make(kind, p, m, true);
        INFO(schedule_kind_name(kind) << " p=" << p << " m=" << m);
        std::map<std::tuple<ActionKind, int, int>, int> seen;
        for (int r = 0; r < p; ++r) {
          std::map<std::pair<int, int>, bool> b_done;
          for (const auto& a : s.per_rank[static_cast<std::size_t>(r)]) {
            CHECK(s.rank_of(a.stage) == r);
            ++seen[{a.kind, a.stage, a.micro_batch}];
            if (a.kind == ActionKind::backward) b_done[{a.stage, a.micro_batch}] = true;
            if (a.kind == ActionKind::weight) CHECK(b_done[{a.stage, a.micro_batch}]);
          }
        }
        CHECK(seen.size() == static_cast<std::size_t>(3 * s.stages() * m));
        for (const auto& [key, n] : seen) CHECK(n == 1);
      }
}

TEST_CASE("zb: lowering adds no messages for W, and none inside the V's turn", "[schedule][zb]") {
  auto s = lower_send_recv(make(ScheduleKind::zbv, 4, 8, true));
  int sends_f = 0;
  for (int r = 0; r < 4; ++r)
    for (const auto& a : s.per_rank[static_cast<std::size_t>(r)]) {
      if (a.kind == ActionKind::send_f) ++sends_f;
      if (a.kind == ActionKind::send_f || a.kind == ActionKind::send_b) {
        // Stage 3 -> 4 (forward) and 4 -> 3 (backward) stay on rank 3.
        CHECK_FALSE((r == 3 && a.kind == ActionKind::send_f && a.stage == 3));
        CHECK_FALSE((r == 3 && a.kind == ActionKind::send_b && a.stage == 4));
        CHECK(a.peer == s.rank_of(a.kind == ActionKind::send_f ? a.stage + 1 : a.stage - 1));
      }
    }
  CHECK(sends_f == 6 * 8);  // 7 stage boundaries per micro-batch, one of them (3|4) on a rank
  auto h = lower_send_recv(make(ScheduleKind::zb_h1, 2, 2, true));
  CHECK(compute_order(h, 1) == "F0 B0 F1 B1 W0 W1");
  std::string got;
  for (const auto& a : h.per_rank[1]) got += format_action(a) + " ";
  CHECK(got == "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1W0 1W1 ");
}

TEST_CASE("zb: every schedule simulates without deadlock", "[schedule][zb]") {
  for (auto kind : {ScheduleKind::zb_h1, ScheduleKind::zbv})
    for (int p = 1; p <= 6; ++p)
      for (int m : micro_batch_counts(p))
        for (bool training : {false, true}) {
          auto s = make(kind, p, m, training);
          INFO(schedule_kind_name(kind) << " p=" << p << " m=" << m << " training=" << training);
          auto c = check_schedule(lower_send_recv(s));
          INFO(c.problem << "\n" << c.grid);
          REQUIRE(c.ok);
          auto compute_only = check_schedule(s);
          REQUIRE(compute_only.ok);
          CHECK(compute_only.makespan == c.makespan);
          if (training) CHECK(c.compute_per_rank == (kind == ScheduleKind::zbv ? 6 : 3) * m);
        }
}

TEST_CASE("zb: simulated bubble equals the closed forms and is below 1F1B's", "[schedule][zb]") {
  for (int p = 2; p <= 8; ++p)
    for (int m : {p, p + 1, 2 * p, 2 * p + 1, 3 * p, 4 * p}) {
      INFO("p=" << p << " m=" << m);
      auto one = check_schedule(lower_send_recv(make(ScheduleKind::one_f_one_b, p, m, true)));
      auto h1 = check_schedule(lower_send_recv(make(ScheduleKind::zb_h1, p, m, true)));
      REQUIRE(h1.ok);
      INFO(h1.grid);
      CHECK(h1.makespan == 3 * m + p - 1);
      CHECK(h1.bubble() == Approx(bubble_fraction(ScheduleKind::zb_h1, p, m, 1, true)));
      CHECK(h1.bubble() < one.bubble());
      if (m < 2 * p) continue;
      auto v = check_schedule(lower_send_recv(make(ScheduleKind::zbv, p, m, true)));
      REQUIRE(v.ok);
      INFO(v.grid);
      CHECK(v.makespan == 6 * m + p - 1);
      CHECK(v.bubble() == Approx(bubble_fraction(ScheduleKind::zbv, p, m, 2, true)));
      CHECK(v.bubble() < h1.bubble());
    }
  // Below m = 2p ZB-V may idle more (docs/schedules.md: p = 4, m = 5 idles 5 steps).
  CHECK(check_schedule(make(ScheduleKind::zbv, 4, 5, true)).makespan == 6 * 5 + 5);
  CHECK(bubble_fraction(ScheduleKind::zb_h1, 4, 8, 1, true) == Approx(3.0 / 27));
  CHECK(bubble_fraction(ScheduleKind::zbv, 4, 8, 2, true) == Approx(3.0 / 51));
  // Inference lists are forwards only: 1F1B's bubble.
  for (auto kind : {ScheduleKind::zb_h1, ScheduleKind::zbv}) {
    auto c = check_schedule(lower_send_recv(make(kind, 4, 8, false)));
    REQUIRE(c.ok);
    CHECK(c.bubble() == Approx(bubble_fraction(kind, 4, 8, 2, false)));
    CHECK(c.bubble() == Approx(3.0 / 11));
  }
}

TEST_CASE("zb: idle seconds with unequal costs follow docs/schedules.md", "[schedule][zb]") {
  // ZB-H1: (p-1)(f + max(b-w, 0)) for every cost triple.
  for (int p : {2, 4, 6})
    for (auto [f, b, w] : std::vector<std::tuple<double, double, double>>{
             {1, 1, 1}, {1, 1, 0.5}, {1, 2, 1}, {2, 1, 1}, {1, 1, 2}, {1, 0.5, 1.5}, {1, 1, 0.2}}) {
      INFO("p=" << p << " f=" << f << " b=" << b << " w=" << w);
      auto h1 = make(ScheduleKind::zb_h1, p, 4 * p, true);
      CHECK(idle_seconds(h1, f, b, w) == Approx((p - 1) * (f + std::max(b - w, 0.0))));
      for (int m = 1; m < p; ++m)  // fewer micro-batches than ranks: p - m Ws find no gap
        CHECK(idle_seconds(make(ScheduleKind::zb_h1, p, m, true), f, b, w) ==
              Approx((p - 1) * (f + std::max(b - w, 0.0)) + (p - m) * std::min(b, w)));
      auto one = make(ScheduleKind::one_f_one_b, p, 4 * p, true);
      // 1F1B's backward is b + w in one piece.
      CHECK(idle_seconds(one, f, b + w, 0) == Approx((p - 1) * (f + b + w)));
    }
  // ZB-V: (p-1) f/2 at f = b = w; the documented sensitivity to b > w.
  for (int p : {2, 4, 6})
    CHECK(idle_seconds(make(ScheduleKind::zbv, p, 4 * p, true), 1, 1, 1) == Approx((p - 1) * 0.5));
  auto v = make(ScheduleKind::zbv, 4, 16, true);
  CHECK(idle_seconds(v, 1, 1.1, 0.9) == Approx(5.95));
  CHECK(idle_seconds(v, 1, 0.9, 1.1) == Approx(1.55));
}

TEST_CASE("zb: activation memory stays at 1F1B's peak", "[schedule][zb]") {
  for (int p = 1; p <= 8; ++p)
    for (int m : micro_batch_counts(p)) {
      INFO("p=" << p << " m=" << m);
      auto h1 = make(ScheduleKind::zb_h1, p, m, true);
      auto v = make(ScheduleKind::zbv, p, m, true);
      auto one = make(ScheduleKind::one_f_one_b, p, m, true);
      for (int r = 0; r < p; ++r) {
        // ZB-H1: p micro-batches on every rank, the peak 1F1B has on rank 0 only.
        CHECK(peak_live(h1, r) == std::min(m, p));
        CHECK(peak_live(h1, r) <= peak_live(one, 0));
        // ZB-V: at most 2p chunks of half a 1F1B stage each.
        CHECK(peak_live(v, r) <= 2 * p);
        CHECK(peak_live(v, r) <= 2 * m);
      }
    }
}

TEST_CASE("zb: bad parameters are usage errors with a hint", "[schedule][zb]") {
  for (int v : {1, 3}) {
    auto e = make_schedule(ScheduleKind::zbv, 4, 8, v, true);
    REQUIRE_FALSE(e);
    CHECK(e.error().code == hp::Errc::usage);
    CHECK(e.error().message().find("exactly 2 chunks") != std::string::npos);
    CHECK_FALSE(e.error().what.hint.empty());
  }
  auto h = make_schedule(ScheduleKind::zb_h1, 4, 8, 2, true);
  REQUIRE_FALSE(h);
  CHECK(h.error().code == hp::Errc::usage);
  CHECK(h.error().message().find("one chunk per rank") != std::string::npos);
  CHECK_FALSE(make_schedule(ScheduleKind::zbv, 0, 8, 2, true));
  CHECK_FALSE(make_schedule(ScheduleKind::zb_h1, 2, 0, 1, true));
}

TEST_CASE("zb: the checker finds misplaced, missing and stray W actions", "[schedule][zb]") {
  // A W before its own B can never run: the B is behind it in the same list.
  auto s = make(ScheduleKind::zb_h1, 2, 2, true);
  auto& r1 = s.per_rank[1];
  REQUIRE(compute_order(s, 1) == "F0 B0 F1 B1 W0 W1");
  std::swap(r1[1], r1[4]);  // F0 W0 F1 B1 B0 W1
  CHECK(check_schedule(s).problem == "rank 1: 1W0 runs before 1B0");

  auto t = make(ScheduleKind::zb_h1, 2, 2, true);
  t.per_rank[0].pop_back();
  CHECK(check_schedule(t).problem == "rank 0: 0W1 is missing");

  auto u = make(ScheduleKind::one_f_one_b, 2, 2, true);
  u.per_rank[0].push_back({ActionKind::weight, 0, 0, -1});
  CHECK(check_schedule(u).problem ==
        "rank 0: 0W0 is a weight-gradient action, but 1f1b training does not split the backward");

  auto w = make(ScheduleKind::zbv, 2, 4, true);
  auto& r0 = w.per_rank[0];
  auto it = std::find_if(r0.begin(), r0.end(), [](const Action& a) {
    return a.kind == ActionKind::weight && a.stage == 3;
  });
  REQUIRE(it != r0.end());
  const Action repeated = *it;  // a copy: push_back may move the list and invalidate `it`
  r0.push_back(repeated);
  CHECK(check_schedule(w).problem ==
        "rank 0: 3W" + std::to_string(repeated.micro_batch) + " appears twice");
  // W of stage 3 on rank 1 (stage 3 is rank 0's in the V).
  auto x = make(ScheduleKind::zbv, 2, 4, true);
  x.per_rank[1].push_back({ActionKind::weight, 3, 0, -1});
  CHECK(check_schedule(x).problem == "rank 1: 3W0 belongs to rank 0");
}
