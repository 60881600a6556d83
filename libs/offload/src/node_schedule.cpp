// plan_node_offload (node_schedule.h): one pass over the nodes, keeping the set of resident tracked
// tensors under the budget with Belady eviction, then issuing prefetches while there is room.
#include "hp/offload/node_schedule.h"

#include <algorithm>
#include <limits>

#include <fmt/core.h>

#include "hp/core/units.h"

namespace hp::offload {
namespace {

constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

std::int64_t next_use(const NodeTensor& t, std::int64_t k) {
  auto it = std::lower_bound(t.uses.begin(), t.uses.end(), k);
  return it == t.uses.end() ? kNever : *it;
}

std::string node_label(const NodeTrace& tr, std::int64_t k) {
  const auto i = static_cast<std::size_t>(k);
  if (i < tr.node_names.size() && !tr.node_names[i].empty())
    return fmt::format("node '{}'", tr.node_names[i]);
  return fmt::format("node #{}", k);
}

}  // namespace

Expected<NodeSchedule> plan_node_offload(const NodeTrace& tr, double budget,
                                         std::int64_t lookahead) {
  const auto N = static_cast<std::int64_t>(tr.base.size());
  const std::size_t T = tr.tensors.size();
  // Per node: tracked tensors read there, and those written there.
  std::vector<std::vector<std::size_t>> reads(static_cast<std::size_t>(N)),
      writes(static_cast<std::size_t>(N));
  for (std::size_t t = 0; t < T; ++t) {
    const NodeTensor& x = tr.tensors[t];
    if (x.created >= N || x.last >= N || x.last < std::max<std::int64_t>(0, x.created))
      return Error(Errc::internal,
                   fmt::format("offload trace: tensor '{}' lives outside the run", x.name));
    if (x.created >= 0) writes[static_cast<std::size_t>(x.created)].push_back(t);
    for (std::int64_t u : x.uses) {
      if (u < std::max<std::int64_t>(0, x.created) || u > x.last)
        return Error(Errc::internal,
                     fmt::format("offload trace: tensor '{}' is read at node {} outside its life",
                                 x.name, u));
      auto& r = reads[static_cast<std::size_t>(u)];
      if (r.empty() || r.back() != t) r.push_back(t);
    }
  }

  NodeSchedule s;
  s.before.resize(static_cast<std::size_t>(N));
  s.memory.resize(static_cast<std::size_t>(N));
  // Without offload every tensor is on the device from creation (weights: from the start) to
  // `last`.
  {
    std::vector<double> diff(static_cast<std::size_t>(N) + 1, 0.0);
    for (const NodeTensor& x : tr.tensors) {
      diff[static_cast<std::size_t>(std::max<std::int64_t>(0, x.created))] += x.bytes;
      diff[static_cast<std::size_t>(x.last) + 1] -= x.bytes;
    }
    double run = 0;
    for (std::int64_t k = 0; k < N; ++k) {
      run += diff[static_cast<std::size_t>(k)];
      s.unplanned_peak = std::max(s.unplanned_peak, tr.base[static_cast<std::size_t>(k)] + run);
    }
  }

  std::vector<bool> resident(T, false), on_host(T, false), needed(T, false);
  for (std::size_t t = 0; t < T; ++t) on_host[t] = tr.tensors[t].created < 0;
  double tracked = 0;  // bytes of resident tracked tensors
  for (std::int64_t k = 0; k < N; ++k) {
    auto& moves = s.before[static_cast<std::size_t>(k)];
    const auto& rd = reads[static_cast<std::size_t>(k)];
    const auto& wr = writes[static_cast<std::size_t>(k)];
    double need = 0;  // tracked bytes this node reads or writes
    for (std::size_t t : rd) needed[t] = true;
    for (std::size_t t : wr) needed[t] = true;
    for (std::size_t t = 0; t < T; ++t)
      if (needed[t]) need += tr.tensors[t].bytes;
    double missing = 0;
    for (std::size_t t = 0; t < T; ++t)
      if (needed[t] && !resident[t]) missing += tr.tensors[t].bytes;
    const double fixed = tr.base[static_cast<std::size_t>(k)];
    if (fixed + need > budget)
      return Error(
          Errc::infeasible,
          fmt::format(
              "a device budget of {} is too small: {} needs {} ({} that stays on the device "
              "and {} of tensors it reads or writes)",
              format_bytes(budget), node_label(tr, k), format_bytes(fixed + need),
              format_bytes(fixed), format_bytes(need)));
    // Evict what is next used furthest ahead until this node's tensors fit.
    while (fixed + tracked + missing > budget) {
      std::size_t victim = T;
      std::int64_t far = -1;
      for (std::size_t t = 0; t < T; ++t) {
        if (!resident[t] || needed[t]) continue;
        const std::int64_t nu = next_use(tr.tensors[t], k);
        if (nu > far) far = nu, victim = t;
      }
      if (victim == T) break;  // cannot happen: fixed + need <= budget was checked
      const NodeTensor& x = tr.tensors[victim];
      const bool wb = x.dirty && !on_host[victim];
      moves.push_back({victim, false, wb});
      resident[victim] = false;
      tracked -= x.bytes;
      ++s.evictions;
      if (wb) {
        on_host[victim] = true;
        ++s.writebacks;
        s.written_bytes += x.bytes;
      }
    }
    // Fetch what this node reads and is not here; what it writes appears when it runs.
    for (std::size_t t : rd) {
      if (resident[t]) continue;
      if (!on_host[t])
        return Error(Errc::internal,
                     fmt::format("offload trace: tensor '{}' is read before it is written",
                                 tr.tensors[t].name));
      moves.push_back({t, true, false});
      resident[t] = true;
      tracked += tr.tensors[t].bytes;
      ++s.fetches;
      s.fetched_bytes += tr.tensors[t].bytes;
    }
    for (std::size_t t : wr)
      if (!resident[t]) resident[t] = true, tracked += tr.tensors[t].bytes;
    // Prefetch the reads of the next `lookahead` nodes while they fit beside this node.
    for (std::int64_t j = k + 1; j <= std::min(N - 1, k + lookahead); ++j)
      for (std::size_t t : reads[static_cast<std::size_t>(j)]) {
        if (resident[t] || !on_host[t] || fixed + tracked + tr.tensors[t].bytes > budget) continue;
        moves.push_back({t, true, false});
        resident[t] = true;
        tracked += tr.tensors[t].bytes;
        ++s.fetches;
        ++s.prefetches;
        s.fetched_bytes += tr.tensors[t].bytes;
        s.max_lookahead = std::max(s.max_lookahead, j - k);
      }
    s.memory[static_cast<std::size_t>(k)] = fixed + tracked;
    if (fixed + tracked > s.peak_bytes) s.peak_bytes = fixed + tracked, s.peak_node = k;
    for (std::size_t t : rd) needed[t] = false;
    for (std::size_t t : wr) needed[t] = false;
    // Freed after their last node (weights keep their host copy; activations are done).
    for (std::size_t t = 0; t < T; ++t)
      if (resident[t] && tr.tensors[t].last <= k)
        resident[t] = false, tracked -= tr.tensors[t].bytes;
  }
  return s;
}

}  // namespace hp::offload
