// Optimizers as the cost models see them: the names --optimizer accepts and the bytes of optimizer
// state each keeps per parameter. The planner (hp plan) and offload-profile size model states with
// the same numbers from here.
#pragma once

#include <string_view>

#include "hp/core/dtype.h"
#include "hp/core/expected.h"

namespace hp {

enum class Optimizer { none, sgd, adam, adamw };

/// "none", "sgd", "adam", "adamw".
const char* optimizer_name(Optimizer o);

/// One of the names above (exact match); Errc::usage listing them otherwise.
Expected<Optimizer> parse_optimizer(std::string_view name);

/// Optimizer-state bytes per parameter beyond the weights and gradients (K of the ZeRO paper) when
/// training in `compute`: Adam/AdamW keep two fp32 moments (8), SGD with momentum one (4), none 0;
/// training in a type narrower than 4 bytes (bf16, fp16, fp8, ...) adds an fp32 master copy (4), so
/// mixed-precision Adam is 12.
double optimizer_state_bytes(Optimizer o, DType compute);

}  // namespace hp
