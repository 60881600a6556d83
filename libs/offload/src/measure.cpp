// --measure: see measure.h. Timing is wall-clock around copy_async + stream_sync, so a plugin's
// launch overhead is included, as it is for the runtime that will issue these copies.
#include "hp/offload/measure.h"

#include <time.h>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>

#include <fmt/core.h>

#include "hp/plugin/registry.h"
#include "probe_util.h"

namespace hp::offload {
namespace {

using Clock = std::chrono::steady_clock;
using detail::median;
using detail::PluginBuffer;
using detail::today;

}  // namespace

Expected<BandwidthReport> measure_bandwidth(const MeasureOptions& opt) {
  HP_ASSIGN_OR_RETURN(auto backend, detail::open_probe_backend(opt.backend, 0, opt.plugin_paths));
  HP_ASSIGN_OR_RETURN(auto info, backend->device_info(0));
  const double largest = *std::max_element(opt.sizes.begin(), opt.sizes.end());
  const auto bytes = static_cast<std::size_t>(largest);
  const int host_kind = (info.caps & HP_CAP_PINNED_HOST) ? HP_MEM_PINNED_HOST : HP_MEM_DEVICE;
  PluginBuffer dev{backend.get(), nullptr, HP_MEM_DEVICE}, host{backend.get(), nullptr, host_kind};
  HP_ASSIGN_OR_RETURN(dev.p, backend->alloc(0, bytes, HP_MEM_DEVICE));
  HP_ASSIGN_OR_RETURN(host.p, backend->alloc(0, bytes, host_kind));
  HP_ASSIGN_OR_RETURN(auto stream, backend->stream_create(0));
  std::unique_ptr<hp_stream, std::function<void(hp_stream*)>> s(
      stream, [&](hp_stream* x) { (void)backend->stream_destroy(x); });
  // The reference loop copies between the same two buffers, so both see the same pages and caches;
  // what differs is only the path through the plugin.
  std::memset(host.p, 3, bytes);
  std::memset(dev.p, 4, bytes);

  BandwidthReport r;
  r.backend = backend->name();
  r.device = info.name;
  r.probe = r.backend + "-copy";
  r.date = today();
  r.repeats = opt.repeats;
  // The CPU plugin copies on the calling thread, so its copies are timed in that thread's CPU time:
  // on a shared machine wall time also counts the time the scheduler gave to other processes.
  // Other backends copy asynchronously and are timed on the wall clock.
  const bool on_thread = r.backend == "cpu";
  auto now = [on_thread] {
    if (!on_thread) return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  auto timed = [&](auto&& f) {
    const double t0 = now();
    f();
    return now() - t0;
  };
  volatile unsigned char sink = 0;
  for (double size : opt.sizes) {
    const auto n = static_cast<std::size_t>(size);
    std::vector<double> h2d, d2h, mc, h2d_ratio, d2h_ratio;
    if (opt.together) opt.together();
    for (int i = -1; i < opt.repeats; ++i) {  // i = -1 warms up
      Status st;
      auto h2d_copy = [&] {
        st = backend->copy_async(s.get(), dev.p, host.p, n, HP_H2D);
        if (st) st = backend->stream_sync(s.get());
      };
      auto d2h_copy = [&] {
        st = backend->copy_async(s.get(), host.p, dev.p, n, HP_D2H);
        if (st) st = backend->stream_sync(s.get());
      };
      auto plain = [&] { std::memcpy(dev.p, host.p, n); };
      // Alternate the order so that neither kind always runs right after the other.
      double th = 0, td = 0, tm = 0;
      if (i % 2 == 0) {
        tm = timed(plain);
        th = timed(h2d_copy);
        HP_TRY(st);
        td = timed(d2h_copy);
      } else {
        th = timed(h2d_copy);
        HP_TRY(st);
        td = timed(d2h_copy);
        if (st) tm = timed(plain);
      }
      HP_TRY(st);
      sink = sink + static_cast<const unsigned char*>(dev.p)[n - 1];  // keep the copies observable
      if (i < 0) continue;
      h2d.push_back(size / std::max(th, 1e-9));
      d2h.push_back(size / std::max(td, 1e-9));
      mc.push_back(size / std::max(tm, 1e-9));
      h2d_ratio.push_back(tm / std::max(th, 1e-12));
      d2h_ratio.push_back(tm / std::max(td, 1e-12));
    }
    r.sizes.push_back(
        {size, median(h2d), median(d2h), median(mc), median(h2d_ratio), median(d2h_ratio)});
  }
  std::sort(r.sizes.begin(), r.sizes.end(),
            [](const ProbeSize& x, const ProbeSize& y) { return x.bytes < y.bytes; });
  r.h2d = r.sizes.back().h2d;
  r.d2h = r.sizes.back().d2h;
  r.memcpy = r.sizes.back().memcpy;
  r.h2d_vs_memcpy = r.sizes.back().h2d_vs_memcpy;
  r.d2h_vs_memcpy = r.sizes.back().d2h_vs_memcpy;
  return r;
}

}  // namespace hp::offload
