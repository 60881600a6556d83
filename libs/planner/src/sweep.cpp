// `hp plan --sweep KEY=V1,V2,... [--sweep KEY=...]`: one planner run per point of the cartesian
// product of the axes, one CSV row (or JSON line) each, so CI scripts can track how the best plan
// and its throughput move with the cluster size, the batch or the sequence length.
//
// CI diffs the output against a committed copy, so it is a function of the inputs alone: rows come
// in a fixed order (the first axis outermost, values as given), the columns are fixed, and the
// search's wall-clock time is left out unless --timing asks for it. An infeasible point is a row
// too, with the planner's reason in its `error` cell; whether it fails the command is
// run_command's decision (PlanOutput::failure).
#include <algorithm>
#include <charconv>
#include <iterator>

#include <fmt/core.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "hp/planner/planner.h"

namespace hp::planner {
namespace {

constexpr const char* kUse =
    "use --sweep nodes=1,2,4,8, --sweep global-batch=64,128 or --sweep seq=1024,2048; repeat "
    "--sweep for more axes";

Error bad_spec(const std::string& spec, const std::string& why) {
  return Error(Errc::usage, fmt::format("--sweep {}: {}", spec, why), "", kUse);
}

// The axes a sweep may vary, as written on the command line, and the option each sets.
constexpr const char* kAxes[] = {"nodes", "global-batch", "seq"};

// The columns of every row, in order. search_seconds (wall-clock, different on every run) is
// appended only with --timing.
const char* kColumns[] = {"nodes",
                          "ranks",
                          "global_batch",
                          "seq",
                          "status",
                          "dp",
                          "tp",
                          "pp",
                          "ep",
                          "optimizer_shard",
                          "micro_batch_size",
                          "micro_batches",
                          "schedule",
                          "virtual_stages",
                          "sequence_parallel",
                          "iteration_seconds",
                          "tokens_per_second",
                          "mfu",
                          "hfu",
                          "peak_memory_bytes",
                          "evaluated",
                          "error"};

// RFC 4180: a cell holding a comma, a quote or a line break is quoted, quotes doubled.
std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

Expected<SweepAxis> parse_axis(const std::string& spec) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos) return bad_spec(spec, "expected AXIS=V1,V2,...");
  std::string key = spec.substr(0, eq);
  if (key == "global_batch") key = "global-batch";
  if (std::find(std::begin(kAxes), std::end(kAxes), key) == std::end(kAxes))
    return bad_spec(spec, fmt::format("unknown axis '{}' (nodes, global-batch or seq)", key));
  SweepAxis axis{key, {}};
  const std::string_view list = std::string_view(spec).substr(eq + 1);
  if (list.empty()) return bad_spec(spec, fmt::format("no values for '{}'", key));
  for (std::size_t at = 0;;) {
    const auto comma = list.find(',', at);
    const std::string_view item =
        list.substr(at, comma == std::string_view::npos ? comma : comma - at);
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty()) return bad_spec(spec, "empty value in the list");
    if (ec != std::errc() || p != item.data() + item.size() || v <= 0)
      return bad_spec(spec, fmt::format("'{}' is not a positive integer", item));
    if (std::find(axis.values.begin(), axis.values.end(), v) != axis.values.end())
      return bad_spec(spec, fmt::format("{} appears twice", v));
    axis.values.push_back(v);
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return axis;
}

// "nodes=2 seq=1024": one point of the product, for messages.
std::string point_label(const std::vector<SweepAxis>& axes, const std::vector<std::size_t>& at) {
  std::string s;
  for (std::size_t a = 0; a < axes.size(); ++a)
    s += fmt::format("{}{}={}", a ? " " : "", axes[a].key, axes[a].values[at[a]]);
  return s;
}

}  // namespace

Expected<std::vector<SweepAxis>> parse_sweeps(const std::vector<std::string>& specs) {
  std::vector<SweepAxis> axes;
  for (const auto& spec : specs) {
    HP_ASSIGN_OR_RETURN(SweepAxis axis, parse_axis(spec));
    for (const auto& seen : axes)
      if (seen.key == axis.key)
        return bad_spec(spec, fmt::format("axis '{}' is already swept", axis.key));
    axes.push_back(std::move(axis));
  }
  if (axes.empty()) return Error(Errc::usage, "--sweep needs at least one axis", "", kUse);
  return axes;
}

Expected<SweepResult> run_sweep(const PlanOptions& opts, const recipe::Cluster& cluster) {
  HP_ASSIGN_OR_RETURN(const std::vector<SweepAxis> axes, parse_sweeps(opts.sweep));
  std::vector<const char*> columns(std::begin(kColumns), std::end(kColumns));
  if (opts.timing) columns.insert(columns.end() - 1, "search_seconds");

  SweepResult result;
  if (!opts.json) result.text = fmt::format("{}\n", fmt::join(columns, ","));
  // An odometer over the axes' value indices: the last axis turns fastest.
  std::vector<std::size_t> at(axes.size(), 0);
  for (bool more = true; more; ++result.points) {
    PlanOptions o = opts;
    o.sweep.clear();
    o.compare = false;
    recipe::Cluster c = cluster;
    for (std::size_t a = 0; a < axes.size(); ++a) {
      const std::int64_t v = axes[a].values[at[a]];
      if (axes[a].key == "nodes") {
        HP_ASSIGN_OR_RETURN(c, recipe::scale_cluster(cluster, v));
      } else if (axes[a].key == "global-batch") {
        o.global_batch = v;
      } else {
        o.seq = v;
      }
    }
    auto rep = run(o, c);
    if (!rep && rep.error().code != Errc::infeasible) {
      Error e = std::move(rep).error();
      e.what.message = fmt::format("sweep point {}: {}", point_label(axes, at), e.what.message);
      return e;
    }
    nlohmann::ordered_json row;
    row["nodes"] = c.nodes;
    row["ranks"] = c.ranks();
    row["global_batch"] = rep ? rep->global_batch : o.global_batch > 0 ? o.global_batch : c.ranks();
    if (rep)
      row["seq"] = rep->seq;
    else if (o.seq > 0)
      row["seq"] = o.seq;
    row["status"] = rep ? "ok" : "infeasible";
    if (rep) {
      const Plan& b = rep->plans.front();
      const Config& k = b.config;
      row["dp"] = k.dp, row["tp"] = k.tp, row["pp"] = k.pp, row["ep"] = k.ep;
      row["optimizer_shard"] = recipe::optimizer_shard_name(k.optimizer_shard);
      row["micro_batch_size"] = k.micro_batch_size, row["micro_batches"] = k.micro_batches;
      row["schedule"] = recipe::schedule_name(k.schedule), row["virtual_stages"] = k.virtual_stages;
      row["sequence_parallel"] = k.sequence_parallel;
      row["iteration_seconds"] = b.predicted.iteration,
      row["tokens_per_second"] = b.predicted.tokens_per_second;
      row["mfu"] = b.predicted.mfu, row["hfu"] = b.predicted.hfu,
      row["peak_memory_bytes"] = b.predicted.peak_memory;
      row["evaluated"] = rep->stats.evaluated;
      if (opts.timing) row["search_seconds"] = rep->stats.seconds;
    } else {
      row["error"] = rep.error().message();
      result.infeasible.push_back(point_label(axes, at));
    }
    if (opts.json) {
      result.text += row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    } else {
      for (std::size_t i = 0; i < columns.size(); ++i) {
        std::string cell;
        if (row.contains(columns[i])) {
          const auto& x = row[columns[i]];
          cell = x.is_string() ? x.get<std::string>() : x.dump();
        }
        result.text += (i ? "," : "") + csv_cell(cell);
      }
      result.text += "\n";
    }
    more = false;
    for (std::size_t a = axes.size(); a-- > 0;) {
      if (++at[a] < axes[a].values.size()) {
        more = true;
        break;
      }
      at[a] = 0;
    }
  }
  return result;
}

}  // namespace hp::planner
