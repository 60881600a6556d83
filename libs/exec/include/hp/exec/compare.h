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

/// True when every output is within tolerance.
bool all_ok(const std::vector<OutputCheck>& checks);

}  // namespace hp::exec
