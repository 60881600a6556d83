// Comparing a run's outputs with expected ones: what `hp verify` reports per output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/exec/tensor.h"

namespace hp::exec {

/// The comparison of one output.
struct OutputCheck {
  std::string name;
  double max_abs = 0;    ///< max |got - want|
  double max_rel = 0;    ///< max |got - want| / |want| over elements with want != 0
  std::int64_t bad = 0;  ///< elements with |got - want| > atol + rtol * |want|
  std::string problem;   ///< dtype or shape mismatch, else empty
  bool ok() const { return bad == 0 && problem.empty(); }
};

/// Compares two tensors elementwise (NaN equals NaN; integer and bool tensors must match exactly).
OutputCheck compare_tensors(const HostTensor& got, const HostTensor& want, double rtol,
                            double atol);

/// "name: max abs error 1e-08, max rel error 3e-05: ok", or "...: MISMATCH (N elements out of
/// tolerance)", or "name: MISMATCH: <problem>" (no newline): one output's line in hp verify's
/// report.
std::string format_check(const OutputCheck& c);

/// Element i of `t` as a double (16-bit floats decoded; integers and bool converted).
double element_value(const HostTensor& t, std::int64_t i);

/// What `hp launch MODEL.onnx` prints of an output it was not asked to write: its header, the
/// range of its values and the first few.
struct TensorSummary {
  std::string name, dtype;
  std::vector<std::int64_t> dims;
  double min = 0, max = 0, mean = 0;  ///< over the non-NaN elements (`counted` of them)
  std::int64_t counted = 0, nans = 0;
  std::vector<double> first;  ///< the first few elements in storage order
};
TensorSummary summarize_tensor(const HostTensor& t, int first = 5);
/// "logits f32 [2, 8, 50]: min -1.2 max 3.4 mean 0.01 [0.1, 0.2, ...]" (no newline).
std::string format_summary(const TensorSummary& s);

/// True when every output is within tolerance.
bool all_ok(const std::vector<OutputCheck>& checks);

}  // namespace hp::exec
