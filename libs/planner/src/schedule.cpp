// schedule_ops and the live-count reduction the planner prices activations with (schedule.h).
#include "hp/planner/schedule.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

namespace hp::planner {

std::vector<Op> schedule_ops(recipe::Schedule s, std::int64_t p, std::int64_t k, std::int64_t m,
                             std::int64_t v, bool train) {
  std::vector<Op> ops;
  const std::int64_t chunks = s == recipe::Schedule::interleaved ? std::max<std::int64_t>(1, v) : 1;
  if (!train) {
    for (std::int64_t j = 0; j < m; ++j)
      for (std::int64_t c = 0; c < chunks; ++c) ops.push_back({true, j, c});
    return ops;
  }
  if (s == recipe::Schedule::gpipe) {
    for (std::int64_t j = 0; j < m; ++j) ops.push_back({true, j, 0});
    for (std::int64_t j = m - 1; j >= 0; --j) ops.push_back({false, j, 0});
    return ops;
  }
  // Virtual micro-batch i of the interleaved order (Megatron-LM schedules.py): groups of p
  // micro-batches run through chunk 0, then chunk 1, ...; backwards visit the chunks in reverse.
  const std::int64_t group = p * chunks;
  auto fwd = [&](std::int64_t i) { return Op{true, (i / group) * p + i % p, (i % group) / p}; };
  auto bwd = [&](std::int64_t i) {
    return Op{false, (i / group) * p + i % p, chunks - 1 - (i % group) / p};
  };
  const std::int64_t total = m * chunks;
  const std::int64_t warmup =
      chunks == 1 ? std::min(p - k - 1, m) : std::min((p - k - 1) * 2 + (chunks - 1) * p, total);
  for (std::int64_t i = 0; i < warmup; ++i) ops.push_back(fwd(i));
  for (std::int64_t i = 0; i < total - warmup; ++i) {
    ops.push_back(fwd(warmup + i));
    ops.push_back(bwd(i));
  }
  for (std::int64_t i = total - warmup; i < total; ++i) ops.push_back(bwd(i));
  return ops;
}

namespace {

bool dominated(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] > b[i]) return false;
  return true;
}

// The distinct vectors of `in` that no other kept vector dominates. Larger sums first, so a vector
// is only compared with those that could dominate it.
std::vector<std::vector<std::int64_t>> undominated(std::set<std::vector<std::int64_t>> in) {
  std::vector<std::vector<std::int64_t>> all(in.begin(), in.end()), kept;
  auto total = [](const std::vector<std::int64_t>& x) {
    return std::accumulate(x.begin(), x.end(), std::int64_t{0});
  };
  std::stable_sort(all.begin(), all.end(),
                   [&](const auto& a, const auto& b) { return total(a) > total(b); });
  for (auto& x : all)
    if (std::none_of(kept.begin(), kept.end(), [&](const auto& y) { return dominated(x, y); }))
      kept.push_back(std::move(x));
  return kept;
}

LiveCounts reduce(recipe::Schedule s, std::int64_t p, std::int64_t k, std::int64_t m,
                  std::int64_t v) {
  LiveCounts out;
  out.chunks = s == recipe::Schedule::interleaved ? std::max<std::int64_t>(1, v) : 1;
  std::vector<std::int64_t> live(static_cast<std::size_t>(out.chunks), 0);
  std::set<std::vector<std::int64_t>> fwd;
  std::vector<std::set<std::vector<std::int64_t>>> bwd(static_cast<std::size_t>(out.chunks));
  for (const Op& op : schedule_ops(s, p, k, m, v, true)) {
    auto& n = live[static_cast<std::size_t>(op.chunk)];
    if (op.forward) {
      ++n;
      fwd.insert(live);
    } else {
      bwd[static_cast<std::size_t>(op.chunk)].insert(live);
      --n;
    }
  }
  out.after_forward = undominated(std::move(fwd));
  for (std::int64_t c = 0; c < out.chunks; ++c)
    for (auto& w : undominated(std::move(bwd[static_cast<std::size_t>(c)])))
      out.before_backward.push_back({std::move(w), c});
  return out;
}

}  // namespace

const LiveCounts& live_counts(recipe::Schedule s, std::int64_t p, std::int64_t k, std::int64_t m,
                              std::int64_t v) {
  using Key = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
  thread_local std::map<Key, LiveCounts> cache;
  if (s != recipe::Schedule::interleaved) v = 1;
  const Key key{static_cast<int>(s), p, k, m, v};
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, reduce(s, p, k, m, v)).first;
  return it->second;
}

double activation_peak(const LiveCounts& live, const std::vector<UnitActivations>& units) {
  const auto chunks = static_cast<std::size_t>(live.chunks);
  // Per chunk: the bytes one micro-batch keeps, and the worst moment of its backward above them
  // (units run backward last to first; each frees its kept bytes after its own backward).
  std::vector<double> kept(chunks, 0), worst(chunks, 0), freed(chunks, 0);
  for (const auto& u : units)
    kept[std::min(static_cast<std::size_t>(u.chunk), chunks - 1)] += u.kept;
  for (auto u = units.rbegin(); u != units.rend(); ++u) {
    const auto c = std::min(static_cast<std::size_t>(u->chunk), chunks - 1);
    worst[c] = std::max(worst[c], u->transient - freed[c]);
    freed[c] += u->kept;
  }
  auto dot = [&](const std::vector<std::int64_t>& n) {
    double s = 0;
    for (std::size_t c = 0; c < chunks; ++c) s += static_cast<double>(n[c]) * kept[c];
    return s;
  };
  double peak = 0;
  for (const auto& n : live.after_forward) peak = std::max(peak, dot(n));
  for (const auto& b : live.before_backward)
    peak = std::max(peak, dot(b.live) + worst[static_cast<std::size_t>(b.chunk)]);
  return peak;
}

}  // namespace hp::planner
