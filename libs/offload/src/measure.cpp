// --measure: see measure.h. Timing is wall-clock around copy_async + stream_sync, so a plugin's
// launch overhead is included, as it is for the runtime that will issue these copies.
#include "hp/offload/measure.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>

#include <fmt/core.h>

#include "hp/plugin/registry.h"

namespace hp::offload {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

// Frees plugin memory on every path out.
struct PluginBuffer {
  const plugin::Backend* b = nullptr;
  void* p = nullptr;
  int kind = HP_MEM_DEVICE;
  ~PluginBuffer() {
    if (p) (void)b->free_mem(0, p, kind);
  }
};

}  // namespace

Expected<BandwidthReport> measure_bandwidth(const MeasureOptions& opt) {
  auto reg = plugin::discover(plugin::SearchOptions{});
  if (!reg) return std::move(reg).error();
  auto backend = reg->find(opt.backend);
  if (!backend)
    return Error(Errc::unavailable, fmt::format("backend '{}' is not available for --measure", opt.backend), "",
                 "run 'hp devices -v' to see which plugins were found");
  auto info = backend->device_info(0);
  if (!info) return std::move(info).error();
  const double largest = *std::max_element(opt.sizes.begin(), opt.sizes.end());
  const auto bytes = static_cast<std::size_t>(largest);
  const int host_kind = (info->caps & HP_CAP_PINNED_HOST) ? HP_MEM_PINNED_HOST : HP_MEM_DEVICE;
  PluginBuffer dev{backend.get(), nullptr, HP_MEM_DEVICE}, host{backend.get(), nullptr, host_kind};
  auto d = backend->alloc(0, bytes, HP_MEM_DEVICE);
  if (!d) return std::move(d).error();
  dev.p = *d;
  auto h = backend->alloc(0, bytes, host_kind);
  if (!h) return std::move(h).error();
  host.p = *h;
  auto stream = backend->stream_create(0);
  if (!stream) return std::move(stream).error();
  std::unique_ptr<hp_stream, std::function<void(hp_stream*)>> s(*stream, [&](hp_stream* x) {
    (void)backend->stream_destroy(x);
  });
  // Plain buffers for the reference loop; touched first so page faults are not timed.
  std::vector<unsigned char> a(bytes, 1), b(bytes, 2);
  std::memset(host.p, 3, bytes);

  BandwidthReport r;
  r.backend = backend->name();
  r.device = info->name;
  r.probe = r.backend + "-copy";
  r.date = today();
  r.repeats = opt.repeats;
  auto timed = [](auto&& f) {
    const auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  volatile unsigned char sink = 0;
  for (double size : opt.sizes) {
    const auto n = static_cast<std::size_t>(size);
    std::vector<double> h2d, d2h, mc;
    for (int i = -1; i < opt.repeats; ++i) {  // i = -1 warms up
      Status st;
      const double th = timed([&] {
        st = backend->copy_async(s.get(), dev.p, host.p, n, HP_H2D);
        if (st) st = backend->stream_sync(s.get());
      });
      if (!st) return std::move(st).error();
      const double td = timed([&] {
        st = backend->copy_async(s.get(), host.p, dev.p, n, HP_D2H);
        if (st) st = backend->stream_sync(s.get());
      });
      if (!st) return std::move(st).error();
      const double tm = timed([&] { std::memcpy(b.data(), a.data(), n); });
      sink = sink + b[n - 1];  // keep the copy observable
      if (i < 0) continue;
      h2d.push_back(size / std::max(th, 1e-9));
      d2h.push_back(size / std::max(td, 1e-9));
      mc.push_back(size / std::max(tm, 1e-9));
    }
    r.sizes.push_back({size, median(h2d), median(d2h), median(mc)});
  }
  std::sort(r.sizes.begin(), r.sizes.end(), [](const ProbeSize& x, const ProbeSize& y) { return x.bytes < y.bytes; });
  r.h2d = r.sizes.back().h2d;
  r.d2h = r.sizes.back().d2h;
  r.memcpy = r.sizes.back().memcpy;
  return r;
}

}  // namespace hp::offload
