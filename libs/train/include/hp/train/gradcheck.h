// Checking hp's gradients against finite differences (docs/training.md, "Checking gradients").
//
// Users who bring their own models need to know that the gradient model hp builds for them
// (autodiff.h) computes the gradient of the loss. check_gradients builds it as training does,
// rewrites it to compute in float64 (to_float64), runs it once for the loss and every gradient g,
// then for a few random unit directions d over all trainable tensors compares the directional
// derivative <g, d> with the central difference (L(theta + h d) - L(theta - h d)) / (2 h), each
// loss a run of the same float64 model with its weights moved through Executor::set_weight.
//
// Float64 is what makes the comparison sharp: in float32 the difference quotient loses about half
// of its digits to rounding, so only gross errors would show; in float64 a correct gradient agrees
// to about 1e-8 relative (GradCheckOptions::tolerance, and the measurements in docs/training.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/model.h"
#include "hp/train/autodiff.h"

namespace hp::train {

/// The same model computing in float64: every float32/float16/bfloat16 initializer (its data
/// converted), graph input, output and value_info type, Constant value (value, value_float,
/// value_floats), ConstantOfShape value and other tensor attributes, and the dtype-naming
/// attributes of ai.onnx ops (Cast `to`, the random ops' and EyeLike's `dtype`) become DOUBLE,
/// subgraphs and model functions included. Initializers converted from external data are stored
/// inline; the others keep their files (the model keeps its path). Errc::bad_input when a float
/// initializer's data is missing or malformed.
Expected<model::Model> to_float64(const model::Model& m);

struct GradCheckOptions {
  std::filesystem::path model;
  GradSpec grad;  ///< grad.logits empty: the model's first graph output
  /// input_K.pb tensors of the forward model's inputs, optionally followed by the labels (named
  /// grad.labels, or one more tensor than the forward takes). Empty: generated (see
  /// check_gradients).
  std::filesystem::path inputs;
  int directions = 3;
  std::uint64_t seed = 1;
  /// The step is h = eps * max(1, |theta|) along a unit direction (|theta|: the 2-norm of all
  /// trainable values), relative to the weights' scale. Larger steps lose to the truncation error
  /// of the central difference (h^2 times a third derivative; kinks such as ReLU and TopK routing
  /// once h reaches them), smaller ones to rounding (about 1e-16 |L| / h): docs/training.md
  /// ("Checking gradients") has the measured trade-off.
  double eps = 3e-6;
  /// A direction passes when |analytic - numeric| <= tolerance * max(|analytic|, |numeric|,
  /// floor), floor = |g| / sqrt(parameters) / 10 (a tenth of the typical |<g, d>| for a random
  /// unit d, so that a direction nearly orthogonal to g is not judged on rounding alone). Correct
  /// gradients of the tests/property/zoo.py exports and tests/data/models stay below 2e-7 at the
  /// default eps (most below 1e-8); a wrong rule is off by a factor in some component, 1e-4 and
  /// more. 1e-6 sits between the two.
  double tolerance = 1e-6;
  std::string backend = "cpu";
  int threads = 0;
  std::vector<std::filesystem::path> plugin_paths;
};

/// One direction's comparison.
struct DirectionCheck {
  double analytic = 0;  ///< <g, d>
  double numeric = 0;   ///< (L+ - L-) / (2 h)
  double rel_error = 0;
  bool ok = false;
};

struct GradCheckReport {
  std::string model;
  double loss = 0;  ///< at theta, in float64
  double step = 0;  ///< h
  double tolerance = 0;
  std::int64_t parameters = 0;  ///< scalar parameters checked
  double grad_norm = 0;         ///< |g|
  /// |g| / sqrt(parameters) / 10: the least denominator of a relative error (GradCheckOptions).
  double floor = 0;
  std::vector<std::string> params;               ///< trainable tensors, in file order
  std::map<std::string, std::string> untrained;  ///< name -> why (GradGraph::untrained)
  std::map<std::string, int> tied;               ///< name -> readers (GradGraph::tied)
  bool generated_inputs = false;
  std::vector<DirectionCheck> directions;

  bool ok() const;
  double worst() const;  ///< the largest relative error
  std::string text() const;
  std::string json() const;
  /// The Errc::mismatch error naming the worst direction (exit 6).
  Error mismatch() const;
};

/// Loads the model (weights required), converts it with to_float64, builds its gradient model
/// (build_grad_graph with options.grad: the constants its rules emit are then double as well) and
/// compares as the file comment says.
///
/// Without options.inputs the inputs are generated from options.seed: float inputs normal(0, 1);
/// int64/int32 inputs read directly as the indices of a Gather from an initializer table uniform in
/// [0, rows of the table) (token ids), any other integer input an error asking for --inputs;
/// symbolic dims are 2 on the first axis and 5 elsewhere (the same symbol the same value); labels
/// uniform in [0, C) for cross_entropy (C: the logits' last dim) and normal(0, 1) for mse, at the
/// shape the forward model's output has on those inputs.
///
/// A mismatch is not an error: the report says which directions failed. Errors: bad_input (the
/// model, the inputs, an op without a gradient rule on a trainable path, no trainable tensor),
/// runtime (a run failed or a loss is not finite).
Expected<GradCheckReport> check_gradients(const GradCheckOptions& options);

/// The comparison alone, for an already built gradient model (tests hand in a deliberately wrong
/// one): `gg` as build_grad_graph returned it, `forward` the model it was built from.
Expected<GradCheckReport> check_grad_graph(const model::Model& forward, const GradGraph& gg,
                                           const GradCheckOptions& options);

}  // namespace hp::train
