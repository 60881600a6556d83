// offload::run end to end on recipes: GPT-175B (the skeleton model) on 8 DGX A100 nodes with the
// published tp8 pp8 v3 plan, under a budget below its peak; the tiny Llama (GQA) in inference mode;
// -o round-trips through the recipe reader; bad inputs give the documented error codes.
#include <catch2/catch.hpp>

#include <fmt/core.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "hp/core/fs.h"
#include "hp/offload/formulas.h"
#include "hp/offload/offload.h"
#include "hp/recipe/presets.h"

namespace fs = std::filesystem;
using namespace hp::offload;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("hp-offload-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
}

std::string gpt175b_recipe() {
  std::string s = R"([recipe]
version = 1
name = "gpt175b"
model = ")" + (fs::path(HP_SOURCE_DIR) / "tests/data/models/gpt-175b-skeleton.onnx").string() +
                  R"("
cluster = "dgx-a100"
nodes = 8

[model]
dims = { batch = 1, seq = 2048 }

[parallel]
dp = 1
tp = 8
pp = 8
optimizer_shard = "none"
micro_batch_size = 1
micro_batches = 64
schedule = "interleaved"
virtual_stages = 3
sequence_parallel = true
expert_parallel = 1
)";
  for (int j = 0; j < 24; ++j)
    s += "\n[[stages]]\nindex = " + std::to_string(j) + "\nlayers = \"" + std::to_string(4 * j) +
         "-" + std::to_string(4 * j + 3) + "\"\nrecompute = \"selective\"\n";
  return s;
}

OffloadOptions base_options(const fs::path& recipe) {
  OffloadOptions o;
  o.recipe = recipe;
  o.preset_dirs = hp::recipe::preset_dirs(fs::path(HP_BINARY_DIR) / "bin", HP_SOURCE_DIR);
  return o;
}

// A one-rank local-cpu recipe for a test model, at `batch` x `seq`, micro-batch size 2.
std::string one_rank_recipe(const std::string& name, const std::string& model, int batch, int seq) {
  return fmt::format(R"([recipe]
version = 1
name = "{}"
model = "{}"
cluster = "local-cpu"
nodes = 1

[model]
dims = {{ batch = {}, seq = {} }}

[parallel]
dp = 1
tp = 1
pp = 1
micro_batch_size = 2
micro_batches = 1
)",
                     name, (fs::path(HP_SOURCE_DIR) / "tests/data/models" / model).string(), batch,
                     seq);
}

}  // namespace

TEST_CASE("GPT-175B under a budget below its peak stays under it at every slot of every stage",
          "[offload][recipe]") {
  const fs::path dir = temp_dir("175b");
  write(dir / "r.toml", gpt175b_recipe());
  OffloadOptions o = base_options(dir / "r.toml");
  auto plain = run(o);
  REQUIRE(plain.ok());
  REQUIRE(plain->stages.size() == 8);
  double peak = 0;
  for (const auto& s : plain->stages) peak = std::max(peak, s.peak_before());
  // Stage 0 holds the most activations (interleaved 1F1B), as Korthikanti's Fig. 1 says.
  CHECK(plain->stages[0].timeline.slots[plain->stages[0].timeline.peak].memory[static_cast<int>(
            Kind::activations)] >
        plain->stages[4].timeline.slots[plain->stages[4].timeline.peak].memory[static_cast<int>(
            Kind::activations)]);
  CHECK(plain->step_before > 1);  // seconds, from the planner's cost model

  const double budget = 0.6 * peak;
  o.hbm = std::to_string(static_cast<long long>(budget));
  o.output = (dir / "out.toml").string();
  o.svg = (dir / "mem.svg").string();
  auto r = run(o);
  REQUIRE(r.ok());
  CHECK(r->offloaded);
  for (const auto& s : r->stages) {
    INFO("stage " << s.input.stage);
    if (!s.schedule) {
      CHECK(s.peak_before() <= budget);
      continue;
    }
    for (const auto& m : s.schedule->memory) REQUIRE(sum(m) <= budget * (1 + 1e-9));
  }
  CHECK(r->step_after >= r->step_before);
  // -o writes the [offload] section; it reads back equal.
  auto back = hp::recipe::load_recipe(dir / "out.toml");
  REQUIRE(back.ok());
  CHECK(*back == r->written);
  REQUIRE(back->offload.has_value());
  CHECK(back->offload->enabled);
  CHECK(back->offload->h2d_bandwidth.value == Approx(25e9));
  CHECK(back->offload->h2d_bandwidth.source == "table");
  // The budget the schedule was planned for, for `hp launch` to keep each rank under.
  CHECK(back->offload->device_budget == Approx(budget).epsilon(1e-9));
  CHECK(hp::recipe::format_recipe(*back).find("device_budget = ") != std::string::npos);
  auto svg = hp::read_file(dir / "mem.svg");
  REQUIRE(svg.ok());
  CHECK(svg->find("<svg") == 0);
  CHECK(svg->find("stage 7") != std::string::npos);
  // The written recipe profiles again with the same choice (its [offload] targets are read back).
  OffloadOptions again = base_options(dir / "out.toml");
  again.hbm = o.hbm;
  auto r2 = run(again);
  REQUIRE(r2.ok());
  CHECK(r2->targets == r->targets);
  fs::remove_all(dir);
}

TEST_CASE("a budget below what any schedule needs is infeasible with the need",
          "[offload][recipe]") {
  const fs::path dir = temp_dir("small");
  write(dir / "r.toml", gpt175b_recipe());
  OffloadOptions o = base_options(dir / "r.toml");
  o.hbm = "1GiB";
  auto r = run(o);
  REQUIRE(!r.ok());
  CHECK(r.error().code == hp::Errc::infeasible);
  CHECK_THAT(r.error().message(), Catch::Contains("needs at least"));
  fs::remove_all(dir);
}

TEST_CASE("bad inputs: no plan, malformed budget, unknown state kind", "[offload][recipe]") {
  const fs::path dir = temp_dir("bad");
  write(dir / "noplan.toml",
        "[recipe]\nversion = 1\nname = \"x\"\nmodel = \"m.onnx\"\ncluster = \"local-cpu\"\n");
  auto r = run(base_options(dir / "noplan.toml"));
  REQUIRE(!r.ok());
  CHECK(r.error().code == hp::Errc::bad_input);
  CHECK_THAT(r.error().message(), Catch::Contains("no plan"));

  OffloadOptions o = base_options(fs::path(HP_SOURCE_DIR) / "recipes/quickstart.toml");
  o.hbm = "lots";
  r = run(o);
  REQUIRE(!r.ok());
  CHECK(r.error().code == hp::Errc::usage);
  o.hbm.clear();
  o.targets = {"weights"};
  r = run(o);
  REQUIRE(!r.ok());
  CHECK(r.error().code == hp::Errc::usage);
  o.targets.clear();
  o.dtype = "bf17";
  r = run(o);
  REQUIRE(!r.ok());
  CHECK(r.error().code == hp::Errc::usage);
  CHECK_THAT(r.error().message(), Catch::Contains("unknown dtype 'bf17'"));
  o.dtype = "bf16";
  o.optimizer = "lamb";
  r = run(o);
  REQUIRE(!r.ok());
  CHECK(r.error().code == hp::Errc::usage);
  CHECK_THAT(r.error().message(), Catch::Contains("unknown optimizer 'lamb'"));
  fs::remove_all(dir);
}

TEST_CASE("inference: the KV cache follows the GQA formula and capacity grows with KV offload",
          "[offload][recipe]") {
  const fs::path dir = temp_dir("infer");
  write(dir / "r.toml", one_rank_recipe("llama", "tiny-llama.onnx", 1, 32));
  OffloadOptions o = base_options(dir / "r.toml");
  o.mode = "infer";
  o.heads = 4;
  o.kv_heads = 2;  // tiny-llama: 3 layers, hidden 64, 4 heads of 16, 2 KV heads
  auto r = run(o);
  REQUIRE(r.ok());
  REQUIRE(r->capacity.has_value());
  const double dtype = 2;
  CHECK(r->capacity->kv_per_token == Approx(kv_cache_bytes(3, 2, 16, 1, dtype)));
  double kv = 0;
  for (const auto& u : r->stages[0].input.units) kv += u.kv;
  CHECK(kv == Approx(kv_cache_bytes(3, 2, 16, 32 * 2, dtype)));
  CHECK(r->capacity->device.max_context > 32);
  CHECK(r->capacity->offloaded.max_context > r->capacity->device.max_context);
  CHECK(r->capacity->offloaded.max_batch > r->capacity->device.max_batch);
  CHECK(r->capacity->device.latency > 0);
  // A latency budget between the two latencies limits the offloaded context, not below the device
  // one.
  o.latency_budget = "1s";
  auto l = run(o);
  REQUIRE(l.ok());
  CHECK(l->capacity->offloaded.max_context_in_latency <= l->capacity->offloaded.max_context);
  // The dtype's size comes from the core table under any of its names: fp32 doubles the KV cache.
  o.latency_budget.clear();
  for (const char* f32 : {"fp32", "float32", "f32"}) {
    o.dtype = f32;
    auto w = run(o);
    REQUIRE(w.ok());
    CHECK(w->capacity->kv_per_token == Approx(kv_cache_bytes(3, 2, 16, 1, 4)));
  }
  fs::remove_all(dir);
}

TEST_CASE("--measure: the CPU plugin's copies run at the speed of a plain memcpy loop",
          "[offload][measure]") {
  // Median of 9 at each size; the machine is shared, so allow two retries before judging.
  bool within = false;
  BandwidthReport last;
  for (int attempt = 0; attempt < 3 && !within; ++attempt) {
    auto m = measure_bandwidth(MeasureOptions{});
    REQUIRE(m.ok());
    last = *m;
    within = std::abs(m->h2d_vs_memcpy - 1) <= 0.10 && std::abs(m->d2h_vs_memcpy - 1) <= 0.10;
  }
  INFO("h2d " << last.h2d << " d2h " << last.d2h << " memcpy " << last.memcpy << " ratios "
              << last.h2d_vs_memcpy << " " << last.d2h_vs_memcpy);
#if defined(__SANITIZE_ADDRESS__)
  // Sanitizer builds instrument the plugin's copies differently from the test's memcpy: the
  // comparison is only meaningful in a normal build (which the test suite also runs).
  WARN("address sanitizer build: bandwidth ratio not judged");
#else
  CHECK(within);
#endif
  CHECK(last.source().rfind("measured:cpu-copy ", 0) == 0);
  CHECK(last.sizes.size() == 3);
}

TEST_CASE("the recipe's [workload] sets dtype, mode and optimizer; flags override it",
          "[offload][recipe]") {
  const fs::path dir = temp_dir("workload");
  const std::string head = one_rank_recipe("gpt", "tiny-gpt2.onnx", 2, 16);
  write(dir / "plain.toml", head);
  write(dir / "fp32.toml", head +
                               "\n[workload]\nmode = \"train\"\ndtype = \"fp32\"\n"
                               "optimizer = \"sgd\"\nglobal_batch = 2\nseq = 16\n");
  auto plain = run(base_options(dir / "plain.toml"));
  REQUIRE(plain.ok());
  CHECK(plain->dtype == "bf16");
  CHECK(plain->optimizer == "adam");
  auto planned = run(base_options(dir / "fp32.toml"));
  REQUIRE(planned.ok());
  CHECK(planned->dtype == "fp32");
  CHECK(planned->optimizer == "sgd");
  OffloadOptions o = base_options(dir / "fp32.toml");
  o.dtype = "bf16";
  auto flagged = run(o);
  REQUIRE(flagged.ok());
  CHECK(flagged->dtype == "bf16");
  CHECK(flagged->optimizer == "sgd");
  // Same optimizer, fp32 against bf16: the recipe's dtype reached the memory timeline.
  CHECK(planned->stages[0].peak_before() > flagged->stages[0].peak_before());
  fs::remove_all(dir);
}
