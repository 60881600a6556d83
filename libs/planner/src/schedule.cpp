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
  if (s == recipe::Schedule::zb_h1) {
    // hp::job's ZB-H1 order (F, B, W) with only the Fs and the Ws kept, the W as the op that frees:
    // W of micro-batch j runs after B of j + k, and the rest after the last B.
    std::int64_t f = 0, b = 0, w = 0;
    auto backward = [&] {
      ++b;
      if (b - w > k) ops.push_back({false, w++, 0});
    };
    for (const std::int64_t warm = std::min(p - k - 1, m); f < warm;) ops.push_back({true, f++, 0});
    while (f < m) {
      ops.push_back({true, f++, 0});
      backward();
    }
    while (b < m) backward();
    while (w < m) ops.push_back({false, w++, 0});
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

double bubble_seconds(recipe::Schedule s, std::int64_t p, std::int64_t m, std::int64_t v, double f,
                      double b, double w) {
  if (p <= 1 || m < 1) return 0;
  const double gaps = static_cast<double>(p - 1);
  switch (s) {
    case recipe::Schedule::gpipe:
    case recipe::Schedule::one_f_one_b: return gaps * (f + b + w);
    case recipe::Schedule::interleaved:
      return gaps * (f + b + w) / static_cast<double>(std::max<std::int64_t>(1, v));
    case recipe::Schedule::zb_h1:
      // With m < p the Ws deferred on the later ranks outnumber the gaps they can fill.
      return gaps * (f + std::max(0.0, b - w)) +
             static_cast<double>(std::max<std::int64_t>(0, p - m)) * std::min(b, w);
    case recipe::Schedule::zbv: return gaps * f / 2;
  }
  return gaps * (f + b + w);
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

// Each moment as a vector of 2 x chunks: micro-batches alive per chunk, then whether the chunk's
// gradients exist (its first backward has started).
LiveCounts reduce(recipe::Schedule s, std::int64_t p, std::int64_t k, std::int64_t m,
                  std::int64_t v) {
  LiveCounts out;
  out.chunks = s == recipe::Schedule::interleaved ? std::max<std::int64_t>(1, v) : 1;
  const auto chunks = static_cast<std::size_t>(out.chunks);
  std::vector<std::int64_t> live(2 * chunks, 0);
  std::set<std::vector<std::int64_t>> fwd;
  std::vector<std::set<std::vector<std::int64_t>>> bwd(2 * chunks);  // [chunk][first]
  for (const Op& op : schedule_ops(s, p, k, m, v, true)) {
    const auto c = static_cast<std::size_t>(op.chunk);
    auto& n = live[c];
    if (op.forward) {
      ++n;
      fwd.insert(live);
    } else {
      const bool first = live[chunks + c] == 0;
      bwd[2 * c + (first ? 1 : 0)].insert(live);
      live[chunks + c] = 1;
      --n;
    }
  }
  auto rows = [&](const std::vector<std::int64_t>& x, std::vector<double>& to) {
    for (auto n : x) to.push_back(static_cast<double>(n));
  };
  auto counts = [&](const std::vector<std::int64_t>& x) {
    return std::vector<std::int64_t>(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(chunks));
  };
  for (const auto& x : undominated(std::move(fwd))) {
    rows(x, out.forward_rows);
    out.after_forward.push_back(counts(x));
  }
  for (std::size_t c = 0; c < chunks; ++c)
    for (int first = 0; first < 2; ++first)
      for (const auto& x : undominated(std::move(bwd[2 * c + static_cast<std::size_t>(first)]))) {
        rows(x, out.backward_rows);
        out.before_backward.push_back({counts(x), static_cast<std::int64_t>(c), first == 1});
      }
  return out;
}

// The peak from per-chunk figures: `coef` the bytes one micro-batch keeps per chunk, then each
// chunk's gradient bytes (2 x chunks, against the rows); `worst[c]` the most chunk c's later
// backwards add above what is alive at their start, `worst_first[c]` the same for its first
// backward, gradients born included.
double peak_of(const LiveCounts& live, const double* coef, const double* worst,
               const double* worst_first, double* alone) {
  const auto chunks = static_cast<std::size_t>(live.chunks), width = 2 * chunks;
  // One pass gives both peaks: `alone` sums only the live counts (the activations), each row's
  // first `chunks` entries.
  double peak = 0, acts = 0;
  auto row = [&](const double* n, double worst_all, double worst_acts) {
    double a = 0, g = 0;
    for (std::size_t c = 0; c < chunks; ++c) a += n[c] * coef[c];
    for (std::size_t c = chunks; c < width; ++c) g += n[c] * coef[c];
    peak = std::max(peak, a + g + worst_all);
    acts = std::max(acts, a + worst_acts);
  };
  for (std::size_t i = 0; i < live.after_forward.size(); ++i)
    row(live.forward_rows.data() + i * width, 0, 0);
  for (std::size_t i = 0; i < live.before_backward.size(); ++i) {
    const auto& b = live.before_backward[i];
    const auto c = static_cast<std::size_t>(b.chunk);
    row(live.backward_rows.data() + i * width, b.first ? worst_first[c] : worst[c], worst[c]);
  }
  if (alone) *alone = acts;
  return peak;
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

double activation_peak(const LiveCounts& live, const std::vector<UnitActivations>& units,
                       double* alone) {
  const auto chunks = static_cast<std::size_t>(live.chunks);
  // Per chunk: the bytes one micro-batch keeps, its gradients, and the worst moments of its
  // backward above them (units run backward last to first; each frees its kept bytes after its
  // own backward, and in the chunk's first backward allocates its gradients before it runs).
  std::vector<double> coef(2 * chunks, 0), worst(chunks, 0), worst_first(chunks, 0),
      freed(chunks, 0), born(chunks, 0);
  auto chunk_of = [&](const UnitActivations& u) {
    return std::min(static_cast<std::size_t>(u.chunk), chunks - 1);
  };
  for (const auto& u : units) {
    coef[chunk_of(u)] += u.kept;
    coef[chunks + chunk_of(u)] += u.grads;
  }
  for (auto u = units.rbegin(); u != units.rend(); ++u) {
    const auto c = chunk_of(*u);
    born[c] += u->grads;
    worst[c] = std::max(worst[c], u->transient - freed[c]);
    worst_first[c] = std::max(worst_first[c], u->transient + born[c] - freed[c]);
    freed[c] += u->kept;
  }
  return peak_of(live, coef.data(), worst.data(), worst_first.data(), alone);
}

PeakTracker::PeakTracker(const LiveCounts& live, std::vector<UnitActivations> units)
    : live_(live),
      units_(std::move(units)),
      members_(static_cast<std::size_t>(live.chunks)),
      forward_sums_(live.after_forward.size(), 0.0),
      backward_sums_(live.before_backward.size(), 0.0),
      worst_(static_cast<std::size_t>(live.chunks), 0.0),
      worst_first_(static_cast<std::size_t>(live.chunks), 0.0) {
  const auto chunks = members_.size(), width = 2 * chunks;
  // The gradients' share of every moment does not change with the recompute choice: summed once.
  std::vector<double> grads(chunks, 0.0);
  for (std::size_t u = 0; u < units_.size(); ++u) {
    auto& c = units_[u].chunk;
    c = std::min<std::int64_t>(c, static_cast<std::int64_t>(chunks) - 1);
    members_[static_cast<std::size_t>(c)].push_back(u);
    grads[static_cast<std::size_t>(c)] += units_[u].grads;
  }
  for (std::size_t c = 0; c < chunks; ++c) {
    for (std::size_t i = 0; i < forward_sums_.size(); ++i)
      forward_sums_[i] += live_.forward_rows[i * width + chunks + c] * grads[c];
    for (std::size_t i = 0; i < backward_sums_.size(); ++i)
      backward_sums_[i] += live_.backward_rows[i * width + chunks + c] * grads[c];
  }
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const double k = units_[u].kept;
    units_[u].kept = 0;
    set(u, k, units_[u].transient);
  }
  for (std::size_t c = 0; c < chunks; ++c) rescan(c);
}

void PeakTracker::set(std::size_t u, double kept, double transient) {
  UnitActivations& x = units_[u];
  const auto c = static_cast<std::size_t>(x.chunk), width = 2 * members_.size();
  const double delta = kept - x.kept;
  if (delta != 0) {
    for (std::size_t i = 0; i < forward_sums_.size(); ++i)
      forward_sums_[i] += live_.forward_rows[i * width + c] * delta;
    for (std::size_t i = 0; i < backward_sums_.size(); ++i)
      backward_sums_[i] += live_.backward_rows[i * width + c] * delta;
  }
  x.kept = kept;
  x.transient = transient;
  rescan(c);
}

void PeakTracker::rescan(std::size_t chunk) {
  double worst = 0, worst_first = 0, freed = 0, born = 0;
  const auto& m = members_[chunk];
  for (auto u = m.rbegin(); u != m.rend(); ++u) {
    const UnitActivations& x = units_[*u];
    born += x.grads;
    worst = std::max(worst, x.transient - freed);
    worst_first = std::max(worst_first, x.transient + born - freed);
    freed += x.kept;
  }
  worst_[chunk] = worst;
  worst_first_[chunk] = worst_first;
}

double PeakTracker::peak() const {
  double peak = 0;
  for (double s : forward_sums_) peak = std::max(peak, s);
  for (std::size_t i = 0; i < backward_sums_.size(); ++i) {
    const auto& b = live_.before_backward[i];
    const auto c = static_cast<std::size_t>(b.chunk);
    peak = std::max(peak, backward_sums_[i] + (b.first ? worst_first_[c] : worst_[c]));
  }
  return peak;
}

}  // namespace hp::planner
