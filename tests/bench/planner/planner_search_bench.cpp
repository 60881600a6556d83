// Search time of `hp plan`'s two-level search on the issue-4 target: a 1-trillion-parameter GPT
// skeleton (Korthikanti et al. 2022's 1T: 128 layers, hidden 25600, 160 heads, seq 2048, vocab
// 51200) on 384 DGX A100 nodes = 3072 ranks, global batch 3072. The skeleton is the planner's
// profile of that model written from the GPT formulas (12 h^2 parameters and 24 s h^2 + 4 s^2 h
// forward FLOPs per layer, Korthikanti's 34 s h + 5 a s^2 activation bytes), so the benchmark times
// the search alone, not ONNX loading.
//
// Usage: planner_search_bench [REPEATS] [--max-seconds S] [--top-k K]
// Prints one line per repeat and a summary (median seconds, evaluated configurations,
// candidates/s); with --max-seconds, exits 1 when the median search takes longer.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "hp/planner/planner.h"
#include "hp/recipe/presets.h"

using namespace hp;
using namespace hp::planner;

namespace {

ModelProfile gpt_1t() {
  const double s = 2048, h = 25600, a = 160, vocab = 51200;
  ModelProfile m;
  m.seq = 2048;
  m.hidden_bytes = 2 * s * h;
  m.heads = 160;
  for (int i = 0; i < 128; ++i) {
    BlockProfile b;
    b.name = "h." + std::to_string(i);
    b.parameters = 12 * h * h;
    b.fwd_flops = 24 * s * h * h + 4 * s * s * h;
    b.quadratic_flops = 4 * s * s * h;
    b.quadratic_act_bytes = 5 * a * s * s;
    b.act_bytes = 34 * s * h + b.quadratic_act_bytes;
    b.boundary_bytes = 2 * s * h;
    b.tp_collectives = 2;
    b.kernels = 20;
    b.heads = 160;
    m.blocks.push_back(b);
  }
  m.prologue.parameters = (vocab + s) * h;
  m.epilogue.parameters = vocab * h;
  m.epilogue.fwd_flops = 2 * s * h * vocab;
  m.epilogue.act_bytes = 2 * s * vocab;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 5;
  double max_seconds = 0;
  std::int64_t top_k = 3;  // hp plan's default
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--max-seconds") == 0 && i + 1 < argc)
      max_seconds = std::atof(argv[++i]);
    else if (std::strcmp(argv[i], "--top-k") == 0 && i + 1 < argc)
      top_k = std::max(1, std::atoi(argv[++i]));
    else
      repeats = std::max(1, std::atoi(argv[i]));
  }
  auto c = recipe::load_cluster_ref("dgx-a100", {}, recipe::preset_dirs({}, HP_SOURCE_DIR));
  if (!c) return std::fprintf(stderr, "dgx-a100: %s\n", c.error().str().c_str()), 2;
  auto scaled = recipe::scale_cluster(*c, 384);
  if (!scaled) return 2;
  auto topo = topology::Topology::from_cluster(*scaled);
  if (!topo) return 2;
  const ModelProfile m = gpt_1t();
  Workload w;
  w.global_batch = 3072;
  Machine mc;
  const auto* dev = scaled->rank_device_type();
  mc.peak_flops = dev->peak_flops.of("bf16");
  mc.memory = dev->memory;
  mc.memory_bandwidth = dev->memory_bandwidth;
  mc.cal = calibration_for(dev->kind);

  std::vector<double> secs;
  SearchResult last;
  for (int r = 0; r < repeats; ++r) {
    // CPU time too: on a shared machine the wall clock also counts other processes' turns.
    const std::clock_t cpu0 = std::clock();
    last = search({m, *topo, w, mc, {top_k, {}}});
    const double cpu = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
    secs.push_back(last.stats.seconds);
    std::printf("run %d: %.3f s wall, %.3f s cpu, %lld configurations, level 2 on %lld\n", r + 1,
                last.stats.seconds, cpu, static_cast<long long>(last.stats.evaluated),
                static_cast<long long>(last.stats.level2));
  }
  if (last.plans.empty()) return std::fprintf(stderr, "no plan found\n"), 1;
  std::sort(secs.begin(), secs.end());
  const double median = secs[secs.size() / 2];
  const Config& b = last.plans.front().config;
  std::printf(
      "1T GPT on %lld ranks: median %.3f s (min %.3f s), %lld configurations evaluated, %.0f "
      "candidates/s\n",
      static_cast<long long>(topo->ranks()), median, secs.front(),
      static_cast<long long>(last.stats.evaluated),
      static_cast<double>(last.stats.evaluated) / median);
  std::printf("best: dp %lld tp %lld pp %lld v %lld mbs %lld, %.2f s per iteration, MFU %.1f%%\n",
              static_cast<long long>(b.dp), static_cast<long long>(b.tp),
              static_cast<long long>(b.pp), static_cast<long long>(b.virtual_stages),
              static_cast<long long>(b.micro_batch_size), last.plans.front().predicted.iteration,
              100 * last.plans.front().predicted.mfu);
  if (max_seconds > 0 && median > max_seconds) {
    std::printf("FAIL: median %.3f s > %.3f s\n", median, max_seconds);
    return 1;
  }
  return 0;
}
