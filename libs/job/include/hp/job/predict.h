// The plan's predicted step time of a recipe (hp plan's cost model), reported by hp launch next to
// the measured step of a sharded run.
#pragma once

#include <filesystem>
#include <vector>

#include "hp/core/expected.h"
#include "hp/recipe/recipe.h"

namespace hp::job {

/// Seconds per step the planner predicts for `r` run as inference (forward passes, fp32) on its
/// cluster with its degrees, micro-batches and schedule fixed. Errors are the planner's (a cluster it
/// cannot find, degrees it cannot place); callers report the measurement without a prediction then.
Expected<double> predicted_step_seconds(const recipe::Recipe& r, const std::filesystem::path& recipe_path,
                                        const std::vector<std::filesystem::path>& preset_dirs);

}  // namespace hp::job
