// Inference capacity (--mode infer): the longest context and the largest batch one device of every
// stage can hold, with the KV cache on the device and with it offloaded to the host pool, and the
// decode latency per token. Decoding one token reads every weight and the whole KV cache once, so
// it is memory-bandwidth bound: per layer max(bytes read from device memory / memory bandwidth,
// bytes streamed in / host-link bandwidth); a token crosses every stage in turn.
#pragma once

#include <cstdint>
#include <vector>

namespace hp::offload {

/// One stage's per-device figures for the capacity model.
struct CapacityStage {
  std::vector<double> weights;       ///< bytes per unit (after TP)
  std::vector<double> kv_per_token;  ///< KV bytes per unit per token of one sequence (after TP)
  double act_per_token = 0;          ///< largest unit's prefill activations per token (linear part)
  double fixed = 0;                  ///< buffers + workspace
};

struct CapacityInput {
  std::vector<CapacityStage> stages;
  double budget = 0;                     ///< device bytes
  double host_memory = 0;                ///< host-pool bytes per device
  double memory_bandwidth = 0, h2d = 0;  ///< bytes/s
  std::int64_t context = 0, batch = 1;   ///< the recipe's sequence length and sequences in flight
  double latency_budget = 0;             ///< seconds per token; 0 = none
};

struct CapacityFigure {
  std::int64_t max_context = 0;             ///< at `batch` sequences
  std::int64_t max_batch = 0;               ///< at `context` tokens
  double latency = 0;                       ///< per token at max_context (0 when nothing fits)
  std::int64_t max_context_in_latency = 0;  ///< longest context meeting the latency budget too
};

struct CapacityReport {
  std::int64_t context = 0, batch = 1;
  double latency_budget = 0;
  double kv_per_token = 0;  ///< one sequence, whole model, one device's share summed over stages
  double latency_at_recipe = 0;  ///< decode latency at the recipe's context and batch, KV on device
  CapacityFigure device, offloaded;  ///< KV on the device / KV in the host pool
};

/// Device bytes at (context, batch); `kv_offloaded` keeps two units' KV on the device (the one in
/// use and the one arriving).
double device_bytes(const CapacityStage& s, std::int64_t context, std::int64_t batch,
                    bool kv_offloaded);
/// Decode seconds per token over all stages.
double decode_latency(const CapacityInput& in, std::int64_t context, std::int64_t batch,
                      bool kv_offloaded);
CapacityReport capacity(const CapacityInput& in);

}  // namespace hp::offload
