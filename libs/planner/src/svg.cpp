// `hp plan --schedule-svg FILE`: the best plan's pipeline schedule, simulated from the cost model.
//
// Each pipeline rank runs its micro-batch operations in schedule order (GPipe: every forward, then
// every backward; 1F1B: p-k-1 warm-up forwards, then one forward one backward, then the cool-down
// backwards). An operation starts when its rank is free and its input has arrived: forward k after
// forward k-1 of the same micro-batch plus one send/recv, backward k after backward k+1. Durations
// come from the rank's StagePlan: forward = compute/3 (training) plus half the TP time, backward =
// the rest, recomputation just before the backward it serves. Interleaved plans are drawn as 1F1B
// over m * v chunks of 1/v the work, which has the same (p-1)/v bubble. ZB-H1 plans split each
// backward into its input-gradient half (B, which the rank upstream waits for) and its
// weight-gradient half (W, drawn in a third colour), half the backward time each, in hp::job's
// ZB-H1 order: rank k runs the W of micro-batch j after the B of j + k, the rest after its last B
// (docs/schedules.md, "Split backward"). Gaps are bubbles.
#include <algorithm>

#include <fmt/core.h>

#include "hp/core/units.h"
#include "hp/planner/planner.h"

namespace hp::planner {
namespace {

struct Op {
  bool backward = false;
  std::int64_t micro = 0;
  bool weight = false;  ///< the weight-gradient half of a split backward (ZB-H1)
};

std::vector<Op> order(const Config& c, std::int64_t k, std::int64_t m, bool train) {
  std::vector<Op> ops;
  if (!train) {
    for (std::int64_t i = 0; i < m; ++i) ops.push_back({false, i});
    return ops;
  }
  if (c.schedule == recipe::Schedule::gpipe) {
    for (std::int64_t i = 0; i < m; ++i) ops.push_back({false, i});
    for (std::int64_t i = 0; i < m; ++i) ops.push_back({true, i});
    return ops;
  }
  const bool split = c.schedule == recipe::Schedule::zb_h1;
  const std::int64_t warm = std::min(c.pp - k - 1, m);
  std::int64_t f = 0, b = 0, w = 0;
  auto backward = [&] {
    ops.push_back({true, b++});
    if (split && b - w > k) ops.push_back({true, w++, true});
  };
  for (; f < warm; ++f) ops.push_back({false, f});
  while (f < m) {
    ops.push_back({false, f++});
    backward();
  }
  while (b < m) backward();
  while (split && w < m) ops.push_back({true, w++, true});
  return ops;
}

struct Box {
  double start = 0, end = 0;
  const char* kind = "";
  std::int64_t micro = 0;
};

}  // namespace

std::string schedule_svg(const PlanReport& r) {
  const Plan& plan = r.plans.front();
  const Config& c = plan.config;
  const bool train = r.mode != "infer";
  const std::int64_t p = c.pp, v = c.virtual_stages, m = c.micro_batches * v;
  const double vd = static_cast<double>(v);
  std::vector<double> fwd(static_cast<std::size_t>(p)), bwd(fwd), wgt(fwd), rc(fwd), hop(fwd);
  auto row_weight = [](std::vector<Box>& row, double t, double d, std::int64_t micro) {
    row.push_back({t, t + d, "weight", micro});
  };
  for (std::int64_t k = 0; k < p; ++k) {
    const StagePlan& s = plan.stages[static_cast<std::size_t>(k)];
    const double f = (train ? s.compute / 3 : s.compute) + (train ? s.tp_comm / 2 : s.tp_comm) +
                     (train ? s.ep_comm / 2 : s.ep_comm);
    fwd[k] = f / vd;
    bwd[k] = train ? (s.compute + s.tp_comm + s.ep_comm - f) / vd : 0;
    if (c.schedule == recipe::Schedule::zb_h1 && train) wgt[k] = bwd[k] /= 2;
    rc[k] = s.recompute_time / vd;
    const double sends = (k == 0 || k == p - 1 ? 1.0 : 2.0) * (train ? 2.0 : 1.0) * vd;
    hop[k] = p > 1 ? s.pp_comm / sends : 0;
  }
  // List scheduling: keep sweeping the ranks, running each one's next op once its input is ready.
  std::vector<std::vector<Op>> ops;
  for (std::int64_t k = 0; k < p; ++k) ops.push_back(order(c, k, m, train));
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::vector<double> free(static_cast<std::size_t>(p), 0);
  std::vector<std::vector<double>> fdone(static_cast<std::size_t>(p),
                                         std::vector<double>(static_cast<std::size_t>(m), -1));
  auto bdone = fdone;
  std::vector<std::vector<Box>> boxes(static_cast<std::size_t>(p));
  for (bool progress = true; progress;) {
    progress = false;
    for (std::int64_t k = 0; k < p; ++k) {
      auto& i = next[static_cast<std::size_t>(k)];
      while (i < ops[static_cast<std::size_t>(k)].size()) {
        const Op op = ops[static_cast<std::size_t>(k)][i];
        const auto mi = static_cast<std::size_t>(op.micro);
        double ready = 0;
        if (op.weight) {  // needs only its own B, which ran earlier on this rank
          row_weight(boxes[static_cast<std::size_t>(k)], free[k], wgt[k], op.micro);
          free[k] += wgt[k];
          ++i;
          progress = true;
          continue;
        }
        if (!op.backward && k > 0) {
          if (fdone[k - 1][mi] < 0) break;
          ready = fdone[k - 1][mi] + hop[k];
        } else if (op.backward && k + 1 < p) {
          if (bdone[k + 1][mi] < 0) break;
          ready = bdone[k + 1][mi] + hop[k];
        } else if (op.backward) {
          ready = fdone[k][mi];
        }
        double t = std::max(free[k], ready);
        auto& row = boxes[static_cast<std::size_t>(k)];
        if (ready > free[k] && hop[k] > 0 && (k > 0 || op.backward))
          row.push_back({ready - hop[k], ready, "comm", op.micro});
        if (!op.backward) {
          row.push_back({t, t + fwd[k], "forward", op.micro});
          fdone[k][mi] = t += fwd[k];
        } else {
          if (rc[k] > 0) row.push_back({t, t + rc[k], "recompute", op.micro}), t += rc[k];
          row.push_back({t, t + bwd[k], "backward", op.micro});
          bdone[k][mi] = t += bwd[k];
        }
        free[k] = t;
        ++i;
        progress = true;
      }
    }
  }
  const double span = std::max(1e-12, *std::max_element(free.begin(), free.end()));
  const double left = 90, width = 1000, row_h = 28, top = 50;
  const double height = top + static_cast<double>(p) * row_h + 60;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"sans-serif\" "
      "font-size=\"11\">\n",
      left + width + 20, height);
  out += fmt::format("<title>pipeline schedule of {}</title>\n", r.model);
  out += fmt::format(
      "<text x=\"{}\" y=\"20\" font-size=\"13\">dp{} tp{} pp{} {} v{}, {} micro-batches of {}: one "
      "iteration's pipeline, "
      "{} (bubbles are the gaps)</text>\n",
      left, c.dp, c.tp, c.pp, recipe::schedule_name(c.schedule), c.virtual_stages, c.micro_batches,
      c.micro_batch_size, format_seconds(span));
  const auto colour = [](const std::string& kind) {
    return kind == "forward"     ? "#4c78a8"
           : kind == "backward"  ? "#59a14f"
           : kind == "recompute" ? "#f28e2b"
           : kind == "weight"    ? "#b07aa1"
                                 : "#9d9d9d";
  };
  for (std::int64_t k = 0; k < p; ++k) {
    const double y = top + static_cast<double>(k) * row_h;
    out += fmt::format("<text x=\"5\" y=\"{:.1f}\">stage {}</text>\n", y + row_h * 0.6, k);
    out += fmt::format(
        "<rect x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" fill=\"#fbe3e3\"/>\n", left,
        y + 2, width, row_h - 4);
    for (const Box& b : boxes[static_cast<std::size_t>(k)]) {
      const bool comm = std::string(b.kind) == "comm";
      out += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" "
          "stroke=\"white\" "
          "stroke-width=\"0.3\"><title>{} {} ({})</title></rect>\n",
          left + b.start / span * width, y + (comm ? row_h * 0.4 : 2),
          std::max(0.3, (b.end - b.start) / span * width), comm ? row_h * 0.2 : row_h - 4,
          colour(b.kind), b.kind, b.micro, format_seconds(b.end - b.start));
    }
  }
  double x = left;
  const double ly = top + static_cast<double>(p) * row_h + 25;
  const bool split = c.schedule == recipe::Schedule::zb_h1 && train;
  for (const char* kind : {"forward", "backward", "weight", "recompute", "comm"}) {
    if (std::string(kind) == "weight" && !split) continue;
    out += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"12\" height=\"12\" fill=\"{}\"/>\n",
                       x, ly, colour(kind));
    out += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">{}</text>\n", x + 16, ly + 10,
                       std::string(kind) == "comm"     ? "send/recv"
                       : std::string(kind) == "weight" ? "weight grad"
                                                       : kind);
    x += 110;
  }
  out += fmt::format(
      "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"12\" height=\"12\" fill=\"#fbe3e3\"/>\n", x, ly);
  out += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">bubble</text>\n", x + 16, ly + 10);
  out += "</svg>\n";
  return out;
}

}  // namespace hp::planner
