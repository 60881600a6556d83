// Learning-rate schedules (optimizer.h states the formulas). The cosine schedule is nanoGPT's
// get_lr: a linear warm-up that reaches the peak rate at the last warm-up step, then half a cosine
// period down to min_lr at total_steps, and min_lr after.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "hp/train/optimizer.h"

namespace hp::train {

double learning_rate(const OptimizerConfig& c, std::int64_t step) {
  if (c.schedule == LrSchedule::constant) return c.lr;
  if (c.warmup_steps > 0 && step <= c.warmup_steps)
    return c.lr * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
  // No decay phase when the run ends with the warm-up (or total_steps is unset).
  if (c.total_steps <= c.warmup_steps) return c.lr;
  const double progress = std::clamp(static_cast<double>(step - c.warmup_steps) /
                                         static_cast<double>(c.total_steps - c.warmup_steps),
                                     0.0, 1.0);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace hp::train
