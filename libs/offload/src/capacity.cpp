#include "hp/offload/capacity.h"

#include <algorithm>
#include <functional>
#include <numeric>

namespace hp::offload {
namespace {

double total(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// Two largest per-token KV units: what an offloaded KV cache keeps on the device (double buffer).
double resident_kv_per_token(const CapacityStage& s) {
  std::vector<double> v = s.kv_per_token;
  std::sort(v.rbegin(), v.rend());
  return (v.size() > 0 ? v[0] : 0.0) + (v.size() > 1 ? v[1] : 0.0);
}

bool fits(const CapacityInput& in, std::int64_t context, std::int64_t batch, bool offloaded) {
  for (const auto& s : in.stages) {
    if (device_bytes(s, context, batch, offloaded) > in.budget) return false;
    const double host =
        total(s.kv_per_token) * static_cast<double>(context) * static_cast<double>(batch);
    if (offloaded && host > in.host_memory) return false;
  }
  return true;
}

// Largest n in [1, hi] with ok(n), assuming ok is monotone (true then false); 0 when ok(1) fails.
std::int64_t largest(std::int64_t hi, const std::function<bool(std::int64_t)>& ok) {
  if (!ok(1)) return 0;
  std::int64_t lo = 1;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (ok(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

constexpr std::int64_t kMaxTokens = std::int64_t{1} << 40;

}  // namespace

double device_bytes(const CapacityStage& s, std::int64_t context, std::int64_t batch,
                    bool kv_offloaded) {
  const double tokens = static_cast<double>(context) * static_cast<double>(batch);
  const double kv = (kv_offloaded ? resident_kv_per_token(s) : total(s.kv_per_token)) * tokens;
  // Prefill activations of one unit for the whole batch at this context.
  return total(s.weights) + s.fixed + kv + s.act_per_token * tokens;
}

double decode_latency(const CapacityInput& in, std::int64_t context, std::int64_t batch,
                      bool kv_offloaded) {
  const double tokens = static_cast<double>(context) * static_cast<double>(batch);
  double t = 0;
  for (const auto& s : in.stages)
    for (std::size_t u = 0; u < s.weights.size(); ++u) {
      const double kv = s.kv_per_token[u] * tokens;
      const double local = (s.weights[u] + (kv_offloaded ? 0.0 : kv)) / in.memory_bandwidth;
      const double link = kv_offloaded && in.h2d > 0 ? kv / in.h2d : 0.0;
      // An offloaded layer's KV is read once it has arrived; the copy overlaps the previous layer.
      t += std::max(local + (kv_offloaded ? kv / in.memory_bandwidth : 0.0), link);
    }
  return t;
}

CapacityReport capacity(const CapacityInput& in) {
  CapacityReport r;
  r.context = in.context;
  r.batch = in.batch;
  r.latency_budget = in.latency_budget;
  for (const auto& s : in.stages) r.kv_per_token += total(s.kv_per_token);
  r.latency_at_recipe = decode_latency(in, in.context, in.batch, false);
  for (bool off : {false, true}) {
    CapacityFigure& f = off ? r.offloaded : r.device;
    f.max_context = largest(kMaxTokens / std::max<std::int64_t>(1, in.batch),
                            [&](std::int64_t c) { return fits(in, c, in.batch, off); });
    f.max_batch = largest(kMaxTokens / std::max<std::int64_t>(1, in.context),
                          [&](std::int64_t b) { return fits(in, in.context, b, off); });
    f.latency = f.max_context > 0 ? decode_latency(in, f.max_context, in.batch, off) : 0.0;
    f.max_context_in_latency =
        in.latency_budget <= 0
            ? f.max_context
            : largest(std::max<std::int64_t>(1, f.max_context), [&](std::int64_t c) {
                return f.max_context > 0 &&
                       decode_latency(in, c, in.batch, off) <= in.latency_budget;
              });
  }
  return r;
}

}  // namespace hp::offload
