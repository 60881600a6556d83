// `hp plan --summary`: one call that loads a model, infers shapes at the bound dims, costs every
// node, discovers the layers, and renders the result as a table or one JSON object.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/graph.h"
#include "hp/model/layers.h"

namespace hp::model {

struct SummaryOptions {
  std::filesystem::path model;
  DimBindings dims;           ///< symbolic input dims to bind (--dim NAME=VALUE)
  bool require_data = false;  ///< fail when external weight files are absent
};

/// An initializer the exporter shares through an Identity node: equal initial weights (LayerNorm
/// weights left at their init of ones) are stored once and every other user reads an Identity of
/// it. In the file they are one tensor; in training they were separate parameters, and if trained
/// as one, as the graph says, their gradients add up.
struct WeightAlias {
  std::string alias;                ///< the Identity's output, named like the shared parameter
  std::string source;               ///< the initializer it reads
  std::vector<std::string> blocks;  ///< the units (prologue, blocks, epilogue) reading either
};

struct ModelSummary {
  std::string model;  ///< path as given
  std::int64_t ir_version = 0;
  std::map<std::string, std::int64_t> opsets;
  DimBindings dims;  ///< the bindings used
  std::int64_t nodes = 0;
  std::int64_t parameters = 0;  ///< float initializer elements, each initializer once
  std::int64_t parameter_bytes = 0;
  double flops = 0;  ///< one forward pass at the bound dims
  double matmul_flops = 0;
  double other_flops = 0;
  std::int64_t nodes_cost_unknown = 0;      ///< nodes whose FLOPs are not counted (unknown shapes)
  std::map<std::string, std::int64_t> ops;  ///< op type -> count
  std::vector<std::string> unsupported_ops;
  std::vector<std::string> unknown_dims;
  std::vector<std::string> missing_external_data;
  /// Initializers not counted because they are transposed copies of others (tied weights).
  std::vector<std::string> tied_copies;
  /// Identity-aliased initializers (WeightAlias), in node order.
  std::vector<WeightAlias> aliased_weights;
  std::vector<std::string> warnings;
  Layering layering;
  Graph graph;  ///< for callers that want per-node detail
};

/// Loads `options.model` and summarises it. Errors carry the model path in `where`.
Expected<ModelSummary> summarize_model(const SummaryOptions& options);

/// Summary from an already built graph (tests, and callers that loaded the model themselves).
ModelSummary summarize_graph(const Model& model, Graph graph, const DimBindings& dims);

/// One JSON object (see `hp plan --summary --json` in man/hp-plan.1.md), with a trailing newline.
std::string format_summary_json(const ModelSummary& summary);
/// A readable table for terminals.
std::string format_summary_text(const ModelSummary& summary);

}  // namespace hp::model
