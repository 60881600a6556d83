// Parsing of `hp plan --dim NAME=VALUE` bindings. The options struct of `hp plan` itself lives in
// libs/planner (hp/planner/options.h); dim bindings stay here because --summary needs only the
// model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/graph.h"

namespace hp::model {

/// Parses "NAME=VALUE" arguments (VALUE a non-negative integer). Malformed text is Errc::usage.
Expected<DimBindings> parse_dim_bindings(const std::vector<std::string>& args);

}  // namespace hp::model
