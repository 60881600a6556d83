// The closing lines of a training run (run_summary.h).
#include "run_summary.h"

#include <fmt/core.h>

#include <algorithm>

namespace hp::train::detail {

double median_step_seconds(const std::vector<StepMetrics>& steps) {
  std::vector<double> secs;
  for (const auto& m : steps) secs.push_back(m.seconds);
  std::sort(secs.begin(), secs.end());
  return secs.empty() ? 0 : secs[secs.size() / 2];
}

std::string last_step_line(const StepMetrics& last, const exec::ExecStats& stats,
                           const std::string& collectives, const std::string& reduction) {
  // Where the last step's time went: the op types that took most of it.
  std::vector<std::pair<double, std::string>> ops;
  double total = 0;
  for (const auto& [op, t] : stats.by_op) {
    ops.emplace_back(t.seconds, op);
    total += t.seconds;
  }
  std::sort(ops.rbegin(), ops.rend());
  std::string line;
  for (std::size_t k = 0; k < ops.size() && k < 8; ++k)
    line += fmt::format("{}{} {:.0f}%", k ? ", " : "", ops[k].second,
                        total > 0 ? 100 * ops[k].first / total : 0.0);
  if (line.empty()) return "";
  std::string comm;
  if (!collectives.empty())
    comm = fmt::format(" ({:.3f} s in {}-parallel collectives)",
                       collectives == "expert" ? last.ep_comm_seconds : last.tp_comm_seconds,
                       collectives);
  if (!reduction.empty())
    comm += fmt::format(", {:.3f} s gradient reduction ({} parallel, after the backward)",
                        last.reduce_seconds, reduction);
  return fmt::format(
      "last step: {:.3f} s forward+backward{}, {:.3f} s optimizer, {:.3f} s other; by op: {}\n",
      last.run_seconds, comm, last.update_seconds,
      last.seconds - last.run_seconds - last.reduce_seconds - last.update_seconds, line);
}

std::string zero3_line(DataParallelSync& s, const std::string& what) {
  auto mib = [](std::int64_t b) {
    return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
  };
  return fmt::format(
      "ZeRO-3: the {} held in shards of {}; gradients staged in {} of bucket buffers (whole: "
      "{})\n",
      what, mib(s.flat_bytes() / s.shard_count()), mib(s.gradient_bytes()), mib(s.flat_bytes()));
}

std::string per_step_line(std::size_t gathered, std::size_t steps, std::int64_t peak_bytes) {
  return fmt::format(
      "ZeRO-3 per-step gathers: {} bucket gathers per step, each kept to the step's end ({:.1f} "
      "MiB at most)\n",
      steps ? gathered / steps : 0, static_cast<double>(peak_bytes) / (1 << 20));
}

std::string expert_layers_line(int layers, int routed, int summed) {
  std::string out = fmt::format(
      "expert layers: {} of {} dispatched by their routing (each token to its experts' ranks), "
      "{} by all-gathering the tokens\n",
      routed, layers, layers - routed);
  if (summed > 0)
    out += fmt::format(
        "  ({} of them a loop adding each expert's rows into the layer's sum: the members' "
        "partial sums reduce-scattered)\n",
        summed);
  return out;
}

}  // namespace hp::train::detail
