// `hp devices --measure` (local_cluster.h): the GEMM probe, the cluster built from the probes, and
// its report.
#include "hp/offload/local_cluster.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "hp/plugin/registry.h"
#include "probe_util.h"

namespace hp::offload {
namespace {

using detail::median;
using detail::PluginBuffer;

recipe::DeviceKind kind_of(hp_device_kind k) {
  return k == HP_DEVICE_GPU   ? recipe::DeviceKind::gpu
         : k == HP_DEVICE_NPU ? recipe::DeviceKind::npu
                              : recipe::DeviceKind::cpu;
}

/// The plugin's table peak for one rank: a CPU's figure covers all its cores, of which a rank
/// runs `threads`; an accelerator is one rank whole.
double rank_share(double peak, const plugin::DeviceInfo& info, int threads) {
  if (info.kind != HP_DEVICE_CPU || info.compute_units <= 0) return peak;
  return peak * std::min(threads, info.compute_units) / info.compute_units;
}

/// Runs probe(together) in `n` threads at once, `together` a barrier of the n; every thread leaves
/// it when its probe ends (arrive_and_drop), so a probe that fails early holds no one up. A probe
/// that throws (std::bad_alloc of its buffers) is an error like the others.
template <class T, class Probe>
std::vector<Expected<T>> run_at_once(int n, Probe probe) {
  std::barrier<> gate(n);
  std::vector<std::optional<Expected<T>>> got(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  int started = 0;
  try {
    for (; started < n; ++started) {
      const int i = started;
      threads.emplace_back([&, i] {
        try {
          got[static_cast<std::size_t>(i)].emplace(probe([&] { gate.arrive_and_wait(); }));
        } catch (const std::exception& e) {
          got[static_cast<std::size_t>(i)].emplace(
              Error(Errc::runtime, fmt::format("probe of rank {}: {}", i, e.what())));
        }
        gate.arrive_and_drop();
      });
    }
  } catch (const std::system_error& e) {  // no thread for rank `started` and after
    for (int i = started; i < n; ++i) {
      gate.arrive_and_drop();  // the started probes stop waiting for it
      got[static_cast<std::size_t>(i)].emplace(Error(
          Errc::runtime, fmt::format("could not start the probe of rank {}: {}", i, e.what())));
    }
  }
  for (auto& t : threads) t.join();
  std::vector<Expected<T>> out;
  for (auto& g : got) out.push_back(std::move(*g));
  return out;
}

/// measure(options) for one rank, or in `n` threads at once, each with its own copy of the options
/// whose `together` is their barrier: the first error, or the report whose key is smallest (the
/// slowest rank's).
template <class Report, class Options, class Measure, class Key>
Expected<Report> probe_ranks(int n, const Options& options, Measure measure, Key key) {
  if (n == 1) return measure(options);
  std::vector<Expected<Report>> results =
      run_at_once<Report>(n, [&](std::function<void()> together) {
        Options o = options;
        o.together = std::move(together);
        return measure(o);
      });
  std::size_t best = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) return results[i].error();
    if (key(*results[i]) < key(*results[best])) best = i;
  }
  return std::move(results[best]);
}

}  // namespace

Expected<ComputeReport> measure_gemm(const ComputeOptions& opt) {
  if (opt.sizes.empty() || opt.repeats < 1)
    return Error(Errc::usage, "the GEMM probe needs at least one size and one repeat");
  for (std::int64_t n : opt.sizes)
    if (n < 1 || n > 8192)
      return Error(Errc::usage, fmt::format("GEMM probe size {} is outside 1..8192", n));
  HP_ASSIGN_OR_RETURN(auto backend,
                      detail::open_probe_backend(opt.backend, opt.threads, opt.plugin_paths));
  if (!backend->supports(0, HP_OP_GEMM, HP_F32))
    return Error(Errc::unavailable,
                 fmt::format("backend '{}' has no float32 gemm to measure", opt.backend));
  HP_ASSIGN_OR_RETURN(auto info, backend->device_info(0));
  const std::int64_t largest = *std::max_element(opt.sizes.begin(), opt.sizes.end());
  const auto bytes = static_cast<std::size_t>(largest * largest) * sizeof(float);
  PluginBuffer a(backend.get(), nullptr, HP_MEM_DEVICE), b(backend.get(), nullptr, HP_MEM_DEVICE),
      c(backend.get(), nullptr, HP_MEM_DEVICE);
  HP_ASSIGN_OR_RETURN(a.p, backend->alloc(0, bytes, HP_MEM_DEVICE));
  HP_ASSIGN_OR_RETURN(b.p, backend->alloc(0, bytes, HP_MEM_DEVICE));
  HP_ASSIGN_OR_RETURN(c.p, backend->alloc(0, bytes, HP_MEM_DEVICE));
  HP_ASSIGN_OR_RETURN(auto stream, backend->stream_create(0));
  std::unique_ptr<hp_stream, std::function<void(hp_stream*)>> s(
      stream, [&](hp_stream* x) { (void)backend->stream_destroy(x); });
  // Operands of ordinary magnitude (no denormals, no overflow), copied in the way every backend
  // takes host data.
  std::vector<float> host(static_cast<std::size_t>(largest * largest));
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
  HP_TRY(backend->copy_async(s.get(), a.p, host.data(), bytes, HP_H2D));
  HP_TRY(backend->copy_async(s.get(), b.p, host.data(), bytes, HP_H2D));
  HP_TRY(backend->stream_sync(s.get()));

  ComputeReport r;
  r.backend = backend->name();
  r.device = info.name;
  r.date = detail::today();
  r.threads = opt.threads;
  r.repeats = opt.repeats;
  r.table_peak_fp32 = rank_share(info.peak_flops[HP_F32].value, info,
                                 opt.threads > 0 ? opt.threads : info.compute_units);
  std::vector<std::int64_t> sizes = opt.sizes;
  std::sort(sizes.begin(), sizes.end());
  for (std::int64_t n : sizes) {
    hp_gemm_desc d{};
    d.struct_size = sizeof d;
    d.m = d.n = d.k = n;
    d.lda = d.ldb = d.ldc = n;
    d.batch = 1;
    d.alpha = 1.0;
    d.beta = 0.0;
    d.type_a = d.type_b = d.type_c = d.type_compute = HP_F32;
    d.a = a.p;
    d.b = b.p;
    d.c = c.p;
    if (opt.together) opt.together();
    std::vector<double> rates;
    for (int i = -1; i < opt.repeats; ++i) {  // i = -1 warms up (JIT, page faults)
      const auto t0 = std::chrono::steady_clock::now();
      HP_TRY(backend->gemm(s.get(), d));
      HP_TRY(backend->stream_sync(s.get()));
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i >= 0) rates.push_back(2.0 * static_cast<double>(n * n) * n / std::max(t, 1e-9));
    }
    r.sizes.push_back({n, median(rates)});
  }
  // The median over the sizes: a CPU's rate falls once the operands leave its caches, and a
  // model's products span such sizes.
  std::vector<double> rates;
  for (const GemmProbe& p : r.sizes) rates.push_back(p.flops);
  r.fp32 = median(rates);
  return r;
}

Expected<LocalCluster> measure_local_cluster(const LocalClusterOptions& opt) {
  if (opt.ranks < 1 || opt.ranks > 4096)
    return Error(Errc::usage, fmt::format("--ranks {} is outside 1..4096", opt.ranks));
  if (opt.threads < 0 || opt.threads > 4096)
    return Error(Errc::usage, fmt::format("--threads {} is outside 0..4096", opt.threads));
  if (!opt.out.empty()) {  // before the probes, not after them
    std::error_code ec;
    const auto dir = opt.out.has_parent_path() ? opt.out.parent_path() : ".";
    if (!std::filesystem::is_directory(dir, ec))
      return Error(Errc::bad_input,
                   fmt::format("--cluster-out: directory '{}' does not exist", dir.string()),
                   opt.out.string());
  }
  HP_ASSIGN_OR_RETURN(auto backend, detail::open_probe_backend(opt.backend, 0, opt.plugin_paths));
  HP_ASSIGN_OR_RETURN(const plugin::DeviceInfo info, backend->device_info(0));
  backend.reset();
  LocalCluster out;
  out.ranks = opt.ranks;
  const bool cpu = info.kind == HP_DEVICE_CPU;
  out.threads =
      opt.threads > 0 ? opt.threads : std::max(1, cpu ? info.compute_units / opt.ranks : 1);
  ComputeOptions co = opt.compute;
  co.backend = opt.backend;
  co.plugin_paths = opt.plugin_paths;
  co.threads = cpu ? out.threads : 0;
  MeasureOptions mo = opt.copies;
  mo.backend = opt.backend;
  mo.plugin_paths = opt.plugin_paths;
  // A CPU's ranks are probed all at once (local_cluster.h); at most 64 threads of probes.
  out.at_once = cpu && !opt.alone ? std::min(opt.ranks, 64) : 1;
  HP_ASSIGN_OR_RETURN(out.compute,
                      probe_ranks<ComputeReport>(out.at_once, co, measure_gemm,
                                                 [](const ComputeReport& r) { return r.fp32; }));
  HP_ASSIGN_OR_RETURN(out.bandwidth, probe_ranks<BandwidthReport>(
                                         out.at_once, mo, measure_bandwidth,
                                         [](const BandwidthReport& r) { return r.memcpy; }));

  recipe::Cluster& c = out.cluster;
  c.name = "local-measured";
  c.description = fmt::format(
      "this machine ({}) as {} rank(s) x {} thread(s): GEMM rate and copy bandwidths measured by "
      "hp devices --measure on {}{}",
      info.name, out.ranks, out.threads, out.compute.date,
      out.at_once > 1 ? fmt::format(", {} ranks at once (the slowest)", out.at_once) : "");
  c.nodes = 1;
  recipe::DeviceType d;
  d.kind = kind_of(info.kind);
  d.name = recipe::device_kind_name(d.kind);
  c.rank_device = d.name;
  d.per_node = out.ranks;
  auto peak = [&](int dt) { return rank_share(info.peak_flops[dt].value, info, out.threads); };
  d.peak_flops = {peak(HP_F32), 0.0, peak(HP_BF16), peak(HP_F16), 0.0, 0.0};
  // A table peak below what was measured (a CPU's nominal clock where it boosts) would put MFU
  // above 1; and a plugin without one: the measured rate is the best figure there is.
  d.peak_flops.fp32 = std::max(d.peak_flops.fp32, out.compute.fp32);
  d.sustained_flops.fp32 = out.compute.fp32;
  // The ranks of a CPU share its memory; an accelerator's is its own.
  d.memory = static_cast<double>(info.mem_total) / (cpu ? out.ranks : 1);
  d.memory_bandwidth = cpu ? out.bandwidth.memcpy
                           : (info.mem_bw.value > 0 ? info.mem_bw.value : out.bandwidth.memcpy);
  d.h2d_bandwidth = out.bandwidth.h2d;
  d.d2h_bandwidth = out.bandwidth.d2h;
  c.device_types.push_back(d);
  // Ranks on one CPU exchange data through shared memory, which copies each byte twice (into the
  // shared segment and out), hence half the copy bandwidth; an accelerator's peer link where the
  // plugin knows it. Latency and the scale-out tier are local-cpu's table figures.
  const double node_bw =
      cpu || info.peer_bw.value <= 0 ? out.bandwidth.memcpy / 2 : info.peer_bw.value;
  c.tiers.push_back({"node", out.ranks, node_bw, 1e-6});
  c.tiers.push_back({"scale-out", 0, 1.25e9, 50e-6});
  const auto problems = recipe::validate_cluster(c, {});
  if (!problems.empty())
    return Error(Errc::runtime,
                 fmt::format("the measured cluster is not valid: {}", problems.front().message));
  if (!opt.out.empty()) {
    HP_TRY(recipe::write_cluster(c, opt.out));
    out.written = opt.out.string();
  }
  return out;
}

std::string render_local_cluster(const LocalCluster& c, bool json) {
  const ComputeReport& k = c.compute;
  const BandwidthReport& b = c.bandwidth;
  if (json) {
    nlohmann::json j;
    j["backend"] = k.backend;
    j["device"] = k.device;
    j["date"] = k.date;
    j["ranks"] = c.ranks;
    j["threads"] = c.threads;
    j["ranks_at_once"] = c.at_once;
    j["gemm_fp32"] = nlohmann::json::array();
    for (const GemmProbe& p : k.sizes) j["gemm_fp32"].push_back({{"n", p.n}, {"flops", p.flops}});
    j["sustained_flops_fp32"] = k.fp32;
    j["table_peak_flops_fp32"] = k.table_peak_fp32;
    j["copy_bandwidth"] = {{"memcpy", b.memcpy}, {"h2d", b.h2d}, {"d2h", b.d2h}};
    j["cluster"] = c.cluster.name;
    j["cluster_file"] = c.written.empty() ? nlohmann::json() : nlohmann::json(c.written);
    return j.dump(2) + "\n";
  }
  std::string o =
      c.at_once > 1
          ? fmt::format(
                "measured {} ({} plugin) on {}, {} ranks at once with {} thread(s) each (the "
                "slowest rank):\n",
                k.device, k.backend, k.date, c.at_once, c.threads)
          : fmt::format("measured {} ({} plugin) on {}, one rank of {} with {} thread(s):\n",
                        k.device, k.backend, k.date, c.ranks, c.threads);
  o += "  f32 GEMM   ";
  for (std::size_t i = 0; i < k.sizes.size(); ++i)
    o += fmt::format("{}{}^3 {:.1f} GFLOP/s", i ? ", " : "", k.sizes[i].n, k.sizes[i].flops / 1e9);
  o += fmt::format("  (median of {} each; sustained {:.1f}, their median)\n", k.repeats,
                   k.fp32 / 1e9);
  if (k.table_peak_fp32 > 0)
    o += fmt::format("  table peak {:.1f} GFLOP/s for these threads: measured/peak {:.2f}\n",
                     k.table_peak_fp32 / 1e9, k.fp32 / k.table_peak_fp32);
  o += fmt::format(
      "  copy       {:.1f} GB/s memcpy, plugin h2d {:.1f} / d2h {:.1f} GB/s ({:.0f} MiB)\n",
      b.memcpy / 1e9, b.h2d / 1e9, b.d2h / 1e9,
      b.sizes.empty() ? 0.0 : b.sizes.back().bytes / (1 << 20));
  if (!c.written.empty())
    o += fmt::format("wrote cluster '{}' ({} rank(s), sustained f32 {:.1f} GFLOP/s) to {}\n",
                     c.cluster.name, c.ranks, k.fp32 / 1e9, c.written);
  return o;
}

}  // namespace hp::offload
