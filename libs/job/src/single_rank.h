// A model run on one rank without a recipe (`hp launch MODEL.onnx`, `hp verify MODEL.onnx`): the
// backends opened, the model loaded with its weights, the executor prepared (every unsupported op
// listed before any work) and the input files bound to the graph inputs.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hp/core/expected.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"
#include "hp/job/launch.h"
#include "hp/model/model.h"

namespace hp::job {

struct SingleRank {
  exec::Backends backends;
  std::unique_ptr<exec::Executor> exec;
  std::vector<exec::HostTensor> inputs;  ///< bound to the graph inputs, in their order
};

Expected<SingleRank> prepare_single_rank(const std::filesystem::path& model_path,
                                         const std::filesystem::path& inputs,
                                         const std::string& backend, int threads,
                                         const std::vector<std::filesystem::path>& plugin_paths,
                                         const std::vector<std::string>& open_options = {},
                                         bool profile = false);

/// Each output's name, dtype, shape, range and first values (hp launch --json).
nlohmann::ordered_json outputs_json(const std::vector<exec::HostTensor>& outs);

/// hp launch MODEL.onnx (launch_model.cpp): the model on one rank, --steps times.
Expected<LaunchReport> launch_model(const LaunchOptions& o);

/// "ran N nodes on BACKEND (K on the cpu fallback) in S s; peak tensor memory ..." with a newline.
std::string stats_line(const exec::ExecStats& s, const std::string& backend);

}  // namespace hp::job
