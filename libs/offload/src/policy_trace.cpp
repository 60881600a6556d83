// build_trace (policy_trace.h): the offloadable tensors of one stage's schedule, each with the
// slots that create and read it and the earliest slot each read's prefetch may start.
#include "policy_trace.h"

#include <map>
#include <optional>

namespace hp::offload::detail {

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

}  // namespace hp::offload::detail
