// The plan's prediction of a sharded recipe's step, to report next to the measured one: hp plan's
// cost model (libs/planner) on the recipe's cluster with every degree the recipe states fixed, in
// inference mode (a sharded run is forward passes) at the model's own dtype (fp32 on the executor).
#include "hp/job/predict.h"

#include <fmt/core.h>

#include "hp/planner/planner.h"
#include "hp/recipe/presets.h"

namespace hp::job {
namespace fs = std::filesystem;

Expected<double> predicted_step_seconds(const recipe::Recipe& r, const fs::path& recipe_path,
                                        const std::vector<fs::path>& preset_dirs) {
  planner::PlanOptions po;
  po.model = (recipe_path.parent_path() / r.model).string();
  po.mode = "infer";
  po.dtype = "fp32";
  po.optimizer = "none";
  po.top_k = 1;
  for (const auto& [k, v] : r.dims) {
    if (k == "batch") po.global_batch = v;
    else if (k == "seq") po.seq = v;
    else po.dim_args.push_back(fmt::format("{}={}", k, v));
  }
  const auto& p = r.parallel;
  po.fix_args = {fmt::format("dp={}", p.dp), fmt::format("tp={}", p.tp), fmt::format("pp={}", p.pp),
                 fmt::format("micro_batches={}", p.micro_batches),
                 fmt::format("schedule={}", recipe::schedule_name(p.schedule)),
                 fmt::format("sequence_parallel={}", p.sequence_parallel ? "true" : "false")};
  if (p.schedule == recipe::Schedule::interleaved) po.fix_args.push_back(fmt::format("virtual_stages={}", p.virtual_stages));
  auto cluster = recipe::cluster_for(r, recipe_path.parent_path(), preset_dirs);
  if (!cluster) return std::move(cluster).error();
  po.nodes = cluster->nodes;
  auto report = planner::run(po, *cluster);
  if (!report) return std::move(report).error();
  return report->plans.front().predicted.iteration;
}

}  // namespace hp::job
