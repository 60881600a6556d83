// The metrics file of a training run (trainer.h): one JSON line per step.
#pragma once

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/train/trainer.h"

namespace hp::train::detail {

/// "  ETA 1m05s" for a progress line: the mean time of the steps run so far (this run's, so a
/// resumed run's earlier steps do not count) times the steps left; empty when none are left.
inline std::string eta_text(const std::vector<StepMetrics>& done, std::int64_t left) {
  if (left <= 0 || done.empty()) return "";
  double sum = 0;
  for (const auto& m : done) sum += m.seconds;
  const auto eta = static_cast<std::int64_t>(
      sum / static_cast<double>(done.size()) * static_cast<double>(left) + 0.5);
  if (eta >= 3600) return fmt::format("  ETA {}h{:02}m", eta / 3600, eta % 3600 / 60);
  if (eta >= 60) return fmt::format("  ETA {}m{:02}s", eta / 60, eta % 60);
  return fmt::format("  ETA {}s", eta);
}

/// Metrics lines go to a temporary sibling that is renamed over the file when the run ends, either
/// way: a reader never sees a file cut in the middle of a line.
class MetricsFile {
 public:
  Status open(const std::filesystem::path& path) {
    if (path.empty()) return {};
    path_ = path;
    tmp_ = path;
    tmp_ += ".tmp";
    out_.open(tmp_, std::ios::trunc);
    if (!out_) return Error(Errc::runtime, "cannot write the metrics file", tmp_.string());
    return {};
  }
  void add(const StepMetrics& m) {
    if (!out_.is_open()) return;
    nlohmann::json j = {{"step", m.step},
                        {"loss", m.loss},
                        {"grad_norm", m.grad_norm},
                        {"lr", m.lr},
                        {"seconds", m.seconds},
                        {"tokens_per_second", m.tokens_per_second},
                        {"peak_bytes", m.peak_bytes},
                        {"run_seconds", m.run_seconds},
                        {"reduce_seconds", m.reduce_seconds},
                        {"update_seconds", m.update_seconds},
                        {"tp_comm_seconds", m.tp_comm_seconds},
                        {"ep_comm_seconds", m.ep_comm_seconds}};
    out_ << j.dump() << '\n';
    out_.flush();
  }
  Status close() {
    if (!out_.is_open()) return {};
    out_.close();
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec)
      return Error(Errc::runtime, "cannot rename the metrics file: " + ec.message(),
                   path_.string());
    return {};
  }

 private:
  std::filesystem::path path_, tmp_;
  std::ofstream out_;
};

}  // namespace hp::train::detail
