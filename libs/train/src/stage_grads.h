// A pipeline stage's gradient model (autodiff.h, GradSpec::output_grads and input_grads): the
// checks of the names and the graph inputs and outputs they add. autodiff.cpp calls these around
// its own steps; the backward between them is the same as for a loss.
#pragma once

#include <string>
#include <vector>

#include "grad_ctx.h"
#include "hp/train/autodiff.h"

namespace hp::train::detail {

/// "<tensor>.grad": the graph input holding an output's incoming gradient, or the graph output
/// holding an input's gradient.
std::string stage_grad_name(const std::string& tensor);

/// Every problem with the spec's stage names, in one Errc::bad_input error: output_grads that are
/// no graph output or not floating point, input_grads that are no graph input (initializers are
/// not) or not floating point, a name listed twice, a "<name>.grad" already taken, and a spec with
/// neither a loss nor output_grads (nothing to differentiate).
Status check_stage_spec(const GraphWriter& w, const GradSpec& spec, const std::string& where);

/// Declares one graph input "<output>.grad" per output_grads entry (the output's dtype and dims)
/// and returns their names in the spec's order.
std::vector<std::string> declare_output_grads(GraphWriter& w, const GradSpec& spec);

}  // namespace hp::train::detail
