// Chrome trace events of training ranks (trace.h).
#include "hp/train/trace.h"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "hp/core/fs.h"

namespace hp::train {

namespace {

std::int64_t micros(TraceLog::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

void TraceLog::add(std::string name, const char* category, int tid, Clock::time_point t0,
                   Clock::time_point t1, std::string args) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(
      {std::move(name), std::move(args), category, tid, micros(t0), micros(t1) - micros(t0)});
}

Status TraceLog::write(const std::filesystem::path& path, int rank) const {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"args", {{"name", fmt::format("rank {}", rank)}}}});
  for (int tid : {0, 1, 2, 3})
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank},
                      {"tid", tid},
                      {"args",
                       {{"name", tid == 0   ? "step"
                                 : tid == 1 ? "gradient reduction"
                                 : tid == 2 ? "gradient model nodes"
                                            : "parameter gathers (ZeRO-3)"}}}});
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Event& e : events_) {
      nlohmann::json j = {{"name", e.name}, {"cat", e.category}, {"ph", "X"},   {"pid", rank},
                          {"tid", e.tid},   {"ts", e.ts},        {"dur", e.dur}};
      if (!e.args.empty()) j["args"] = nlohmann::json::parse(e.args, nullptr, false);
      events.push_back(std::move(j));
    }
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return write_file_atomic(path, doc.dump() + "\n");
}

std::filesystem::path trace_part(const std::filesystem::path& path, int rank) {
  std::filesystem::path p = path;
  p += fmt::format(".rank-{}", rank);
  return p;
}

Status merge_traces(const std::filesystem::path& path, int ranks) {
  nlohmann::json all = nlohmann::json::array();
  for (int r = 0; r < ranks; ++r) {
    const auto part = trace_part(path, r);
    std::ifstream in(part);
    if (!in) return Error(Errc::runtime, "a rank wrote no trace", part.string());
    std::stringstream text;
    text << in.rdbuf();
    auto j = nlohmann::json::parse(text.str(), nullptr, false);
    if (j.is_discarded() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
      return Error(Errc::runtime, "a rank's trace is not a Chrome trace", part.string());
    for (auto& e : j["traceEvents"]) all.push_back(std::move(e));
  }
  nlohmann::json doc = {{"traceEvents", std::move(all)}, {"displayTimeUnit", "ms"}};
  HP_TRY(write_file_atomic(path, doc.dump() + "\n"));
  for (int r = 0; r < ranks; ++r) {
    std::error_code ec;
    std::filesystem::remove(trace_part(path, r), ec);
  }
  return {};
}

}  // namespace hp::train
