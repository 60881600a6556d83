// The plan's prediction of a sharded recipe's step, to report next to the measured one: hp plan's
// cost model (libs/planner) pricing the recipe's own configuration, in inference mode (a sharded
// run is forward passes) at the model's own dtype (fp32 on the executor).
#include "hp/job/predict.h"

#include "hp/planner/predict.h"

namespace hp::job {

Expected<planner::Prediction> predicted_step(const recipe::Recipe& r,
                                             const std::filesystem::path& base_dir,
                                             const recipe::Cluster& cluster, bool train) {
  planner::PredictOptions po;
  po.train = train;
  po.dtype = "fp32";
  po.optimizer = train && r.train ? r.train->optimizer : "none";
  HP_ASSIGN_OR_RETURN(const planner::Plan plan, planner::predict_recipe(r, base_dir, cluster, po));
  return plan.predicted;
}

Expected<double> predicted_step_seconds(const recipe::Recipe& r,
                                        const std::filesystem::path& base_dir,
                                        const recipe::Cluster& cluster, bool train) {
  HP_ASSIGN_OR_RETURN(const planner::Prediction p, predicted_step(r, base_dir, cluster, train));
  return p.iteration;
}

}  // namespace hp::job
