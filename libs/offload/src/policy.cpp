// The offload policy of policy.h: build the trace of offloadable tensors, place them under the
// budget (pass 1, memory only, Belady eviction and bounded prefetch), then time the copies (pass
// 2).
#include "hp/offload/policy.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include <fmt/core.h>

#include "hp/core/units.h"

namespace hp::offload {
namespace {

constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

struct Tracked {
  Kind kind = Kind::activations;
  std::int64_t unit = 0, micro = 0;
  double bytes = 0;
  std::int64_t created = -1;        ///< first slot it is live; -1: live when the step starts
  std::int64_t last = 0;            ///< last slot it is live
  std::vector<std::int64_t> uses;   ///< slots that read it, ascending
  std::vector<std::int64_t> issue;  ///< per use: the earliest slot its prefetch may be issued
  bool dirty = true;                ///< the host has no copy until it is written back
  bool evictable = true;
  bool stream_out = false;  ///< host-optimizer gradients: copied out after their last use
};

struct Trace {
  std::vector<Breakdown> base;   ///< untracked bytes per slot
  std::vector<double> duration;  ///< device seconds per slot
  std::vector<Tracked> tensors;
  std::vector<std::vector<std::size_t>> needed;  ///< per slot: tensors used or created there
  std::vector<bool> host_unit;
  double host_fixed = 0;  ///< optimizer states and gradients of host-stepped units
};

bool has(const std::vector<Target>& ts, Target t) {
  return std::find(ts.begin(), ts.end(), t) != ts.end();
}

std::int64_t next_use(const Tracked& t, std::int64_t s) {
  auto it = std::lower_bound(t.uses.begin(), t.uses.end(), s);
  return it == t.uses.end() ? kNever : *it;
}

Trace build_trace(const StageInput& in, const Timeline& tl, const PolicyOptions& opt,
                  std::int64_t host_units) {
  Trace tr;
  const auto S = static_cast<std::int64_t>(tl.slots.size());
  const auto n = in.units.size();
  tr.base.resize(static_cast<std::size_t>(S));
  tr.duration.resize(static_cast<std::size_t>(S));
  for (std::int64_t s = 0; s < S; ++s) {
    tr.base[static_cast<std::size_t>(s)] = tl.slots[static_cast<std::size_t>(s)].memory;
    tr.duration[static_cast<std::size_t>(s)] = tl.slots[static_cast<std::size_t>(s)].duration;
  }
  // The host steps the last `host_units` units with parameters (their gradients arrive first).
  tr.host_unit.assign(n, false);
  for (std::size_t u = n, left = static_cast<std::size_t>(host_units); u-- > 0 && left > 0;)
    if (in.units[u].param_count > 0) tr.host_unit[u] = true, --left;

  std::vector<std::vector<std::int64_t>> slots_of(n);
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> bwd_slot;
  for (std::int64_t s = 0; s < S; ++s) {
    const Slot& sl = tl.slots[static_cast<std::size_t>(s)];
    if (sl.type == Slot::optimizer && tr.host_unit[static_cast<std::size_t>(sl.unit)]) {
      tr.duration[static_cast<std::size_t>(s)] = 0;  // runs on the host instead
      continue;
    }
    slots_of[static_cast<std::size_t>(sl.unit)].push_back(s);
    if (sl.type == Slot::backward) bwd_slot[{sl.unit, sl.micro}] = s;
  }
  // Untracked = baseline minus what becomes tracked, over each tracked tensor's live range.
  std::vector<std::array<double, kKinds>> diff(static_cast<std::size_t>(S) + 1, Breakdown{});
  auto track = [&](Tracked t) {
    const auto k = static_cast<int>(t.kind);
    diff[static_cast<std::size_t>(std::max<std::int64_t>(0, t.created))][k] += t.bytes;
    diff[static_cast<std::size_t>(t.last + 1)][k] -= t.bytes;
    tr.tensors.push_back(std::move(t));
  };
  for (std::size_t u = 0; u < n; ++u) {
    const Unit& x = in.units[u];
    if (tr.host_unit[u]) {
      tr.host_fixed += x.optimizer + x.gradients;
      for (auto& b : tr.base) b[static_cast<int>(Kind::optimizer)] -= x.optimizer;
      // Gradients accumulate over the micro-batches on the device, then stream to the host.
      std::vector<std::int64_t> bw;
      for (auto s : slots_of[u])
        if (tl.slots[static_cast<std::size_t>(s)].type == Slot::backward) bw.push_back(s);
      if (!bw.empty() && x.gradients > 0) {
        // The baseline holds them from the unit's first backward on (timeline.cpp).
        for (auto s = bw.front(); s < S; ++s)
          tr.base[static_cast<std::size_t>(s)][static_cast<int>(Kind::gradients)] -= x.gradients;
        Tracked g;
        g.kind = Kind::gradients;
        g.unit = static_cast<std::int64_t>(u);
        g.bytes = x.gradients;
        g.created = bw.front();
        g.last = std::min(S - 1, bw.back() + 1);  // held while the copy drains
        g.uses = bw;
        g.evictable = false;
        g.stream_out = true;
        // The subtraction above already removed them from the baseline: cancel track()'s
        // subtraction over the live range.
        track(g);
        diff[static_cast<std::size_t>(g.created)][static_cast<int>(Kind::gradients)] -= x.gradients;
        diff[static_cast<std::size_t>(g.last + 1)][static_cast<int>(Kind::gradients)] +=
            x.gradients;
      }
    }
    if (has(opt.targets, Target::parameters) && x.parameters > 0 && !slots_of[u].empty()) {
      Tracked p;
      p.kind = Kind::parameters;
      p.unit = static_cast<std::int64_t>(u);
      p.bytes = x.parameters;
      p.created = -1;
      p.last = S - 1;
      p.uses = slots_of[u];
      p.dirty = false;  // the host keeps a copy; weights change only at the optimizer step
      track(p);
    }
  }
  for (std::int64_t s = 0; s < S; ++s) {
    const Slot& sl = tl.slots[static_cast<std::size_t>(s)];
    if (sl.type != Slot::forward) continue;
    const Unit& x = in.units[static_cast<std::size_t>(sl.unit)];
    if (in.train && x.act > 0 && has(opt.targets, Target::activations)) {
      auto b = bwd_slot.find({sl.unit, sl.micro});
      if (b != bwd_slot.end()) {
        Tracked a;
        a.kind = Kind::activations;
        a.unit = sl.unit;
        a.micro = sl.micro;
        a.bytes = x.act;
        a.created = s;
        a.last = b->second;
        a.uses = {b->second};
        track(a);
      }
    }
    if (x.kv > 0 && has(opt.targets, Target::kv_cache)) {
      Tracked k;
      k.kind = Kind::kv_cache;
      k.unit = sl.unit;
      k.micro = sl.micro;
      k.bytes = x.kv;
      k.created = s;
      k.last = S - 1;
      track(k);
    }
  }
  Breakdown run{};
  for (std::int64_t s = 0; s < S; ++s) {
    for (int k = 0; k < kKinds; ++k) {
      run[k] += diff[static_cast<std::size_t>(s)][k];
      tr.base[static_cast<std::size_t>(s)][k] =
          std::max(0.0, tr.base[static_cast<std::size_t>(s)][k] - run[k]);
    }
  }
  // Prefetch issue points: `lookahead` slots early, or early enough that compute covers the copy.
  std::vector<double> prefix(static_cast<std::size_t>(S) + 1, 0);
  for (std::int64_t s = 0; s < S; ++s)
    prefix[static_cast<std::size_t>(s) + 1] =
        prefix[static_cast<std::size_t>(s)] + tr.duration[static_cast<std::size_t>(s)];
  tr.needed.resize(static_cast<std::size_t>(S));
  for (std::size_t i = 0; i < tr.tensors.size(); ++i) {
    Tracked& t = tr.tensors[i];
    const double copy = opt.h2d > 0 ? t.bytes / opt.h2d : 0;
    for (auto u : t.uses) {
      std::int64_t from;
      if (opt.lookahead >= 0) {
        from = std::max<std::int64_t>(0, u - opt.lookahead);
      } else {
        const double want = prefix[static_cast<std::size_t>(u)] - copy;
        auto it = std::upper_bound(prefix.begin(), prefix.begin() + u, want);
        from = std::max<std::int64_t>(0, static_cast<std::int64_t>(it - prefix.begin()) - 1);
      }
      t.issue.push_back(from);
      tr.needed[static_cast<std::size_t>(u)].push_back(i);
    }
    if (t.created >= 0 && (t.uses.empty() || t.uses.front() != t.created))
      tr.needed[static_cast<std::size_t>(t.created)].push_back(i);
  }
  return tr;
}

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
    Trace tr = build_trace(in, base, opt, h);
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
