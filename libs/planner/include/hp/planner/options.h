// The options of `hp plan`, bound by apps/hp/cmd_plan.cpp and run by planner::run_command. The
// model part (which file, which dims) also serves --summary. Precedence when recipes fill this
// struct: defaults < recipe < flags.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/recipe/recipe.h"

namespace hp::planner {

struct PlanOptions {
  std::string model;                  ///< ONNX file; empty = the bundled tiny-gpt2
  std::vector<std::string> dim_args;  ///< raw --dim NAME=VALUE arguments
  bool summary = false;               ///< print the model summary instead of planning
  bool json = false;                  ///< JSON instead of a table
  bool require_data = false;          ///< fail when external weight files are absent
  std::string cluster;                ///< preset name or cluster TOML file
  std::int64_t nodes = 0;             ///< number of cluster nodes; 0 = the cluster file's own
  std::int64_t global_batch = 0;      ///< sequences per step; 0 = planner default (one per rank)
  std::int64_t seq = 0;               ///< sequence length; 0 = from --dim or the model
  std::string dtype = "bf16";         ///< compute dtype (weights, activations, communication)
  std::string optimizer = "adam";     ///< adam | adamw | sgd | none
  std::string mode = "train";         ///< train | infer
  /// -o also writes a [train] table, so that `hp launch` trains the recipe (the app sets it when
  /// --mode train is given explicitly: the default mode prices a training step, but a recipe
  /// planned without asking keeps running the model forward, as before [train] existed).
  bool train_table = false;
  std::string output;                 ///< recipe to write
  std::int64_t top_k = 3;             ///< plans to rank
  std::vector<std::string> fix_args;  ///< raw --fix KEY=VALUE arguments (restrict the search)
  bool compare = false;               ///< also run the DP x TP-only and greedy "expert" baselines
  /// --sweep AXIS=V1,V2,... (repeatable): one plan per point of the axes' cartesian product.
  std::vector<std::string> sweep;
  bool timing = false;            ///< --sweep: add the search's wall-clock seconds (not stable)
  bool allow_infeasible = false;  ///< --sweep: infeasible points do not fail the command
  std::string schedule_svg;       ///< file to draw the best plan's pipeline schedule into
  std::string command;            ///< the command line, recorded in the recipe's [workload]
  /// Checks a recipe about to be written with -o (the app passes hp shard's check: the planner sits
  /// below the sharder). A plan that fails it is not written; the next-ranked plan that passes is,
  /// with a warning, and none passing is an error naming each plan's reason. Empty: no check.
  std::function<Status(const recipe::Recipe&, const std::filesystem::path&)> check_plan;
  /// --explain NAME: print one tensor's layout under the best plan instead of the plan table.
  std::string explain;
  /// Explains tensor `name` of a recipe (to be written at the path given) as `hp shard --explain`
  /// does, JSON when asked (the app passes hp shard's: the planner sits below the sharder). Empty:
  /// --explain is not available.
  std::function<Expected<std::string>(const recipe::Recipe&, const std::filesystem::path&,
                                      const std::string& name, bool json)>
      explain_tensor;
  // Where hp's bundled data is, which only the app knows (an installed hp's data directory, then
  // the source tree of a build):
  std::vector<std::filesystem::path>
      preset_dirs;  ///< cluster presets, in search order (recipe::preset_dirs)
  std::vector<std::filesystem::path>
      model_dirs;  ///< directories that may hold the bundled tiny-gpt2.onnx, in order
};

}  // namespace hp::planner
