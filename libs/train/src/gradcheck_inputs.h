// Private: the inputs of a gradient check (gradcheck.cpp), read or generated as gradcheck.h says,
// and the seeded random numbers both use.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "hp/exec/executor.h"
#include "hp/model/graph.h"
#include "hp/model/model.h"
#include "hp/train/autodiff.h"

namespace hp::train::detail {

/// Normal(0, 1) numbers from splitmix64 (Box-Muller): the same sequence on every platform, which
/// std::normal_distribution does not promise.
class Normal {
 public:
  explicit Normal(std::uint64_t seed) : state_(seed) {}
  std::uint64_t bits() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in (0, 1].
  double uniform() { return (static_cast<double>(bits() >> 11) + 1) * 0x1.0p-53; }
  /// Uniform in [0, n).
  std::int64_t below(std::int64_t n) {
    return static_cast<std::int64_t>(uniform() * static_cast<double>(n) * (1 - 0x1.0p-53));
  }
  double operator()() {
    if (spare_) {
      spare_ = false;
      return next_;
    }
    const double r = std::sqrt(-2 * std::log(uniform())), t = 2 * M_PI * uniform();
    next_ = r * std::sin(t);
    spare_ = true;
    return r * std::cos(t);
  }

 private:
  std::uint64_t state_;
  bool spare_ = false;
  double next_ = 0;
};

struct CheckInputs {
  std::vector<exec::HostTensor> tensors;  ///< the gradient model's inputs, labels last
  bool generated = false;                 ///< some were generated (the data inputs or the labels)
};

/// The symbolic dims of the forward model's inputs as the check will run them (GradSpec::dims):
/// those of the tensors in `dir`, or the generated shapes' (see gradcheck_inputs.cpp).
Expected<model::DimBindings> gradcheck_dims(const model::Model& fwd64,
                                            const std::filesystem::path& dir);

/// The gradient model's inputs (`graph_inputs`, as exec::model_io lists them: the data inputs, then
/// the labels): from `dir` (float32 widened to float64; the labels may be left out and are then
/// generated) or generated from `seed`. `fwd64` is the float64 forward model, run once for the
/// logits' shape when labels are generated.
Expected<CheckInputs> gradcheck_inputs(const model::Model& fwd64,
                                       const std::vector<exec::GraphIO>& graph_inputs,
                                       const exec::ExecOptions& backends,
                                       const std::filesystem::path& dir, const GradSpec& spec,
                                       std::uint64_t seed);

}  // namespace hp::train::detail
