// The trace the offload policy works on (policy.cpp): every offloadable tensor of one stage's
// schedule with the slots that create and read it, and the untracked bytes and time per slot.
// policy_trace.cpp builds it; policy.cpp places the tensors under the budget and times the copies.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "hp/offload/policy.h"

namespace hp::offload::detail {

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

inline bool has(const std::vector<Target>& ts, Target t) {
  return std::find(ts.begin(), ts.end(), t) != ts.end();
}

inline std::int64_t next_use(const Tracked& t, std::int64_t s) {
  auto it = std::lower_bound(t.uses.begin(), t.uses.end(), s);
  return it == t.uses.end() ? kNever : *it;
}

/// The trace of `in`'s offloadable tensors over the timeline `tl`; the last `host_units` units
/// with parameters step their optimizer on the host.
Trace build_trace(const StageInput& in, const Timeline& tl, const PolicyOptions& opt,
                  std::int64_t host_units);

}  // namespace hp::offload::detail
