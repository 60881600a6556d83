// Times hp's Executor::run on one model and input set: warm-up runs, then the median of timed runs.
//
//   bench_executor MODEL.onnx INPUT_DIR [--threads N] [--warmup W] [--iters K] [--expected DIR]
//   [--ops] [--dtype f32|bf16]
//
// --dtype bf16 opens the cpu plugin with compute=bf16 (MatMul, Gemm and Conv in bfloat16, float32
// accumulation), as `hp launch --dtype bf16` does; the comparison with --expected then also prints
// the difference relative to the largest expected value and accepts up to 5e-2 of it (bfloat16
// keeps 8 bits of mantissa) instead of 1e-3 absolute.
//
// INPUT_DIR holds input_K.pb (ONNX backend-test layout). With --expected, the outputs of the last
// run are compared with output_K.pb there and the max absolute difference printed, so a fast but
// wrong executor cannot go unnoticed. --ops prints the time per op type of the last run
// (ExecStats::by_op). Prints "hp threads=N median_ms=X min_ms=Y cpu_ms=Z iters=K" as ort_bench.js
// does (cpu_ms: median process CPU time per run, all threads); run.sh pairs the two.
#include <fmt/core.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"
#include "hp/model/model.h"
#include "hp/plugin/hp_plugin.h"

using namespace hp;
using namespace hp::exec;

namespace {

int fail(const Error& e) {
  fmt::print(stderr, "bench_executor: {}{}\n", e.what.where.empty() ? "" : e.what.where + ": ",
             e.what.message);
  return 1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// CPU time of the whole process (all threads) in ms: on a shared machine, where wall time mostly
/// measures the other load, this is the steadier figure (at one thread it is the latency an idle
/// machine would show).
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double max_abs_diff(const HostTensor& a, const HostTensor& b) {
  if (a.dtype != b.dtype || a.dims != b.dims || a.dtype != HP_F32) return INFINITY;
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(double(a.as<float>()[i]) - b.as<float>()[i]));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr,
               "usage: bench_executor MODEL.onnx INPUT_DIR [--threads N] [--warmup W] [--iters K] "
               "[--expected DIR] [--ops] [--dtype f32|bf16]\n");
    return 2;
  }
  const std::string model_path = argv[1], input_dir = argv[2];
  int threads = 1, warmup = 3, iters = 10;
  std::string expected;
  bool ops = false;
  std::string dtype = "f32";
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--threads")
      threads = std::atoi(next().c_str());
    else if (a == "--warmup")
      warmup = std::atoi(next().c_str());
    else if (a == "--iters")
      iters = std::atoi(next().c_str());
    else if (a == "--expected")
      expected = next();
    else if (a == "--ops")
      ops = true;
    else if (a == "--dtype")
      dtype = next();
    else {
      fmt::print(stderr, "bench_executor: unknown option '{}'\n", a);
      return 2;
    }
  }
  if (dtype != "f32" && dtype != "bf16") {
    fmt::print(stderr, "bench_executor: --dtype must be f32 or bf16\n");
    return 2;
  }
  if (threads < 1 || iters < 1 || warmup < 0) {
    fmt::print(stderr, "bench_executor: --threads and --iters must be >= 1, --warmup >= 0\n");
    return 2;
  }
  // open_backends sets OpenMP's wait policy before the plugin loads libgomp
  // (libs/exec/src/backends.cpp).
  auto be = open_backends("cpu", threads, {}, {"compute=" + dtype});
  if (!be) return fail(be.error());
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  auto m = model::load_model(model_path, lo);
  if (!m) return fail(m.error());
  const auto t0 = std::chrono::steady_clock::now();
  auto ex = Executor::create(*m, {be->primary, be->cpu, nullptr});
  if (!ex) return fail(ex.error());
  const double prep_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto given = read_tensor_dir(input_dir, "input");
  if (!given) return fail(given.error());
  auto inputs = bind_inputs((*ex)->inputs(), std::move(*given), input_dir);
  if (!inputs) return fail(inputs.error());

  std::vector<HostTensor> outs;
  std::vector<double> ms, cpu;
  for (int i = 0; i < warmup + iters; ++i) {
    const auto s = std::chrono::steady_clock::now();
    const double c0 = cpu_ms();
    auto r = (*ex)->run(*inputs);
    const double c = cpu_ms() - c0;
    const double t =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count();
    if (!r) return fail(r.error());
    if (i >= warmup) {
      ms.push_back(t);
      cpu.push_back(c);
    }
    outs = std::move(*r);
  }
  fmt::print(
      "hp threads={} median_ms={:.2f} min_ms={:.2f} cpu_ms={:.2f} iters={} prepare_ms={:.1f}{}\n",
      threads, median(ms), *std::min_element(ms.begin(), ms.end()), median(cpu), iters, prep_ms,
      dtype == "bf16" ? " dtype=bf16" : "");
  if (ops) {
    const ExecStats& st = (*ex)->stats();
    std::vector<std::pair<std::string, OpTime>> rows(st.by_op.begin(), st.by_op.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    for (const auto& [op, t] : rows)
      fmt::print("  {:<24} {:5d} nodes {:9.2f} ms {:5.1f}%\n", op, t.nodes, t.seconds * 1e3,
                 st.seconds > 0 ? 100 * t.seconds / st.seconds : 0.0);
  }
  if (!expected.empty()) {
    auto want = read_tensor_dir(expected, "output");
    if (!want) return fail(want.error());
    double worst = 0, scale = 0;
    for (std::size_t k = 0; k < outs.size() && k < want->size(); ++k) {
      worst = std::max(worst, max_abs_diff(outs[k], (*want)[k]));
      const HostTensor& w = (*want)[k];
      if (w.dtype == HP_F32)
        for (std::int64_t i = 0; i < w.numel(); ++i)
          scale = std::max(scale, static_cast<double>(std::fabs(w.as<float>()[i])));
    }
    const double rel = scale > 0 ? worst / scale : worst;
    fmt::print("hp max_abs_diff_vs_expected={:.3g} relative_to_max={:.3g}\n", worst, rel);
    if (dtype == "bf16" ? !(rel < 5e-2) : !(worst < 1e-3)) return 6;
  }
  return 0;
}
