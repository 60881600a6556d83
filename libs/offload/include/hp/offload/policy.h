// The offload policy (docs/offload.md, "The offload policy"): given a device-memory budget, which
// state lives in the host pool and when it moves. Offloadable tensors are traced through the
// stage's slots (first and every later use); at each slot the tensors it uses must be on the
// device, and when the budget is exceeded the resident tensor whose next use is furthest ahead is
// evicted (Belady). Evicted tensors come back ahead of their next use: the copy is issued
// `lookahead` slots early, or (auto) early enough that the compute in between covers it, as long as
// the budget allows. Dirty tensors (activations, KV cache, gradients) are written back right after
// they are produced.
//
// A second pass times every copy on one host-to-device and one device-to-host link: a slot starts
// only when what it needs has arrived and what it evicts has been written back; the waiting is the
// exposed transfer time. With the optimizer target, the optimizer step of the last units (whose
// gradients arrive first in backward) runs on the host (ZeRO-Offload / SuperOffload split): their
// optimizer states live on the host, their gradients stream out after their last backward and the
// updated parameters stream back; the host's share of the step is the split ratio, chosen as the
// fastest feasible one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/offload/timeline.h"

namespace hp::offload {

enum class Target { parameters, gradients, optimizer, activations, kv_cache };
const char* target_name(Target t);
/// Parses state kinds ("parameters", "gradients", "optimizer", "activations", "kv_cache");
/// an unknown kind is Errc::usage naming the known ones. "gradients" needs "optimizer".
Expected<std::vector<Target>> parse_targets(const std::vector<std::string>& names);

struct PolicyOptions {
  double budget = 0;  ///< bytes of device memory the stage may use
  std::vector<Target> targets;
  std::int64_t lookahead =
      -1;                     ///< slots ahead a fetch is issued; -1 = as early as compute hides it
  double h2d = 0, d2h = 0;    ///< link bandwidths, bytes/s
  double host_bandwidth = 0;  ///< host memory bandwidth for the host optimizer step, bytes/s
  double optimizer_ratio = -1;  ///< host share of the optimizer step; -1 = choose
};

/// One copy between device and host.
struct Transfer {
  Kind kind = Kind::activations;
  std::int64_t unit = 0, micro = 0;
  bool to_device = true;  ///< H2D (prefetch) or D2H (write-back)
  double bytes = 0, start = 0, end = 0;
  double exposed = 0;  ///< seconds compute waited for it (0 = hidden)
};

struct StageSchedule {
  std::vector<Breakdown> memory;  ///< per slot of the timeline: device bytes after offload
  std::vector<double> start;      ///< per slot: start time after waits
  std::vector<Transfer> transfers;
  std::size_t peak = 0;
  double peak_bytes = 0;
  double host_peak = 0;  ///< most bytes in the host pool at once
  double exposed = 0;    ///< seconds of waiting on copies (and on the host optimizer)
  double step = 0;       ///< this stage's work with the waits
  double optimizer_ratio =
      0;  ///< units whose optimizer step runs on the host / units with parameters
  std::int64_t host_units = 0;
  std::int64_t evictions = 0, fetches = 0;
  std::int64_t max_lookahead = 0;  ///< furthest ahead (slots) a prefetch was issued
  double lower_bound = 0;          ///< the smallest budget any schedule of these targets needs
};

/// The schedule under `opt`. Budget below every schedule's need: Errc::infeasible naming the need.
Expected<StageSchedule> plan_offload(const StageInput& in, const Timeline& base,
                                     const PolicyOptions& opt);

}  // namespace hp::offload
