// One pipeline rank's device memory over one step of its schedule. Ranks of a stage are alike under
// dp/tp, so a stage is simulated once. The step is a sequence of slots, each one unit (a block, or
// the prologue/epilogue) running forward or backward for one micro-batch, or the optimizer step of
// one unit, in the order the schedule runs them (schedule_ops). Memory at a slot is what is
// allocated while it runs: weights and optimizer states, the gradients of every unit whose
// backward has begun, the activations of every micro-batch in flight, the KV cache, the transient
// of that slot (a recompute rebuild), buffers and workspace. Its peak without offload is, by
// construction, the stage memory `hp plan` reports (planner::activation_peak over the same op
// order, the same buffers and workspace; docs/planner.md, "Memory").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "hp/planner/schedule.h"
#include "hp/recipe/recipe.h"

namespace hp::offload {

/// What a byte of device memory holds. The order is the report's.
enum class Kind { parameters, gradients, optimizer, activations, kv_cache, buffers, workspace };
inline constexpr int kKinds = 7;
const char* kind_name(Kind k);
using Breakdown = std::array<double, kKinds>;
double sum(const Breakdown& b);

/// One block (or prologue/epilogue) as one device of the stage holds and runs it.
struct Unit {
  std::string name;
  std::int64_t chunk = 0;  ///< model chunk (virtual stage) on this rank, 0..v-1
  double param_count = 0;  ///< parameters held (after TP; before ZeRO sharding)
  double parameters = 0, gradients = 0, optimizer = 0;  ///< bytes on this device (ZeRO applied)
  double act = 0;            ///< bytes kept per micro-batch for backward, after recompute
  double act_transient = 0;  ///< extra bytes live during its backward (recompute rebuilds)
  double kv = 0;             ///< KV-cache bytes per micro-batch (inference)
  double fwd = 0, bwd = 0;   ///< seconds per micro-batch; bwd includes recomputation
  double opt = 0;            ///< seconds of its optimizer step on the device
  double opt_bytes = 0;      ///< bytes its optimizer step reads and writes (memory-bound)
  double update_bytes = 0;   ///< bytes of the parameters its optimizer step updates
};

/// A stage's whole input to the simulation.
struct StageInput {
  std::int64_t stage = 0, stages = 1;  ///< pipeline rank k and pp
  std::int64_t micro_batches = 1, virtual_stages = 1;
  recipe::Schedule schedule = recipe::Schedule::one_f_one_b;
  bool train = true;
  std::vector<Unit> units;  ///< in model order; chunk ascending
  double buffers = 0;    ///< communication buffers (p2p, TP, gradient bucket, all-to-all, ZeRO-3)
  double workspace = 0;  ///< kernel workspace (largest transient of one op)
};

/// The schedule's op order is the planner's (hp/planner/schedule.h), so the timeline and `hp plan`
/// count the same micro-batches alive.
using planner::Op;
using planner::schedule_ops;

struct Slot {
  enum Type { forward, backward, optimizer } type = forward;
  std::int64_t unit = 0, micro = 0;
  double start = 0, duration = 0;
  Breakdown memory{};  ///< bytes live while the slot runs
};

struct Timeline {
  std::vector<Slot> slots;
  std::size_t peak = 0;  ///< index of the slot with the most memory
  double step = 0;       ///< seconds of this stage's own work (no pipeline waits)
  double peak_bytes() const { return slots.empty() ? 0 : sum(slots[peak].memory); }
};

/// Simulates the stage without offload.
Timeline simulate(const StageInput& in);

/// "backward of h.11, micro-batch 7" for messages.
std::string describe_slot(const StageInput& in, const Slot& s);

}  // namespace hp::offload
