// offload_run_for (offload_run.h): from the recipe's [offload] section to what a rank passes to its
// backends (the cpu backend's enforced device budget) and to its executor.
#include <fmt/core.h>

#include <cmath>

#include "hp/job/offload_run.h"

namespace hp::job {

Expected<OffloadRun> offload_run_for(const recipe::Recipe& r, std::int64_t stage,
                                     const std::string& backend) {
  if (stage < 0 || stage >= r.parallel.pp)
    return Error(Errc::usage,
                 fmt::format("offload: stage {} is outside the recipe's {} pipeline stage{}", stage,
                             r.parallel.pp, r.parallel.pp == 1 ? "" : "s"));
  OffloadRun run;
  if (!r.offload || !r.offload->enabled) return run;
  const recipe::Offload& o = *r.offload;
  if (!(o.device_budget >= 0) || !std::isfinite(o.device_budget))
    return Error(Errc::bad_input,
                 "offload: 'offload.device_budget' must be a finite, non-negative number of bytes");
  if (backend == "cpu" && o.device_budget == 0)
    return Error(
        Errc::bad_input, "offload: the cpu backend needs 'offload.device_budget' to enforce", "",
        "its device memory is the host's; 'hp offload-profile --hbm BYTES -o' writes the budget");
  run.exec.enabled = true;
  run.exec.budget = o.device_budget;
  run.exec.margin = o.margin;
  run.exec.lookahead = o.prefetch_lookahead;
  run.exec.weights = run.exec.activations = false;
  for (const std::string& t : o.targets) {
    if (t == "parameters")
      run.exec.weights = true;
    else if (t == "activations")
      run.exec.activations = true;
    else
      run.notes.push_back(
          fmt::format("offload target '{}' has no effect on a forward run (weights and "
                      "activations move; {} are training or decode state)",
                      t, t));
  }
  // Every plugin sees every open option; only the cpu backend reads this one. Whole bytes: the
  // arena counts bytes.
  if (o.device_budget > 0 && (backend == "cpu" || backend.empty()))
    run.open_options.push_back(
        fmt::format("device_budget={}", static_cast<unsigned long long>(o.device_budget)));
  return run;
}

}  // namespace hp::job
