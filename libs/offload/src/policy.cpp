// The offload policy of policy.h: the trace of offloadable tensors (policy_trace.cpp) placed under
// the budget (pass 1, memory only, Belady eviction and bounded prefetch), then the copies timed
// (pass 2).
#include "hp/offload/policy.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include <fmt/core.h>

#include "hp/core/units.h"
#include "policy_trace.h"

namespace hp::offload {
namespace {

using detail::has;
using detail::kNever;
using detail::next_use;
using detail::Trace;
using detail::Tracked;

struct Placement {
  std::vector<std::vector<std::size_t>> fetch, evict;  ///< per slot
  std::vector<Breakdown> memory;
  std::vector<bool> ever_evicted;
  double host_peak = 0;
  bool feasible = true;
  double lower = 0;  ///< max over slots of untracked + needed bytes
  std::int64_t max_lookahead = 0;
  std::int64_t worst = 0;  ///< slot of `lower`
};

// Pass 1: which tensors are on the device at each slot. The resident and evicted sets and the
// per-kind byte sums are kept incrementally, so a slot costs the size of those sets, not of the
// trace.
Placement place(const Trace& tr, double limit) {
  const double budget =
      limit * (1 + 1e-12);  // sums of the same bytes in another order may differ by rounding
  const auto S = static_cast<std::int64_t>(tr.base.size());
  const auto T = tr.tensors.size();
  Placement p;
  p.fetch.resize(static_cast<std::size_t>(S));
  p.evict.resize(static_cast<std::size_t>(S));
  p.memory.resize(static_cast<std::size_t>(S));
  p.ever_evicted.assign(T, false);
  // Tensors by the slot they appear (created, or -1 -> 0) and the slot after they die.
  std::vector<std::vector<std::size_t>> born(static_cast<std::size_t>(S) + 1),
      dead(static_cast<std::size_t>(S) + 1);
  for (std::size_t i = 0; i < T; ++i) {
    born[static_cast<std::size_t>(std::max<std::int64_t>(0, tr.tensors[i].created))].push_back(i);
    dead[static_cast<std::size_t>(tr.tensors[i].last + 1)].push_back(i);
  }
  std::vector<int> state(T, 0);                // 0 not live, 1 resident, 2 evicted (on the host)
  std::vector<std::size_t> resident, evicted;  // unordered index sets
  std::vector<std::size_t> pos(T, 0);
  auto add_to = [&](std::vector<std::size_t>& set, std::size_t i) {
    pos[i] = set.size(), set.push_back(i);
  };
  auto remove_from = [&](std::vector<std::size_t>& set, std::size_t i) {
    const std::size_t j = pos[i];
    set[j] = set.back();
    pos[set[j]] = j;
    set.pop_back();
  };
  Breakdown on_device{};
  double host_evicted = 0, clean_host = 0, pinned_live = 0;
  auto bytes = [&](std::size_t i) { return tr.tensors[i].bytes; };
  auto kind = [&](std::size_t i) { return static_cast<int>(tr.tensors[i].kind); };
  auto make_resident = [&](std::size_t i) {
    if (state[i] == 2) remove_from(evicted, i), host_evicted -= bytes(i);
    state[i] = 1;
    add_to(resident, i);
    on_device[kind(i)] += bytes(i);
  };
  auto evict = [&](std::size_t i, std::size_t si) {
    remove_from(resident, i);
    on_device[kind(i)] -= bytes(i);
    state[i] = 2;
    add_to(evicted, i);
    host_evicted += bytes(i);
    p.ever_evicted[i] = true;
    p.evict[si].push_back(i);
  };
  std::vector<std::int64_t> must_stamp(T, -1);
  for (std::int64_t s = 0; s < S; ++s) {
    const auto si = static_cast<std::size_t>(s);
    for (auto i : dead[si]) {
      if (state[i] == 1) remove_from(resident, i), on_device[kind(i)] -= bytes(i);
      if (state[i] == 2) remove_from(evicted, i), host_evicted -= bytes(i);
      if (!tr.tensors[i].dirty) clean_host -= bytes(i);
      if (!tr.tensors[i].evictable) pinned_live -= bytes(i);
      state[i] = 0;
    }
    for (auto i : born[si]) {
      make_resident(i);
      if (!tr.tensors[i].dirty) clean_host += bytes(i);
      if (!tr.tensors[i].evictable) pinned_live += bytes(i);
    }
    const double base = sum(tr.base[si]);
    double need = base, pinned_needed = 0;
    for (auto i : tr.needed[si]) {
      must_stamp[i] = s;
      need += bytes(i);
      if (!tr.tensors[i].evictable) pinned_needed += bytes(i);
      if (state[i] == 2) {
        make_resident(i);
        p.fetch[si].push_back(i);
      }
    }
    need += pinned_live - pinned_needed;  // pinned tensors count wherever they are live
    if (need > p.lower) p.lower = need, p.worst = s;
    double cur = base + sum(on_device);
    // Evict the resident tensor used furthest ahead (ties: the larger) until the slot fits.
    auto victim = [&](std::int64_t beyond) -> std::optional<std::size_t> {
      std::optional<std::size_t> best;
      std::int64_t best_use = beyond;
      for (auto i : resident) {
        const Tracked& t = tr.tensors[i];
        if (must_stamp[i] == s || !t.evictable) continue;
        const std::int64_t u = next_use(t, s);
        if (u > best_use || (best && u == best_use && t.bytes > tr.tensors[*best].bytes))
          best = i, best_use = u;
      }
      return best;
    };
    while (cur > budget) {
      auto v = victim(s);
      if (!v) break;
      evict(*v, si);
      cur -= bytes(*v);
    }
    if (cur > budget) p.feasible = false;
    // Prefetch what is used soon, nearest use first, if it fits (possibly by evicting what is used
    // later).
    std::vector<std::pair<std::int64_t, std::size_t>> soon;
    for (auto i : evicted) {
      const Tracked& t = tr.tensors[i];
      auto it = std::lower_bound(t.uses.begin(), t.uses.end(), s + 1);
      if (it == t.uses.end()) continue;
      if (t.issue[static_cast<std::size_t>(it - t.uses.begin())] <= s) soon.emplace_back(*it, i);
    }
    std::sort(soon.begin(), soon.end());
    for (const auto& [use, i] : soon) {
      while (cur + bytes(i) > budget) {
        auto v = victim(use);
        if (!v) break;
        evict(*v, si);
        cur -= bytes(*v);
      }
      if (cur + bytes(i) > budget) break;
      make_resident(i);
      cur += bytes(i);
      p.fetch[si].push_back(i);
      p.max_lookahead = std::max(p.max_lookahead, use - s);
    }
    Breakdown m = tr.base[si];
    for (int k = 0; k < kKinds; ++k) m[k] += std::max(0.0, on_device[k]);
    p.memory[si] = m;
    // Host pool: what was evicted, the host copies of clean tensors, host-stepped optimizer state.
    double host = tr.host_fixed + host_evicted + clean_host;
    for (auto i : evicted)
      if (!tr.tensors[i].dirty) host -= bytes(i);  // its host copy is already counted
    p.host_peak = std::max(p.host_peak, host);
  }
  return p;
}

// Pass 2: when every copy runs and how long compute waits for them.
StageSchedule time_copies(const StageInput& in, const Trace& tr, const Placement& pl,
                          const PolicyOptions& opt) {
  StageSchedule out;
  const auto S = static_cast<std::int64_t>(tr.base.size());
  const auto T = tr.tensors.size();
  out.memory = pl.memory;
  out.start.resize(static_cast<std::size_t>(S));
  out.host_peak = pl.host_peak;
  out.max_lookahead = pl.max_lookahead;
  auto secs = [](double bytes, double bw) { return bw > 0 ? bytes / bw : 0.0; };
  double clock = 0, h2d_free = 0, d2h_free = 0, host_free = 0, host_end = 0;
  std::vector<std::int64_t> pending(T, -1), written(T, -1);
  // Per slot: tensors produced there (write-back) and streamed-out gradients finishing there.
  std::vector<std::vector<std::size_t>> after(static_cast<std::size_t>(S));
  for (std::size_t i = 0; i < T; ++i) {
    const Tracked& t = tr.tensors[i];
    if (t.created >= 0) after[static_cast<std::size_t>(t.created)].push_back(i);
    if (t.stream_out && !t.uses.empty() && t.uses.back() != t.created)
      after[static_cast<std::size_t>(t.uses.back())].push_back(i);
  }
  std::int64_t last_h2d = -1;
  auto add = [&](const Tracked& t, bool to_device, double bytes, double ready) {
    double& link = to_device ? h2d_free : d2h_free;
    Transfer x;
    x.kind = t.kind;
    x.unit = t.unit;
    x.micro = t.micro;
    x.to_device = to_device;
    x.bytes = bytes;
    x.start = std::max(ready, link);
    x.end = x.start + secs(bytes, to_device ? opt.h2d : opt.d2h);
    link = x.end;
    out.transfers.push_back(x);
    return static_cast<std::int64_t>(out.transfers.size()) - 1;
  };
  auto wait_for = [&](double& start, std::int64_t xi) {
    if (xi < 0) return;
    auto& x = out.transfers[static_cast<std::size_t>(xi)];
    if (x.end > start) x.exposed += x.end - start, start = x.end;
  };
  for (std::int64_t s = 0; s < S; ++s) {
    const auto si = static_cast<std::size_t>(s);
    double start = clock;
    for (auto i : pl.evict[si]) {
      ++out.evictions;
      if (tr.tensors[i].dirty) wait_for(start, written[i]);
    }
    for (auto i : pl.fetch[si]) {
      ++out.fetches;
      // A copy back to the device starts once the host has the data (its write-back finished).
      const double ready =
          written[i] >= 0 ? std::max(start, out.transfers[static_cast<std::size_t>(written[i])].end)
                          : start;
      pending[i] = add(tr.tensors[i], true, tr.tensors[i].bytes, ready);
    }
    for (auto i : tr.needed[si]) {
      wait_for(start, pending[i]);
      pending[i] = -1;
    }
    out.exposed += start - clock;
    out.start[si] = start;
    clock = start + tr.duration[si];
    for (auto i : after[si]) {
      const Tracked& t = tr.tensors[i];
      // Written back right after it is produced, if it will ever leave the device.
      if (t.dirty && t.created == s && pl.ever_evicted[i])
        written[i] = add(t, false, t.bytes, clock);
      if (t.stream_out && !t.uses.empty() && t.uses.back() == s) {
        const auto g = add(t, false, t.bytes, clock);
        const Unit& u = in.units[static_cast<std::size_t>(t.unit)];
        const double ready = std::max(out.transfers[static_cast<std::size_t>(g)].end, host_free);
        host_free = ready + secs(u.opt_bytes, opt.host_bandwidth);
        Tracked w = t;
        w.kind = Kind::parameters;
        last_h2d = add(w, true, u.update_bytes, host_free);
        host_end = std::max(host_end, out.transfers[static_cast<std::size_t>(last_h2d)].end);
      }
    }
  }
  out.step = std::max(clock, host_end);
  if (host_end > clock && last_h2d >= 0)
    out.transfers[static_cast<std::size_t>(last_h2d)].exposed += host_end - clock;
  out.exposed += std::max(0.0, host_end - clock);
  for (std::size_t s = 0; s < out.memory.size(); ++s)
    if (sum(out.memory[s]) > out.peak_bytes) out.peak_bytes = sum(out.memory[s]), out.peak = s;
  return out;
}

}  // namespace

const char* target_name(Target t) {
  switch (t) {
    case Target::parameters: return "parameters";
    case Target::gradients: return "gradients";
    case Target::optimizer: return "optimizer";
    case Target::activations: return "activations";
    case Target::kv_cache: return "kv_cache";
  }
  return "?";
}

Expected<std::vector<Target>> parse_targets(const std::vector<std::string>& names) {
  static const Target all[] = {Target::parameters, Target::gradients, Target::optimizer,
                               Target::activations, Target::kv_cache};
  std::vector<Target> out;
  for (const auto& n : names) {
    const Target* hit = nullptr;
    for (const auto& t : all)
      if (n == target_name(t)) hit = &t;
    if (!hit)
      return Error(
          Errc::usage, fmt::format("unknown state kind '{}'", n), "",
          "offloadable state kinds: parameters, gradients, optimizer, activations, kv_cache");
    if (!has(out, *hit)) out.push_back(*hit);
  }
  if (has(out, Target::gradients) && !has(out, Target::optimizer))
    return Error(Errc::usage, "state kind 'gradients' moves with the optimizer step", "",
                 "gradients go to the host with the optimizer states they update (ZeRO-Offload); "
                 "add 'optimizer'");
  return out;
}

Expected<StageSchedule> plan_offload(const StageInput& in, const Timeline& base,
                                     const PolicyOptions& opt) {
  std::int64_t with_params = 0;
  for (const auto& u : in.units) with_params += u.param_count > 0 ? 1 : 0;
  std::vector<std::int64_t> splits{0};
  if (in.train && has(opt.targets, Target::optimizer) && with_params > 0) {
    if (opt.optimizer_ratio >= 0) {
      splits = {
          static_cast<std::int64_t>(opt.optimizer_ratio * static_cast<double>(with_params) + 0.5)};
    } else {
      // Every split for small stages, 16 evenly spaced ones (and all units) for large ones.
      const std::int64_t steps = std::min<std::int64_t>(with_params, 16);
      for (std::int64_t i = 1; i <= steps; ++i)
        splits.push_back((with_params * i + steps - 1) / steps);
      splits.erase(std::unique(splits.begin(), splits.end()), splits.end());
    }
  }
  std::optional<StageSchedule> best;
  double lower = std::numeric_limits<double>::infinity();
  std::string where;
  for (auto h : splits) {
    Trace tr = detail::build_trace(in, base, opt, h);
    Placement pl = place(tr, opt.budget);
    if (pl.lower < lower) {
      lower = pl.lower;
      where = describe_slot(in, base.slots[static_cast<std::size_t>(pl.worst)]);
    }
    if (!pl.feasible) continue;
    StageSchedule s = time_copies(in, tr, pl, opt);
    s.host_units = h;
    s.optimizer_ratio =
        with_params > 0 ? static_cast<double>(h) / static_cast<double>(with_params) : 0;
    if (!best || s.step < best->step * (1 - 1e-9)) best = std::move(s);
  }
  if (!best)
    return Error(
        Errc::infeasible,
        fmt::format(
            "no offload schedule fits stage {} in {}: it needs at least {} per device (at the {})",
            in.stage, format_bytes(opt.budget), format_bytes(lower), where),
        "", "raise --hbm, offload more state kinds, or re-plan with more devices or recomputation");
  best->lower_bound = lower;
  return std::move(*best);
}

}  // namespace hp::offload
