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
//
// The picture is read against `hp plan`'s numbers, so its time axis ends at the predicted step:
// after the simulated flush come the difference to the closed-form pipeline term, the gradient
// sync, the ZeRO gathers and the optimizer step, each its own labelled segment. Long pipelines
// (hundreds of micro-batches) draw one period of the steady state and a break with its count.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

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

const char* colour(const std::string& kind) {
  return kind == "forward"     ? "#4c78a8"
         : kind == "backward"  ? "#59a14f"
         : kind == "recompute" ? "#f28e2b"
         : kind == "weight"    ? "#b07aa1"
                               : "#9d9d9d";
}

// One labelled stretch after the pipeline's last backward, on every rank at once.
struct Segment {
  std::string label;
  double start = 0, seconds = 0;
  const char* colour = "";
};

// Where the time axis goes: its end (the predicted step), the steady-state stretch left out of a
// long pipeline, and what follows the flush.
struct TimeLayout {
  double total = 0;
  double skip_start = 0, skip_end = 0;  ///< not drawn; equal when nothing is left out
  double period = 0;                    ///< one steady-state period (per micro-batch chunk)
  std::int64_t repeats = 0;             ///< steady-state periods in all
  std::vector<Segment> after;
};

// The prediction is pipeline + gradient sync + ZeRO gathers + optimizer step (predict() in
// stage.cpp), and its pipeline term is the closed form, which charges each micro-batch its full
// send/recv where this simulation overlaps what it can: the difference is drawn as its own
// segment (when positive) so the picture's end is the step `hp plan` prints. A row of more than
// kMaxBoxes boxes (1,280 micro-batches make a barcode) draws warm-up, one period of the steady
// state and cool-down, with the repeat count in the break.
constexpr std::size_t kMaxBoxes = 200;

TimeLayout layout_time(const Plan& plan, bool train, double span, double period,
                       const std::vector<std::vector<Box>>& boxes) {
  TimeLayout tl;
  const Prediction& pr = plan.predicted;
  const double post = train ? pr.dp_exposed + pr.opt_exposed + pr.optimizer_step : 0.0;
  const double margin = pr.iteration - post - span;
  double t = span;
  auto add = [&](const char* label, double seconds, const char* fill) {
    if (seconds <= 0) return;
    tl.after.push_back({label, t, seconds, fill});
    t += seconds;
  };
  if (margin > 1e-9 * pr.iteration) add("pipeline: closed form over simulation", margin, "#c9c9c9");
  if (train) {
    add("gradient sync (dp)", pr.dp_exposed, "#e15759");
    add("ZeRO gathers", pr.opt_exposed, "#edc948");
    add("optimizer step", pr.optimizer_step, "#76b7b2");
  }
  tl.total = t;
  std::size_t longest = 0;
  for (const auto& row : boxes) longest = std::max(longest, row.size());
  if (longest <= kMaxBoxes || period <= 0) return tl;
  // The steady state: from every row's first backward (its warm-up of forwards is over) to every
  // row's last forward (its cool-down of backwards begins). GPipe has none: all forwards come
  // first.
  double a = 0, b = span;
  for (const auto& row : boxes) {
    auto first_b = std::find_if(row.begin(), row.end(),
                                [](const Box& x) { return std::string(x.kind) == "backward"; });
    auto last_f = std::find_if(row.rbegin(), row.rend(),
                               [](const Box& x) { return std::string(x.kind) == "forward"; });
    if (first_b == row.end() || last_f == row.rend()) return tl;
    a = std::max(a, first_b->start);
    b = std::min(b, last_f->end);
  }
  if (b - a < 4 * period) return tl;
  tl.period = period;
  tl.repeats = std::llround((b - a) / period);
  tl.skip_start = a + period;
  tl.skip_end = b;
  return tl;
}

// Seconds to x, with the left-out stretch replaced by a kGap-pixel break.
struct XMap {
  static constexpr double kGap = 34;
  double left, width;
  TimeLayout tl;
  bool skips() const { return tl.skip_end > tl.skip_start; }
  double scale() const {
    const double shown = tl.total - (tl.skip_end - tl.skip_start);
    return (width - (skips() ? kGap : 0)) / std::max(1e-12, shown);
  }
  double operator()(double t) const {
    if (!skips() || t <= tl.skip_start) return left + t * scale();
    if (t < tl.skip_end) return left + tl.skip_start * scale();
    return left + (t - (tl.skip_end - tl.skip_start)) * scale() + kGap;
  }
  /// The drawn parts of [a, b].
  std::vector<std::pair<double, double>> visible(double a, double b) const {
    if (!skips()) return {{a, b}};
    std::vector<std::pair<double, double>> v;
    if (a < tl.skip_start) v.emplace_back(a, std::min(b, tl.skip_start));
    if (b > tl.skip_end) v.emplace_back(std::max(a, tl.skip_end), b);
    return v;
  }
};

// Ticks at 1, 2 or 5 x 10^k seconds, labels at least kLabelGap pixels apart; the last tick is the
// step's end, labelled with its time (data-seconds carries it unrounded for scripts).
std::string time_axis(const XMap& X, double y, const TimeLayout& tl) {
  constexpr double kLabelGap = 60;
  const double shown = tl.total - (tl.skip_end - tl.skip_start);
  const double step = nice_step(std::max(1e-12, shown / 8));
  std::string out = "<g class=\"time-axis\">\n";
  out += fmt::format(
      "<line x1=\"{:.2f}\" x2=\"{:.2f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#333\"/>\n", X.left,
      X(tl.total), y, y);
  const double x_end = X(tl.total);
  double last = -1e9;
  auto tick = [&](double t, bool label) {
    const double x = X(t);
    out += fmt::format(
        "<line x1=\"{0:.2f}\" x2=\"{0:.2f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#333\"/>\n", x,
        y, y + 5);
    if (!label || x - last < kLabelGap || x_end - x < 1.6 * kLabelGap) return;
    out += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x,
                       y + 17, format_tick_seconds(t, step));
    last = x;
  };
  for (double t = 0; t < tl.total; t += step) {
    if (X.skips() && t > tl.skip_start && t < tl.skip_end) continue;
    tick(t, true);
  }
  if (X.skips()) tick(tl.skip_end, true);
  out += fmt::format(
      "<line x1=\"{0:.2f}\" x2=\"{0:.2f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#333\"/>\n",
      x_end, y, y + 8);
  out += fmt::format(
      "<text id=\"time-axis-end\" data-seconds=\"{:.9g}\" x=\"{:.2f}\" y=\"{:.1f}\" "
      "text-anchor=\"end\" font-weight=\"bold\">step {}</text>\n",
      tl.total, x_end, y + 17, format_seconds(tl.total));
  out +=
      fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\">time (seconds from the step's start)</text>\n",
                  X.left, y + 32);
  return out + "</g>\n";
}

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
  double period = 0;
  for (std::int64_t k = 0; k < p; ++k)
    period = std::max(period, fwd[k] + bwd[k] + wgt[k] + rc[k] + 2 * hop[k]);
  const TimeLayout tl = layout_time(plan, train, span, period, boxes);
  const double left = 90, width = 1000, row_h = 28, top = 70;
  const double rows_h = static_cast<double>(p) * row_h;
  const double height = top + rows_h + 110;
  const XMap X{left, width, tl};
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      left + width + 30, height);
  out += fmt::format("<title>pipeline schedule of {}</title>\n", r.model);
  out += fmt::format("<rect x=\"0\" y=\"0\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"white\"/>\n",
                     left + width + 30, height);
  out += fmt::format(
      "<text x=\"{}\" y=\"20\" font-size=\"13\">dp{} tp{} pp{} {} v{}, {} micro-batches of {}: one "
      "step, {} predicted (pipeline {} simulated; bubbles are the gaps)</text>\n",
      left, c.dp, c.tp, c.pp, recipe::schedule_name(c.schedule), c.virtual_stages, c.micro_batches,
      c.micro_batch_size, format_seconds(plan.predicted.iteration), format_seconds(span));
  // The simulation can only outrun the closed form when a stage waits longer than the closed
  // form's bubble term allows; then the drawing ends after the prediction, and says by how much.
  if (tl.total > plan.predicted.iteration * (1 + 1e-9))
    out += fmt::format(
        "<text x=\"{}\" y=\"54\">the simulated pipeline runs {} past the closed form's, so the "
        "drawing ends after the predicted step</text>\n",
        left, format_seconds(tl.total - plan.predicted.iteration));
  if (tl.skip_end > tl.skip_start)
    out += fmt::format(
        "<text x=\"{}\" y=\"38\">the steady state is {} periods of {}: one is drawn, the break "
        "leaves out the other {} ({})</text>\n",
        left, tl.repeats, format_seconds(tl.period), tl.repeats - 1,
        format_seconds(tl.skip_end - tl.skip_start));
  for (std::int64_t k = 0; k < p; ++k) {
    const double y = top + static_cast<double>(k) * row_h;
    out += fmt::format("<text x=\"5\" y=\"{:.1f}\">stage {}</text>\n", y + row_h * 0.6, k);
    for (const auto& [a, b] : X.visible(0, span))
      out += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"#fbe3e3\"/>\n",
          X(a), y + 2, X(b) - X(a), row_h - 4);
    for (const Box& b : boxes[static_cast<std::size_t>(k)]) {
      const bool comm = std::string(b.kind) == "comm";
      for (const auto& [s0, s1] : X.visible(b.start, b.end))
        out += fmt::format(
            "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" "
            "stroke=\"white\" stroke-width=\"0.3\"><title>{} {} ({})</title></rect>\n",
            X(s0), y + (comm ? row_h * 0.4 : 2), std::max(0.3, X(s1) - X(s0)),
            comm ? row_h * 0.2 : row_h - 4, colour(b.kind), b.kind, b.micro,
            format_seconds(b.end - b.start));
    }
  }
  // What follows the pipeline's flush on every rank, one labelled segment each, so the drawing
  // ends at the predicted step.
  for (const Segment& sg : tl.after) {
    const double x0 = X(sg.start), x1 = X(sg.start + sg.seconds);
    out += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" "
        "fill-opacity=\"0.85\"><title>{} ({})</title></rect>\n",
        x0, top + 2, std::max(0.3, x1 - x0), rows_h - 4, sg.colour, sg.label,
        format_seconds(sg.seconds));
  }
  if (tl.skip_end > tl.skip_start) {  // the break: a white band with the repeat count
    const double xb = X(tl.skip_start);
    out += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"white\"/>\n", xb,
        top - 4, XMap::kGap, rows_h + 8);
    out += fmt::format(
        "<text x=\"{:.2f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"13\">x{}</text>\n",
        xb + XMap::kGap / 2, top + rows_h / 2 + 4, tl.repeats);
  }
  out += time_axis(X, top + rows_h + 4, tl);
  // The legend: a visible key of every colour drawn.
  double x = left;
  int legend_row = 0;
  const double ly = top + rows_h + 50;
  const bool split = c.schedule == recipe::Schedule::zb_h1 && train;
  std::vector<std::pair<std::string, std::string>> keys;
  for (const char* kind : {"forward", "backward", "weight", "recompute", "comm"}) {
    if (std::string(kind) == "weight" && !split) continue;
    keys.emplace_back(colour(kind), std::string(kind) == "comm"     ? "send/recv"
                                    : std::string(kind) == "weight" ? "weight grad"
                                                                    : kind);
  }
  keys.emplace_back("#fbe3e3", "bubble");
  for (const Segment& sg : tl.after) keys.emplace_back(sg.colour, sg.label);
  out += "<g class=\"legend\">\n";
  for (const auto& [fill, label] : keys) {
    if (x + 16 + 7.0 * static_cast<double>(label.size()) > left + width) x = left, ++legend_row;
    const double yy = ly + 18 * legend_row;
    out += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"12\" height=\"12\" fill=\"{}\"/>\n",
                       x, yy, fill);
    out += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">{}</text>\n", x + 16, yy + 10, label);
    x += 24 + 6.5 * static_cast<double>(label.size());
  }
  out += "</g>\n";
  out += "</svg>\n";
  return out;
}

}  // namespace hp::planner
