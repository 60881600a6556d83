#include "hp/offload/formulas.h"

#include <algorithm>

namespace hp::offload {

ModelStates zero_states(double params, int zero_level, std::int64_t shard, double weight_bytes,
                        double grad_bytes, double k) {
  const double n = static_cast<double>(std::max<std::int64_t>(1, shard));
  ModelStates m;
  m.parameters = params * weight_bytes / (zero_level >= 3 ? n : 1.0);
  m.gradients = params * grad_bytes / (zero_level >= 2 ? n : 1.0);
  m.optimizer = params * k / (zero_level >= 1 ? n : 1.0);
  return m;
}

double korthikanti_layer_bytes(const LayerShape& l, recipe::Recompute rc) {
  const double sbh = l.s * l.b * l.h;
  const double quad = 5.0 * l.a * l.s / (l.h * l.t);  // attention scores, softmax, dropout mask
  switch (rc) {
    case recipe::Recompute::full: return 2.0 * sbh;  // the layer input alone
    case recipe::Recompute::selective:
      return l.sequence_parallel ? 34.0 * sbh / l.t : sbh * (10.0 + 24.0 / l.t);
    case recipe::Recompute::none: break;
  }
  if (l.sequence_parallel) return sbh * (34.0 / l.t + quad);
  // With t = 1 this is s b h (34 + 5 a s / h): the "no parallelism" row.
  return sbh * (10.0 + 24.0 / l.t + quad);
}

double kv_cache_bytes(double layers, double kv_heads, double head_dim, double tokens,
                      double dtype_bytes) {
  return 2.0 * layers * kv_heads * head_dim * tokens * dtype_bytes;
}

}  // namespace hp::offload
