// Closed-form memory figures the timeline is built from and checked against (docs/offload.md,
// "Memory formulas"): ZeRO model states, Korthikanti activations per transformer layer, and the KV
// cache of dense / grouped-query attention. All results are bytes.
#pragma once

#include <cstdint>

#include "hp/recipe/recipe.h"

namespace hp::offload {

/// Model states on one device (ZeRO paper, Rajbhandari et al. SC'20): level 0 replicates
/// everything, 1 shards the optimizer states, 2 also the gradients, 3 also the parameters over
/// `shard` ranks.
struct ModelStates {
  double parameters = 0, gradients = 0, optimizer = 0;
  double total() const { return parameters + gradients + optimizer; }
};
/// `params` parameters on this device before optimizer sharding; weight/grad bytes per parameter
/// and K = optimizer bytes per parameter (12 for mixed-precision Adam: fp32 master, momentum,
/// variance).
ModelStates zero_states(double params, int zero_level, std::int64_t shard, double weight_bytes = 2,
                        double grad_bytes = 2, double k = 12);

/// One transformer layer's activations kept for backward, 16-bit (Korthikanti et al. 2022, Table
/// 2): s sequence, b micro-batch, h hidden, a heads, t TP degree.
struct LayerShape {
  double s = 0, b = 1, h = 0, a = 1, t = 1;
  bool sequence_parallel = false;
};
double korthikanti_layer_bytes(const LayerShape& l, recipe::Recompute rc);

/// KV cache bytes: 2 (K and V) x layers x kv_heads x head_dim x tokens x dtype bytes (vLLM's
/// FullAttentionSpec); grouped-query attention is kv_heads < heads, multi-head kv_heads == heads.
double kv_cache_bytes(double layers, double kv_heads, double head_dim, double tokens,
                      double dtype_bytes);

}  // namespace hp::offload
