// The order a pipeline rank runs its forwards and backwards, and what that order means for memory.
//
// Both `hp plan` (the stage memory every candidate is priced and checked with) and `hp
// offload-profile` (the memory timeline it simulates slot by slot) take the schedule from here, so
// the two cannot disagree about how many micro-batches a stage keeps alive. The planner does not
// walk the op list for every candidate: live_counts() reduces it, once per (schedule, pp, stage,
// micro-batches, virtual stages), to the few per-chunk live-count vectors at which the activation
// peak can occur, and activation_peak() prices a rank's per-chunk activations against them
// (docs/planner.md, "Memory").
#pragma once

#include <cstdint>
#include <vector>

#include "hp/recipe/recipe.h"

namespace hp::planner {

/// One forward or backward of a model chunk (virtual stage) for one micro-batch.
struct Op {
  bool forward = true;
  std::int64_t micro = 0, chunk = 0;
};

/// The order pipeline rank k of p runs its chunks over one step of m micro-batches: GPipe (all
/// forwards, then all backwards), 1F1B (p-k-1 warm-up forwards, then one forward / one backward),
/// interleaved 1F1B (Megatron-LM's order: 2(p-k-1) + (v-1)p warm-up chunk forwards, groups of p
/// micro-batches per chunk). Inference (train false) is forwards only. ZB-H1 splits the backward
/// (docs/schedules.md, "Split backward"); a micro-batch's activations stay until its
/// weight-gradient half W, so its backward op here stands where the W runs (rank k defers W by k
/// backwards): p micro-batches alive on every rank, 1F1B's rank-0 peak. ZB-V is not listed (the
/// planner does not model its V-shaped chunk placement); it is given 1F1B's order.
std::vector<Op> schedule_ops(recipe::Schedule s, std::int64_t p, std::int64_t k, std::int64_t m,
                             std::int64_t v, bool train);

/// The pipeline bubble in seconds of one step: the idle time of the busiest rank for a schedule of
/// p equal stages, m micro-batches, v chunks per rank, whose stage takes `f` seconds forward, `b`
/// for the input-gradient half of the backward and `w` for the weight-gradient half (an unsplit
/// backward is b + w). GPipe and 1F1B (p-1)(f+b+w); interleaved (p-1)(f+b+w)/v; ZB-H1 (p-1)(f +
/// max(b-w, 0)) + max(p-m, 0) min(b, w) (Qi et al.'s (p-1)(f+b-w) while w <= b and m >= p; a larger
/// w cannot hide the last rank's wait for its first input, (p-1)f, and with m < p the later ranks
/// defer more Ws than there are gaps); ZB-V (p-1)f/2, that same wait with chunks of half a stage,
/// which its lists reach when f = b = w and m >= 2p (docs/schedules.md, "Split backward"). Zero for
/// p
/// <= 1.
double bubble_seconds(recipe::Schedule s, std::int64_t p, std::int64_t m, std::int64_t v, double f,
                      double b, double w);

/// The moments at which a rank's activation and gradient memory can peak, as micro-batches alive
/// per chunk: after each forward (`after_forward`), and at the start of each backward together
/// with the chunk it runs (`before_backward`: a backward may rebuild recomputed activations on top
/// of what is alive, and a chunk's first backward of the step allocates its gradients, which then
/// stay to the optimizer step). Vectors dominated by another of the same kind (every count and
/// every gradient flag <=) are dropped: with non-negative bytes per chunk they never hold the
/// maximum.
struct LiveCounts {
  std::int64_t chunks = 1;
  std::vector<std::vector<std::int64_t>> after_forward;
  struct Backward {
    std::vector<std::int64_t> live;
    std::int64_t chunk = 0;
    bool first = false;  ///< the chunk's first backward of the step: its gradients are born in it
  };
  std::vector<Backward> before_backward;
  /// The same moments as doubles, one row of 2 x `chunks` per vector (after_forward, then
  /// before_backward): the live counts, then per chunk 1 where its gradients exist (its first
  /// backward has run before that moment), for activation_peak's inner loop.
  std::vector<double> forward_rows, backward_rows;
};

/// live_counts of rank k's training schedule, computed from schedule_ops once per argument tuple
/// and cached (per thread). The reference stays valid for the thread's lifetime.
const LiveCounts& live_counts(recipe::Schedule s, std::int64_t p, std::int64_t k, std::int64_t m,
                              std::int64_t v);

/// One unit (block, prologue or epilogue) of a rank as the activation peak sees it, in model
/// order (chunk ascending).
struct UnitActivations {
  std::int64_t chunk = 0;
  double kept = 0;       ///< bytes kept per micro-batch from its forward to its backward
  double transient = 0;  ///< extra bytes while its backward runs (recompute rebuilds)
  double grads = 0;      ///< gradient bytes, allocated at its first backward, kept to the step end
};

/// The peak bytes of a training rank's activations and gradients together: max over the
/// live-count vectors of sum_c count_c x kept_c plus the gradients of the chunks whose backward has
/// begun, and over backward starts of the same plus the worst moment of that chunk's backward (a
/// unit's transient and, in the chunk's first backward, the gradients born so far, on top of what
/// the units after it in the chunk, already run backward and freed, no longer hold). Equals the
/// maximum over every slot of the timeline libs/offload simulates from schedule_ops. Gradients are
/// not held through the forward: the executor allocates them in the backward and the optimizer
/// step consumes them (docs/planner.md, "Memory"). `alone`, when given, receives the peak of the
/// activations by themselves (what `hp plan` reports as activation bytes), from the same pass.
double activation_peak(const LiveCounts& live, const std::vector<UnitActivations>& units,
                       double* alone = nullptr);

/// activation_peak of a rank whose units change one at a time (the recompute search tries many
/// choices of the same blocks): a change updates each live-count vector's sum for the changed
/// chunk only, instead of recomputing every sum over every chunk.
class PeakTracker {
 public:
  PeakTracker(const LiveCounts& live, std::vector<UnitActivations> units);
  /// Unit `u` (an index into the units given) now keeps `kept` and rebuilds `transient`.
  void set(std::size_t u, double kept, double transient);
  double peak() const;

 private:
  void rescan(std::size_t chunk);  // the chunk's worst backward moments
  const LiveCounts& live_;
  std::vector<UnitActivations> units_;
  std::vector<std::vector<std::size_t>> members_;  ///< unit indices per chunk, in model order
  std::vector<double> forward_sums_, backward_sums_, worst_, worst_first_;
};

}  // namespace hp::planner
