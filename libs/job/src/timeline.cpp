// `hp launch RECIPE --timeline FILE.svg` (train_run.h): a pipeline-training job's last step as
// measured, drawn above the same step as its schedule predicts it.
//
// Measured: every rank's F, B and W actions of the last step, read from the job's merged Chrome
// trace (hp/train/trace.h: category "compute", name "F <step>.<micro-batch>", args.stage the
// virtual stage), on pipeline 0's ranks, from the step's first action. Predicted: the same ranks'
// action lists (make_schedule, as the ranks ran them) simulated with each action lasting the mean
// measured time of its kind and virtual stage and messages taking no time: an action starts when
// its rank is free and its input is there (F after F of the previous virtual stage, B after B of
// the next or the own F on the last stage, W after the own B). The difference between the two
// panels is what the schedule's order does not explain: waiting for messages, ranks sharing cores.
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "hp/core/fs.h"
#include "hp/job/schedule.h"
#include "hp/job/train_run.h"

namespace hp::job {
namespace {

struct Box {
  char kind = 'F';  // F, B or W
  int stage = 0, micro = 0;
  double start = 0, end = 0;  // seconds from the step's start
};
using Rows = std::vector<std::vector<Box>>;  // per pipeline position

Expected<Rows> measured(const std::filesystem::path& trace, const train::PipelineRole& pp,
                        std::int64_t& step) {
  std::ifstream in(trace);
  auto doc = nlohmann::json::parse(in, nullptr, false);
  if (doc.is_discarded() || !doc.contains("traceEvents"))
    return Error(Errc::runtime, "the job's trace is not a Chrome trace", trace.string());
  struct Ev {
    int pid;
    char kind;
    std::int64_t step;
    int micro, stage;
    double ts, dur;
  };
  std::vector<Ev> evs;
  step = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X" || e.value("cat", "") != "compute") continue;
    const std::string name = e.value("name", "");
    long long s = 0;
    int k = 0;
    if (name.size() < 3 || std::sscanf(name.c_str() + 2, "%lld.%d", &s, &k) != 2) continue;
    int stage = -1;
    if (e.contains("args") && e["args"].contains("stage")) stage = e["args"]["stage"].get<int>();
    evs.push_back(
        {e.value("pid", -1), name[0], s, k, stage, e.value("ts", 0.0), e.value("dur", 0.0)});
    step = std::max<std::int64_t>(step, s);
  }
  Rows rows(pp.ranks.size());
  double t0 = 1e300;
  for (const auto& e : evs)
    if (e.step == step) t0 = std::min(t0, e.ts);
  for (const auto& e : evs) {
    if (e.step != step) continue;
    auto at = std::find(pp.ranks.begin(), pp.ranks.end(), e.pid);
    if (at == pp.ranks.end()) continue;
    const auto r = static_cast<std::size_t>(at - pp.ranks.begin());
    const int stage = e.stage >= 0 ? e.stage : static_cast<int>(r);
    rows[r].push_back({e.kind, stage, e.micro, (e.ts - t0) / 1e6, (e.ts + e.dur - t0) / 1e6});
  }
  if (step == 0)
    return Error(Errc::runtime, "the job's trace holds no pipeline action", trace.string());
  return rows;
}

// The schedule's lists simulated with the measured mean durations (see the file comment).
Rows predicted(const Rows& got, const std::vector<std::vector<train::PipelineAction>>& lists,
               int stages) {
  std::map<std::pair<char, int>, std::pair<double, int>> sum;  // (kind, stage) -> total, count
  for (const auto& row : got)
    for (const Box& b : row) {
      auto& s = sum[{b.kind, b.stage}];
      s.first += b.end - b.start;
      ++s.second;
    }
  auto length = [&](char kind, int stage) {
    auto it = sum.find({kind, stage});
    return it == sum.end() || it->second.second == 0 ? 0.0 : it->second.first / it->second.second;
  };
  std::map<std::tuple<char, int, int>, double> done;  // (kind, stage, micro) -> end
  Rows out(lists.size());
  std::vector<std::size_t> next(lists.size(), 0);
  std::vector<double> free(lists.size(), 0.0);
  for (bool moved = true; moved;) {
    moved = false;
    for (std::size_t r = 0; r < lists.size(); ++r) {
      while (next[r] < lists[r].size()) {
        const train::PipelineAction& a = lists[r][next[r]];
        const char kind = "FBW"[static_cast<int>(a.kind)];
        const int vs = a.stage >= 0 ? a.stage : static_cast<int>(r);
        std::tuple<char, int, int> dep;
        bool needs = true;
        if (kind == 'F') {
          needs = vs > 0;
          dep = {'F', vs - 1, a.micro_batch};
        } else if (kind == 'B') {
          dep = vs + 1 < stages ? std::tuple{'B', vs + 1, a.micro_batch}
                                : std::tuple{'F', vs, a.micro_batch};
        } else {
          dep = {'B', vs, a.micro_batch};
        }
        double ready = free[r];
        if (needs) {
          auto it = done.find(dep);
          if (it == done.end()) break;  // its input is not computed yet
          ready = std::max(ready, it->second);
        }
        const double end = ready + length(kind, vs);
        out[r].push_back({kind, vs, a.micro_batch, ready, end});
        done[{kind, vs, a.micro_batch}] = end;
        free[r] = end;
        ++next[r];
        moved = true;
      }
    }
  }
  return out;
}

double span(const Rows& rows) {
  double end = 0;
  for (const auto& row : rows)
    for (const Box& b : row) end = std::max(end, b.end);
  return end;
}

// 1 - mean compute / span over the positions.
double bubble(const Rows& rows) {
  const double s = span(rows);
  if (s <= 0 || rows.empty()) return 0;
  double busy = 0;
  for (const auto& row : rows)
    for (const Box& b : row) busy += b.end - b.start;
  return 1 - busy / (s * static_cast<double>(rows.size()));
}

std::string draw(const Rows& got, const Rows& want, std::int64_t step, const std::string& what) {
  constexpr double kLeft = 90, kWidth = 900, kRow = 22, kGap = 4;
  const double scale = kWidth / std::max({span(got), span(want), 1e-9});
  const std::size_t p = got.size();
  const double panel = static_cast<double>(p) * (kRow + kGap) + 40;
  const double height = 70 + 2 * panel + 40;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n<text x=\"10\" y=\"18\" font-size=\"14\">{}: step {}, measured above, "
      "the schedule's prediction from the measured F/B/W times below</text>\n",
      kLeft + kWidth + 30, height, what, step);
  const char* colour[] = {"#4e79a7", "#f28e2b", "#b07aa1"};
  double x = 10;
  for (int k = 0; k < 3; ++k) {  // legend
    s += fmt::format(
        "<rect x=\"{:.0f}\" y=\"28\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.0f}\" "
        "y=\"38\">{}</text>\n",
        x, colour[k], x + 16,
        k == 0   ? "F forward"
        : k == 1 ? "B backward (input gradient)"
                 : "W weight gradient");
    x += k == 1 ? 200 : 110;
  }
  auto panel_at = [&](const Rows& rows, double top, const std::string& title) {
    s += fmt::format("<text x=\"10\" y=\"{:.0f}\" font-weight=\"bold\">{}</text>\n", top + 12,
                     title);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const double y = top + 20 + static_cast<double>(r) * (kRow + kGap);
      s += fmt::format("<text x=\"10\" y=\"{:.0f}\">rank {}</text>\n", y + 15, r);
      for (const Box& b : rows[r]) {
        const int k = b.kind == 'F' ? 0 : b.kind == 'B' ? 1 : 2;
        const double w = std::max(0.5, (b.end - b.start) * scale);
        s += fmt::format(
            "<rect x=\"{:.2f}\" y=\"{:.0f}\" width=\"{:.2f}\" height=\"{:.0f}\" fill=\"{}\" "
            "stroke=\"white\" stroke-width=\"0.5\"><title>{}{} micro-batch {}, stage {}: {:.2f} "
            "ms</title></rect>\n",
            kLeft + b.start * scale, y, w, kRow, colour[k], b.kind, b.micro, b.micro, b.stage,
            (b.end - b.start) * 1e3);
        if (w > 14)
          s += fmt::format(
              "<text x=\"{:.2f}\" y=\"{:.0f}\" fill=\"white\" text-anchor=\"middle\">{}</text>\n",
              kLeft + b.start * scale + w / 2, y + 15, b.micro);
      }
    }
  };
  panel_at(got, 50,
           fmt::format("measured: {:.2f} ms, bubble {:.3f}", span(got) * 1e3, bubble(got)));
  panel_at(want, 50 + panel,
           fmt::format("predicted: {:.2f} ms, bubble {:.3f}", span(want) * 1e3, bubble(want)));
  const double axis = 50 + 2 * panel + 5;
  const double full = std::max(span(got), span(want));
  s += fmt::format(
      "<line x1=\"{:.0f}\" y1=\"{:.0f}\" x2=\"{:.0f}\" y2=\"{:.0f}\" stroke=\"black\"/>\n", kLeft,
      axis, kLeft + kWidth, axis);
  for (int t = 0; t <= 5; ++t) {
    const double at = full * t / 5;
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.0f}\" x2=\"{0:.1f}\" y2=\"{2:.0f}\" stroke=\"black\"/><text "
        "x=\"{0:.1f}\" y=\"{3:.0f}\" text-anchor=\"middle\">{4:.1f} ms</text>\n",
        kLeft + at * scale, axis, axis + 5, axis + 18, at * 1e3);
  }
  return s + "</svg>\n";
}

}  // namespace

Expected<std::string> write_timeline(const Job& job, const train::TrainOptions& to,
                                     const std::filesystem::path& trace,
                                     const std::filesystem::path& svg) {
  // Every position's actions, as pipeline_rank gives them to the ranks of pipeline 0.
  std::vector<std::vector<train::PipelineAction>> lists;
  train::PipelineRole role = to.pp;
  role.ranks.clear();
  for (const auto& stage : to.pp.grid) role.ranks.push_back(stage.at(0));
  for (std::size_t r = 0; r < role.ranks.size(); ++r) {
    HP_ASSIGN_OR_RETURN(lists.emplace_back(),
                        pipeline_actions(job.recipe, role, static_cast<int>(r)));
  }
  std::int64_t step = 0;
  HP_ASSIGN_OR_RETURN(Rows got, measured(trace, role, step));
  const Rows want = predicted(got, lists, role.stages());
  const std::string what = fmt::format("{} schedule, pp = {}, {} micro-batches",
                                       recipe::schedule_name(job.recipe.parallel.schedule),
                                       role.ranks.size(), role.micro_batches);
  HP_TRY(write_file_atomic(svg, draw(got, want, step, what)));
  return fmt::format(
      "timeline of step {} written to {}: measured {:.2f} ms (bubble {:.3f}), the schedule with "
      "the measured F/B/W times {:.2f} ms (bubble {:.3f})\n",
      step, svg.string(), span(got) * 1e3, bubble(got), span(want) * 1e3, bubble(want));
}

}  // namespace hp::job
