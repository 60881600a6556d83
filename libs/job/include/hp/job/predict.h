// The plan's predicted step time of a recipe (hp plan's cost model), reported by hp launch next to
// the measured step of a sharded run.
#pragma once

#include <filesystem>

#include "hp/core/expected.h"
#include "hp/planner/cost.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/recipe.h"

namespace hp::job {

/// Seconds per step the planner's cost model predicts for `r` run as inference (forward passes,
/// fp32) on `cluster` (the cluster it runs on: recipe::cluster_for) with exactly the recipe's
/// configuration: degrees, micro-batches, schedule, placement and stage layout
/// (planner::predict_recipe; `base_dir` is the recipe's directory, which its model path is relative
/// to). Errors are the planner's (a model it cannot profile, a configuration it cannot price);
/// callers report the measurement without a prediction then.
/// With `train`: a training step (forward, backward and the recipe's [train] optimizer) instead.
Expected<double> predicted_step_seconds(const recipe::Recipe& r,
                                        const std::filesystem::path& base_dir,
                                        const recipe::Cluster& cluster, bool train = false);
/// predicted_step_seconds with the step's parts: compute, bubble and exposed seconds per kind of
/// communication.
Expected<planner::Prediction> predicted_step(const recipe::Recipe& r,
                                             const std::filesystem::path& base_dir,
                                             const recipe::Cluster& cluster, bool train = false);

}  // namespace hp::job
