// The offload policy on synthetic stages: under a budget below the un-offloaded peak every slot of
// the timeline stays under the budget; transfers are timed on the links; a budget below any
// schedule's need fails with the need.
#include <catch2/catch.hpp>

#include <algorithm>

#include "hp/offload/policy.h"

using namespace hp::offload;
using hp::recipe::Schedule;

namespace {

// A 1F1B stage of `units` equal blocks: 64 MB of states, 32 MB of activations per micro-batch each.
StageInput stage(std::int64_t k = 0, std::int64_t units = 6, Schedule s = Schedule::one_f_one_b) {
  StageInput in;
  in.stage = k;
  in.stages = 4;
  in.micro_batches = 8;
  in.schedule = s;
  in.virtual_stages = s == Schedule::interleaved ? 2 : 1;
  for (std::int64_t i = 0; i < units; ++i) {
    Unit u;
    u.name = "h." + std::to_string(i);
    u.chunk = s == Schedule::interleaved ? i * 2 / units : 0;
    u.param_count = 4e6;
    u.parameters = 8e6, u.gradients = 8e6, u.optimizer = 48e6;
    u.act = 32e6;
    u.act_transient = 8e6;
    u.fwd = 2e-3, u.bwd = 4e-3;
    u.opt_bytes = 32 * 4e6, u.opt = u.opt_bytes / 1e12, u.update_bytes = 8e6;
    in.units.push_back(u);
  }
  in.buffers = 4e6;
  in.workspace = 2e6;
  return in;
}

PolicyOptions options(double budget, std::vector<Target> targets, double bw = 25e9) {
  PolicyOptions o;
  o.budget = budget;
  o.targets = std::move(targets);
  o.h2d = o.d2h = bw;
  o.host_bandwidth = 100e9;
  return o;
}

const std::vector<Target> kAll = {Target::optimizer, Target::gradients, Target::activations,
                                  Target::parameters};

void require_under_budget(const StageSchedule& s, double budget) {
  for (std::size_t i = 0; i < s.memory.size(); ++i) {
    INFO("slot " << i);
    REQUIRE(sum(s.memory[i]) <= budget * (1 + 1e-12));
  }
  REQUIRE(s.peak_bytes <= budget * (1 + 1e-12));
}

}  // namespace

TEST_CASE("every slot stays under a budget below the un-offloaded peak", "[offload][policy]") {
  for (auto sched : {Schedule::one_f_one_b, Schedule::gpipe, Schedule::interleaved})
    for (std::int64_t k : {0, 3}) {
      const StageInput in = stage(k, 6, sched);
      const Timeline base = simulate(in);
      for (double frac : {0.9, 0.7, 0.5}) {
        const double budget = frac * base.peak_bytes();
        INFO("schedule " << static_cast<int>(sched) << " stage " << k << " budget fraction "
                         << frac);
        auto s = plan_offload(in, base, options(budget, kAll));
        REQUIRE(s.ok());
        require_under_budget(*s, budget);
        REQUIRE(s->memory.size() == base.slots.size());
        CHECK(s->peak_bytes < base.peak_bytes());
        CHECK(!s->transfers.empty());
        // Waiting only adds time; the host optimizer can only remove the device's optimizer steps.
        double host_opt = 0;
        for (std::size_t u = in.units.size() - static_cast<std::size_t>(s->host_units);
             u < in.units.size(); ++u)
          host_opt += in.units[u].opt;
        CHECK(s->step >= (base.step - host_opt) * (1 - 1e-12));
        CHECK(s->step == Approx(base.step - host_opt + s->exposed));
        CHECK(s->exposed >= 0);
      }
    }
}

TEST_CASE("each state kind alone can bring the peak under the budget", "[offload][policy]") {
  const StageInput in = stage();
  const Timeline base = simulate(in);
  // Activations alone: the activation share of the peak can go.
  {
    const double budget =
        base.peak_bytes() - 0.5 * base.slots[base.peak].memory[static_cast<int>(Kind::activations)];
    auto s = plan_offload(in, base, options(budget, {Target::activations}));
    REQUIRE(s.ok());
    require_under_budget(*s, budget);
    CHECK(s->evictions > 0);
    CHECK(s->host_units == 0);
  }
  // The optimizer step on the host: optimizer states leave the device; the split is chosen.
  {
    const double budget = base.peak_bytes() - 3 * 48e6;
    auto s = plan_offload(in, base, options(budget, {Target::optimizer}));
    REQUIRE(s.ok());
    require_under_budget(*s, budget);
    CHECK(s->host_units >= 3);
    CHECK(s->optimizer_ratio == Approx(static_cast<double>(s->host_units) / 6));
  }
  // A fixed ratio is honoured.
  {
    auto o = options(base.peak_bytes() * 2, {Target::optimizer});
    o.optimizer_ratio = 0.5;
    auto s = plan_offload(in, base, o);
    REQUIRE(s.ok());
    CHECK(s->host_units == 3);
  }
  // Parameters by layer.
  {
    const double budget = base.peak_bytes() - 3 * 8e6;
    auto s = plan_offload(in, base, options(budget, {Target::parameters}));
    REQUIRE(s.ok());
    require_under_budget(*s, budget);
  }
}

TEST_CASE("transfers hide behind compute on a fast link and are exposed on a slow one",
          "[offload][policy]") {
  const StageInput in = stage();
  const Timeline base = simulate(in);
  const double budget = 0.7 * base.peak_bytes();
  auto fast = plan_offload(in, base, options(budget, {Target::activations}, 1e15));
  auto slow = plan_offload(in, base, options(budget, {Target::activations}, 1e9));
  REQUIRE(fast.ok());
  REQUIRE(slow.ok());
  CHECK(fast->exposed < 1e-4);
  CHECK(slow->exposed > 1e-3);
  double exposed = 0;
  for (const auto& x : slow->transfers) {
    CHECK(x.end >= x.start);
    CHECK(x.end - x.start == Approx(x.bytes / 1e9));
    exposed += x.exposed;
  }
  CHECK(exposed == Approx(slow->exposed));
  CHECK(slow->step == Approx(base.step + slow->exposed));
}

TEST_CASE("a budget below every schedule's need is infeasible and says how much is needed",
          "[offload][policy]") {
  const StageInput in = stage();
  const Timeline base = simulate(in);
  auto s = plan_offload(in, base, options(1e6, kAll));
  REQUIRE(!s.ok());
  CHECK(s.error().code == hp::Errc::infeasible);
  CHECK_THAT(s.error().message(), Catch::Contains("needs at least"));
  // The need it names is enough: planning with exactly that budget works and stays under it.
  auto lower = plan_offload(in, base, options(base.peak_bytes() * 0.99, kAll));
  REQUIRE(lower.ok());
  auto at = plan_offload(in, base, options(lower->lower_bound, kAll));
  REQUIRE(at.ok());
  require_under_budget(*at, lower->lower_bound);
}

TEST_CASE("state kinds parse; unknown ones are usage errors", "[offload][policy]") {
  auto ok = parse_targets({"activations", "kv_cache", "activations"});
  REQUIRE(ok.ok());
  CHECK(ok->size() == 2);
  auto bad = parse_targets({"weights"});
  REQUIRE(!bad.ok());
  CHECK(bad.error().code == hp::Errc::usage);
  CHECK_THAT(bad.error().message(), Catch::Contains("unknown state kind 'weights'"));
  CHECK(!parse_targets({"gradients"}).ok());
}
