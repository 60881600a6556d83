// Offload at run time (docs/offload.md, "Offload at run time") on the cpu plugin with its device
// budget enforced:
//  (a) without a budget the tiny models match their reference outputs and the plugin reports the
//      device peak;
//  (b) with a budget below that peak and the schedule (weights, and activations, in the host pool)
//      the outputs equal the un-offloaded ones and the device peak the plugin measured stays under
//      the budget;
//  (c) the same budget without offload fails with an error naming the budget and the tensor;
// plus the arena itself (refusal, mem_stats, mem_info) and the recipe -> OffloadRun mapping.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"
#include "hp/job/offload_run.h"
#include "hp/model/model.h"
#include "hp/plugin/registry.h"

using namespace hp;
using namespace hp::exec;
using namespace hp::job;

namespace {

std::shared_ptr<plugin::Backend> open_cpu(const std::vector<std::string>& options) {
  plugin::SearchOptions so;
  so.use_env = false;
  so.use_install_dir = false;
  so.open_options = options;
  so.open_options.push_back("threads=1");
  auto reg = plugin::discover(so);
  REQUIRE(reg.ok());
  auto b = reg->find("cpu");
  REQUIRE(b);
  return b;
}

struct Case {
  model::Model model;
  std::vector<HostTensor> inputs, expected;
};

Case load(const std::string& name) {
  const std::string dir = std::string(HP_SOURCE_DIR) + "/tests/data/models/";
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  auto m = model::load_model(dir + name + ".onnx", lo);
  REQUIRE(m.ok());
  auto in = read_tensor_dir(dir + name + ".io/test_data_set_0", "input");
  REQUIRE(in.ok());
  auto out = read_tensor_dir(dir + name + ".io/test_data_set_0", "output");
  REQUIRE(out.ok());
  auto ex = Executor::create(*m, {nullptr, open_cpu({}), nullptr, {}});
  REQUIRE(ex.ok());
  auto bound = bind_inputs((*ex)->inputs(), std::move(*in), "test_data_set_0");
  REQUIRE(bound.ok());
  return {std::move(*m), std::move(*bound), std::move(*out)};
}

struct Result {
  Expected<std::vector<HostTensor>> outputs;
  ExecStats stats;
};

Result run(const Case& c, std::uint64_t budget, OffloadConfig off, int runs = 1) {
  std::vector<std::string> opts;
  if (budget) opts.push_back("device_budget=" + std::to_string(budget));
  auto cpu = open_cpu(opts);
  ExecOptions eo{nullptr, cpu, nullptr, off};
  auto ex = Executor::create(c.model, eo);
  REQUIRE(ex.ok());
  Result r{Error(Errc::internal, "not run"), {}};
  for (int k = 0; k < runs; ++k) {
    r.outputs = (*ex)->run(c.inputs);
    r.stats = (*ex)->stats();
    if (!r.outputs.ok()) break;
  }
  return r;
}

float max_abs(const HostTensor& a, const HostTensor& b) {
  REQUIRE(a.dtype == HP_F32);
  REQUIRE(a.dims == b.dims);
  REQUIRE(a.data.size() == b.data.size());
  float m = 0;
  for (std::size_t i = 0; i < a.data.size() / 4; ++i) {
    float x, y;
    std::memcpy(&x, a.data.data() + 4 * i, 4);
    std::memcpy(&y, b.data.data() + 4 * i, 4);
    m = std::max(m, std::fabs(x - y));
  }
  return m;
}

}  // namespace

TEST_CASE("cpu arena: allocations past device_budget are refused, mem_stats counts them",
          "[exec][offload]") {
  auto cpu = open_cpu({"device_budget=4K"});
  REQUIRE(cpu->has_mem_stats());
  auto a = cpu->alloc(0, 3000);
  REQUIRE(a.ok());
  auto b = cpu->alloc(0, 2000);  // 3008 + 2048 > 4096
  REQUIRE(!b.ok());
  CHECK(b.error().code == Errc::runtime);
  CHECK_THAT(b.error().message(), Catch::Contains("device budget of 4096 bytes exceeded") &&
                                      Catch::Contains("2000 bytes requested with 3008 in use"));
  auto pinned = cpu->alloc(0, 8192, HP_MEM_PINNED_HOST);  // the host pool does not count
  REQUIRE(pinned.ok());
  auto m = cpu->mem_stats(0);
  REQUIRE(m.ok());
  CHECK(m->limit == 4096);
  CHECK(m->in_use == 3008);
  CHECK(m->peak == 3008);
  CHECK(m->refused == 1);
  auto info = cpu->device_info(0);
  REQUIRE(info.ok());
  CHECK(info->mem_total == 4096);
  CHECK(info->mem_free == 4096 - 3008);
  REQUIRE(cpu->free_mem(0, *a).ok());
  REQUIRE(cpu->free_mem(0, *pinned, HP_MEM_PINNED_HOST).ok());
  m = cpu->mem_stats(0, true);
  REQUIRE(m.ok());
  CHECK(m->in_use == 0);
  CHECK(cpu->mem_stats(0)->peak == 0);  // reset to what is in use
  CHECK(cpu->alloc(0, 4096).ok());      // the whole budget fits once freed
}

TEST_CASE("cpu arena: a malformed device_budget is rejected at open", "[exec][offload]") {
  plugin::SearchOptions so;
  so.use_env = false;
  so.use_install_dir = false;
  so.open_options = {"device_budget=12Q"};
  auto reg = plugin::discover(so);
  REQUIRE(reg.ok());
  const plugin::PluginRecord* rec = reg->record("cpu");
  REQUIRE(rec);
  CHECK(!rec->ok());
  CHECK_THAT(rec->reason, Catch::Contains("device_budget=12Q"));
}

TEST_CASE("offload run: under a budget below the peak the outputs equal the un-offloaded ones",
          "[exec][offload]") {
  auto name = GENERATE(as<std::string>{}, "tiny-gpt2", "tiny-llama");
  SECTION(name) {
    Case c = load(name);
    // (a) no budget: the reference outputs, and the device peak as the plugin counts it.
    Result base = run(c, 0, {});
    REQUIRE(base.outputs.ok());
    REQUIRE(base.outputs->size() == c.expected.size());
    CHECK(max_abs((*base.outputs)[0], c.expected[0]) < 1e-4);
    const std::int64_t peak = base.stats.device_peak;
    REQUIRE(peak > 0);
    CHECK(peak >= base.stats.weight_bytes);

    // (b) budgets below the peak, weights and activations in the host pool: 60% of it, then the
    // tightest whole percent the schedule still fits (there activations are written back too).
    OffloadConfig off;
    off.enabled = true;
    off.lookahead = 2;
    off.weights = off.activations = true;
    auto report = [&](int pct, const Result& o) {
      const auto budget = static_cast<std::uint64_t>(peak) * static_cast<std::uint64_t>(pct) / 100;
      WARN(name << " at " << pct << "% (" << budget << " B): device peak " << o.stats.device_peak
                << " B (without "
                << "offload " << peak << " B), live " << o.stats.peak_bytes
                << " B (without offload " << base.stats.peak_bytes << " B), planned "
                << o.stats.offload_planned_peak << " B, " << o.stats.offload_fetches << " fetches, "
                << o.stats.offload_evictions << " evictions, " << o.stats.offload_bytes
                << " B moved");
    };
    auto offloaded = [&](int pct, bool must_fit) -> std::optional<Result> {
      const auto budget = static_cast<std::uint64_t>(peak) * static_cast<std::uint64_t>(pct) / 100;
      off.budget = static_cast<double>(budget);
      Result o = run(c, budget, off, 2);  // twice: the second run replays the same schedule
      INFO(name << " at " << pct
                << "%: " << (o.outputs.ok() ? std::string() : o.outputs.error().str()));
      if (!must_fit && !o.outputs.ok() && o.outputs.error().code == Errc::infeasible)
        return std::nullopt;
      REQUIRE(o.outputs.ok());
      REQUIRE(o.outputs->size() == base.outputs->size());
      for (std::size_t k = 0; k < o.outputs->size(); ++k)
        CHECK(max_abs((*o.outputs)[k], (*base.outputs)[k]) <= 1e-6f);
      CHECK(o.stats.device_peak > 0);
      CHECK(o.stats.device_peak <= static_cast<std::int64_t>(budget));
      CHECK(o.stats.offload_planned_peak <= static_cast<std::int64_t>(budget));
      CHECK(o.stats.peak_bytes <= o.stats.offload_planned_peak);  // the plan's sizes are the run's
      CHECK(o.stats.offload_fetches > 0);
      return o;
    };
    report(60, *offloaded(60, true));
    std::optional<Result> tightest;
    int tight_pct = 0;
    for (int pct = 30; pct >= 1; --pct) {
      auto o = offloaded(pct, false);
      if (!o) break;
      tightest = std::move(o);
      tight_pct = pct;
    }
    REQUIRE(tightest);
    report(tight_pct, *tightest);
    CHECK(tightest->stats.offload_evictions > 0);
    const auto budget = static_cast<std::uint64_t>(peak) * 6 / 10;

    // (c) the same budget without the schedule: a clear error, not a crash.
    Result fail = run(c, budget, {});
    REQUIRE(!fail.outputs.ok());
    CHECK(fail.outputs.error().code == Errc::runtime);
    CHECK_THAT(fail.outputs.error().message(),
               Catch::Contains("device budget of " + std::to_string(budget) + " bytes exceeded") &&
                   Catch::Contains("for tensor '") && Catch::Contains("bytes requested"));
  }
}

TEST_CASE("offload run: a budget below one node's own need is infeasible and says the need",
          "[exec][offload]") {
  Case c = load("tiny-gpt2");
  OffloadConfig off;
  off.enabled = true;
  off.budget = 4096;
  off.weights = off.activations = true;
  Result r = run(c, 4096, off);
  REQUIRE(!r.outputs.ok());
  CHECK(r.outputs.error().code == Errc::infeasible);
  CHECK_THAT(
      r.outputs.error().message(),
      Catch::Contains("a device budget of 4.00 KiB is too small") && Catch::Contains("needs"));
}

TEST_CASE(
    "offload run: the recipe's [offload] section becomes the backend option and the executor's "
    "config",
    "[exec][offload]") {
  recipe::Recipe r;
  r.parallel.pp = 2;
  auto none = offload_run_for(r, 0, "cpu");
  REQUIRE(none.ok());
  CHECK(!none->exec.enabled);
  CHECK(none->open_options.empty());

  recipe::Offload o;
  o.enabled = true;
  o.targets = {"parameters", "optimizer"};
  o.prefetch_lookahead = 3;
  o.device_budget = 1 << 20;
  r.offload = o;
  auto run = offload_run_for(r, 1, "cpu");
  REQUIRE(run.ok());
  CHECK(run->exec.enabled);
  CHECK(run->exec.budget == 1 << 20);
  CHECK(run->exec.lookahead == 3);
  CHECK(run->exec.weights);
  CHECK(!run->exec.activations);
  CHECK(run->open_options == std::vector<std::string>{"device_budget=1048576"});
  REQUIRE(run->notes.size() == 1);
  CHECK_THAT(run->notes[0], Catch::Contains("'optimizer'"));

  auto cuda =
      offload_run_for(r, 1, "cuda");  // the cuda device has its own memory: nothing to enforce
  REQUIRE(cuda.ok());
  CHECK(cuda->open_options.empty());

  auto bad_stage = offload_run_for(r, 2, "cpu");
  REQUIRE(!bad_stage.ok());
  CHECK(bad_stage.error().code == Errc::usage);

  r.offload->device_budget = 0;
  auto no_budget = offload_run_for(r, 0, "cpu");
  REQUIRE(!no_budget.ok());
  CHECK(no_budget.error().code == Errc::bad_input);
  CHECK_THAT(no_budget.error().message(), Catch::Contains("device_budget"));
}
