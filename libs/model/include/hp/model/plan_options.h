// The options of `hp plan`. The model part (which file, which dims) is used today by --summary; the
// planner fields are bound now so the command line stays stable, and move to libs/planner when the
// planner arrives (issue #4). Precedence when recipes fill this struct: defaults < recipe < flags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/graph.h"

namespace hp::model {

struct PlanOptions {
  std::string model;                 ///< ONNX file; empty = the bundled tiny-gpt2
  std::vector<std::string> dim_args; ///< raw --dim NAME=VALUE arguments
  bool summary = false;              ///< print the model summary instead of planning
  bool json = false;                 ///< JSON instead of a table
  bool require_data = false;         ///< fail when external weight files are absent
  std::string cluster;               ///< preset name or cluster TOML file
  std::int64_t nodes = 0;            ///< number of cluster nodes; 0 = the cluster file's own
  std::int64_t global_batch = 0;     ///< sequences per step; 0 = planner default
  std::int64_t seq = 0;              ///< sequence length; 0 = from --dim or the model
  std::string dtype = "bf16";
  std::string optimizer = "adam";
  std::string mode = "train";        ///< train | infer
  std::string output;                ///< recipe to write
  std::int64_t top_k = 3;            ///< plans to rank
};

/// Parses "NAME=VALUE" arguments (VALUE a non-negative integer). Malformed text is Errc::usage.
Expected<DimBindings> parse_dim_bindings(const std::vector<std::string>& args);

}  // namespace hp::model
