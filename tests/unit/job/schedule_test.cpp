// Pipeline schedules: generated orders (the 1F1B table of docs/schedules.md), per-schedule
// invariants, the checker on every p/m/v combination and on deliberately broken lists, and the
// simulated bubble against the closed form.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "hp/job/schedule.h"

using namespace hp::job;

namespace {

std::string compute_order(const PipelineSchedule& s, int r) {
  std::string out;
  for (const auto& a : s.per_rank[static_cast<std::size_t>(r)]) {
    if (!a.is_compute()) continue;
    if (!out.empty()) out += ' ';
    out += (a.kind == ActionKind::forward ? "F" : "B") + std::to_string(a.micro_batch);
  }
  return out;
}

PipelineSchedule make(ScheduleKind k, int p, int m, int v, bool training) {
  auto s = make_schedule(k, p, m, v, training);
  REQUIRE(s);
  return *s;
}

int max_in_flight(const PipelineSchedule& s, int r) {
  int live = 0, peak = 0;
  for (const auto& a : s.per_rank[static_cast<std::size_t>(r)]) {
    if (a.kind == ActionKind::forward) peak = std::max(peak, ++live);
    if (a.kind == ActionKind::backward) --live;
  }
  return peak;
}

}  // namespace

TEST_CASE("schedule: 1F1B order for p=4, m=8 matches the reference table", "[schedule]") {
  auto s = make(ScheduleKind::one_f_one_b, 4, 8, 1, true);
  CHECK(compute_order(s, 0) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(compute_order(s, 1) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  CHECK(compute_order(s, 2) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  CHECK(compute_order(s, 3) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
}

TEST_CASE("schedule: peak in-flight activations are p-s for 1F1B and m for GPipe", "[schedule]") {
  for (int p = 1; p <= 6; ++p)
    for (int m = p; m <= 3 * p; ++m) {
      auto f = make(ScheduleKind::one_f_one_b, p, m, 1, true);
      auto g = make(ScheduleKind::gpipe, p, m, 1, true);
      for (int r = 0; r < p; ++r) {
        CHECK(max_in_flight(f, r) == p - r);
        CHECK(max_in_flight(g, r) == m);
      }
    }
}

TEST_CASE("schedule: interleaved order walks micro-batch groups of p per chunk", "[schedule]") {
  auto s = make(ScheduleKind::interleaved, 2, 4, 2, false);
  // rank 0 owns virtual stages 0 and 2: (mb0,c0) (mb1,c0) (mb0,c1) (mb1,c1) (mb2,c0) ...
  std::string got;
  for (const auto& a : s.per_rank[0]) got += format_action(a) + " ";
  CHECK(got == "0F0 0F1 2F0 2F1 0F2 0F3 2F2 2F3 ");
  // Every backward comes after its own forward on the same rank.
  auto t = make(ScheduleKind::interleaved, 4, 8, 2, true);
  for (const auto& l : t.per_rank) {
    std::map<std::pair<int, int>, std::size_t> pos;
    for (std::size_t i = 0; i < l.size(); ++i)
      pos[{l[i].stage * 2 + (l[i].kind == ActionKind::backward), l[i].micro_batch}] = i;
    for (const auto& a : l)
      if (a.kind == ActionKind::backward)
        CHECK(pos[{a.stage * 2, a.micro_batch}] < pos[{a.stage * 2 + 1, a.micro_batch}]);
  }
}

TEST_CASE("schedule: bad parameters are usage errors", "[schedule]") {
  CHECK_FALSE(make_schedule(ScheduleKind::gpipe, 0, 4, 1, false));
  CHECK_FALSE(make_schedule(ScheduleKind::one_f_one_b, 2, 4, 2, false));
  auto e = make_schedule(ScheduleKind::interleaved, 4, 6, 2, false);
  REQUIRE_FALSE(e);
  CHECK(e.error().message().find("multiple of") != std::string::npos);
  CHECK_FALSE(parse_schedule_kind("zigzag"));
  CHECK(*parse_schedule_kind("1f1b") == ScheduleKind::one_f_one_b);
}

TEST_CASE("schedule: every generated schedule simulates without deadlock", "[schedule]") {
  for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved})
    for (int v : {1, 2, 4}) {
      if (v > 1 && kind != ScheduleKind::interleaved) continue;
      for (int p = 1; p <= 8; ++p)
        for (int m = p; m <= 4 * p; ++m) {
          if (kind == ScheduleKind::interleaved && m % p) continue;
          for (bool training : {false, true}) {
            auto s = make(kind, p, m, v, training);
            INFO(schedule_kind_name(kind)
                 << " p=" << p << " m=" << m << " v=" << v << " training=" << training);
            auto lowered = lower_send_recv(s);
            auto c = check_schedule(lowered);
            REQUIRE(c.ok);
            CHECK(c.problem.empty());
            auto compute_only = check_schedule(s);
            REQUIRE(compute_only.ok);
            CHECK(compute_only.makespan == c.makespan);
          }
        }
    }
}

TEST_CASE("schedule: simulated bubble equals the closed form with unit costs", "[schedule]") {
  for (auto [kind, p, m, v] :
       std::vector<std::tuple<ScheduleKind, int, int, int>>{{ScheduleKind::gpipe, 4, 8, 1},
                                                            {ScheduleKind::one_f_one_b, 4, 8, 1},
                                                            {ScheduleKind::one_f_one_b, 8, 32, 1},
                                                            {ScheduleKind::gpipe, 2, 2, 1},
                                                            {ScheduleKind::interleaved, 4, 8, 2},
                                                            {ScheduleKind::interleaved, 2, 4, 4}}) {
    for (bool training : {false, true}) {
      auto c = check_schedule(lower_send_recv(make(kind, p, m, v, training)));
      REQUIRE(c.ok);
      INFO(schedule_kind_name(kind)
           << " p=" << p << " m=" << m << " v=" << v << " training=" << training << "\n"
           << c.grid);
      const int per_pass = m * v + p - 1;  // ideal makespan of one direction
      CHECK(c.makespan == (training ? 2 : 1) * per_pass);
      CHECK(c.bubble() == Approx(bubble_fraction(kind, p, m, v)));
    }
  }
  CHECK(bubble_fraction(ScheduleKind::one_f_one_b, 4, 8, 1) == Approx(3.0 / 11));
  CHECK(bubble_fraction(ScheduleKind::interleaved, 4, 8, 2) == Approx(3.0 / 19));
}

TEST_CASE("schedule: the checker finds deadlocks and data used before it arrived", "[schedule]") {
  // Rank 0 waits for the gradient of micro-batch 0 before computing its forward: a cycle.
  PipelineSchedule s = lower_send_recv(make(ScheduleKind::one_f_one_b, 2, 2, 1, true));
  auto& r0 = s.per_rank[0];
  REQUIRE(format_action(r0[4]) == "0RECV_B0");
  std::rotate(r0.begin(), r0.begin() + 4, r0.begin() + 5);
  auto c = check_schedule(s);
  REQUIRE_FALSE(c.ok);
  CHECK(c.problem ==
        "deadlock at step 0: rank 0 at 0RECV_B0 (from rank 1), rank 1 at 1RECV_F0 (from rank 0)");

  // Rank 1 computes micro-batch 1 before receiving it.
  PipelineSchedule w = lower_send_recv(make(ScheduleKind::one_f_one_b, 2, 2, 1, false));
  std::swap(w.per_rank[1][0], w.per_rank[1][3]);
  auto d = check_schedule(w);
  REQUIRE_FALSE(d.ok);
  CHECK(d.problem.find("without a RECV_F first") != std::string::npos);

  // A true cycle under rendezvous sends: both ranks send to each other before receiving.
  PipelineSchedule t = lower_send_recv(make(ScheduleKind::one_f_one_b, 2, 4, 1, true));
  auto ok = check_schedule(t, SendMode::buffered);
  CHECK(ok.ok);
  auto dl = check_schedule(t, SendMode::rendezvous);
  REQUIRE_FALSE(dl.ok);
  CHECK(dl.problem.find("deadlock") != std::string::npos);
  CHECK(dl.problem.find("SEND") != std::string::npos);
}

TEST_CASE("schedule: the checker finds unmatched sends and receives", "[schedule]") {
  PipelineSchedule s = lower_send_recv(make(ScheduleKind::gpipe, 2, 2, 1, false));
  // Drop rank 0's second send: rank 1's RECV_F1 has nothing to match.
  auto& r0 = s.per_rank[0];
  r0.erase(r0.begin() + 3);
  auto c = check_schedule(s);
  REQUIRE_FALSE(c.ok);
  CHECK(c.problem == "rank 1: 1RECV_F1 from rank 0 has no matching SEND");

  PipelineSchedule t = lower_send_recv(make(ScheduleKind::gpipe, 2, 2, 1, false));
  t.per_rank[1].erase(t.per_rank[1].begin() + 2,
                      t.per_rank[1].begin() + 3);  // drop RECV_F1 and keep F1
  auto d = check_schedule(t);
  REQUIRE_FALSE(d.ok);
  CHECK(d.problem.find("without a RECV_F first") != std::string::npos);

  PipelineSchedule u = lower_send_recv(make(ScheduleKind::gpipe, 2, 2, 1, false));
  u.per_rank[0].push_back({ActionKind::send_f, 0, 1, 1});  // a duplicate send nobody receives
  auto e = check_schedule(u);
  REQUIRE_FALSE(e.ok);
  CHECK(e.problem == "rank 0: 0SEND_F1 sent to rank 1 is never received");
}

TEST_CASE("schedule: missing, repeated and misplaced work is reported", "[schedule]") {
  auto s = make(ScheduleKind::gpipe, 2, 3, 1, true);
  s.per_rank[1].pop_back();
  auto c = check_schedule(s);
  REQUIRE_FALSE(c.ok);
  CHECK(c.problem == "rank 1: 1B2 is missing");
  auto d = make(ScheduleKind::gpipe, 2, 3, 1, false);
  d.per_rank[0].push_back(d.per_rank[0][0]);
  CHECK(check_schedule(d).problem == "rank 0: 0F0 appears twice");
  auto e = make(ScheduleKind::gpipe, 2, 3, 1, false);
  e.per_rank[0][0].stage = 1;
  CHECK(check_schedule(e).problem == "rank 0: 1F0 belongs to rank 1");
  auto f = make(ScheduleKind::one_f_one_b, 2, 2, 1, true);
  std::swap(f.per_rank[1][0], f.per_rank[1][1]);  // B0 before F0 on the last stage
  CHECK(check_schedule(f).problem == "rank 1: 1B0 runs before 1F0");
}
