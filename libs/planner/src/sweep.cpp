// `hp plan --sweep KEY=V1,V2,...`: one planner run per value, one CSV row (or JSON line) each, so
// CI scripts can track how the best plan and its throughput move with the cluster size or the
// batch.
#include <charconv>
#include <iterator>

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "hp/planner/planner.h"

namespace hp::planner {
namespace {

Error bad_spec(const std::string& spec, const std::string& why) {
  return Error(Errc::usage, fmt::format("--sweep {}: {}", spec, why), "",
               "use --sweep nodes=1,2,4,8 or --sweep global-batch=64,128,256");
}

const char* kColumns[] = {"nodes",
                          "ranks",
                          "global_batch",
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
                          "search_seconds",
                          "evaluated"};

}  // namespace

Expected<std::string> run_sweep(const PlanOptions& opts, const recipe::Cluster& cluster) {
  const auto eq = opts.sweep.find('=');
  if (eq == std::string::npos) return bad_spec(opts.sweep, "expected KEY=V1,V2,...");
  const std::string key = opts.sweep.substr(0, eq);
  if (key != "nodes" && key != "global-batch" && key != "global_batch")
    return bad_spec(opts.sweep, fmt::format("unknown key '{}' (nodes or global-batch)", key));
  std::vector<std::int64_t> values;
  std::string_view rest = std::string_view(opts.sweep).substr(eq + 1);
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || p != item.data() + item.size() || v <= 0)
      return bad_spec(opts.sweep, fmt::format("'{}' is not a positive integer", item));
    values.push_back(v);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }

  std::string out;
  if (!opts.json) {
    for (std::size_t i = 0; i < std::size(kColumns); ++i)
      out += fmt::format("{}{}", i ? "," : "", kColumns[i]);
    out += "\n";
  }
  for (std::int64_t v : values) {
    PlanOptions o = opts;
    o.sweep.clear();
    o.compare = false;
    recipe::Cluster c = cluster;
    if (key == "nodes") {
      HP_ASSIGN_OR_RETURN(c, recipe::scale_cluster(cluster, v));
    } else {
      o.global_batch = v;
    }
    auto rep = run(o, c);
    if (!rep && rep.error().code != Errc::infeasible) return std::move(rep).error();
    nlohmann::ordered_json row;
    row["nodes"] = c.nodes;
    row["ranks"] = c.ranks();
    row["global_batch"] = o.global_batch > 0 ? o.global_batch : c.ranks();
    row["status"] = rep ? "ok" : "infeasible";
    if (rep) {
      const Plan& b = rep->plans.front();
      const Config& k = b.config;
      row["dp"] = k.dp, row["tp"] = k.tp, row["pp"] = k.pp, row["ep"] = k.ep;
      row["optimizer_shard"] = k.optimizer_shard;
      row["micro_batch_size"] = k.micro_batch_size, row["micro_batches"] = k.micro_batches;
      row["schedule"] = recipe::schedule_name(k.schedule), row["virtual_stages"] = k.virtual_stages;
      row["sequence_parallel"] = k.sequence_parallel;
      row["iteration_seconds"] = b.predicted.iteration,
      row["tokens_per_second"] = b.predicted.tokens_per_second;
      row["mfu"] = b.predicted.mfu, row["hfu"] = b.predicted.hfu,
      row["peak_memory_bytes"] = b.predicted.peak_memory;
      row["search_seconds"] = rep->stats.seconds, row["evaluated"] = rep->stats.evaluated;
    } else {
      row["error"] = rep.error().message();
    }
    if (opts.json) {
      out += row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      continue;
    }
    for (std::size_t i = 0; i < std::size(kColumns); ++i) {
      std::string cell;
      if (row.contains(kColumns[i])) {
        const auto& x = row[kColumns[i]];
        cell = x.is_string() ? x.get<std::string>() : x.dump();
      }
      out += fmt::format("{}{}", i ? "," : "", cell);
    }
    out += "\n";
  }
  return out;
}

}  // namespace hp::planner
