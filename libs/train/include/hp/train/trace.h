// What a training rank did and when, in the Chrome trace event format (Perfetto and
// chrome://tracing open it): `hp launch RECIPE --trace FILE.json`.
//
// Each rank records complete events ("ph": "X") with microsecond timestamps of the steady clock,
// which on one host is CLOCK_MONOTONIC and therefore shared by every rank's process; ranks on other
// hosts are not aligned with each other. pid = the rank, tid 0 = the step's own thread (forward +
// backward, the reduction left after it, the optimizer, checkpoints), tid 1 = the rank's gradient
// communication thread (one event per bucket), tid 2 = the gradient model's nodes, tid 3 = the
// ZeRO-3 thread that gathers parameters for the executor (one event per gather). A rank writes its
// events into a part file; the launcher merges the parts into one file (merge_traces).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "hp/core/expected.h"

namespace hp::train {

class TraceLog {
 public:
  using Clock = std::chrono::steady_clock;
  /// Records [t0, t1) on thread `tid` (thread-safe). `args` is a JSON object's text or empty.
  void add(std::string name, const char* category, int tid, Clock::time_point t0,
           Clock::time_point t1, std::string args = "");
  /// Writes {"traceEvents": [...]} with this rank's events and its process name, atomically.
  Status write(const std::filesystem::path& path, int rank) const;

 private:
  struct Event {
    std::string name, args;
    const char* category;
    int tid;
    std::int64_t ts, dur;  ///< microseconds
  };
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

/// The part file of rank `rank` for the trace `path` ("<path>.rank-<rank>").
std::filesystem::path trace_part(const std::filesystem::path& path, int rank);
/// Merges the part files of `ranks` ranks into `path` (atomically) and removes them.
/// Errc::runtime naming a part that is missing or not a trace.
Status merge_traces(const std::filesystem::path& path, int ranks);

}  // namespace hp::train
