// The metrics file of a training run (trainer.h): one JSON line per step.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "hp/core/expected.h"
#include "hp/train/trainer.h"

namespace hp::train::detail {

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
                        {"update_seconds", m.update_seconds}};
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
