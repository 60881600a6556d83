// Rendering a ModelSummary: one JSON object for scripts and tests, a table for people.
//
// JSON counts (parameters, FLOPs, bytes) are integers so that scripts can compare them exactly;
// FLOPs are held as doubles internally and are exact integers far beyond any real model (2^53).
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "hp/core/units.h"
#include "hp/model/summary.h"

namespace hp::model {
namespace {

using nlohmann::json;

constexpr const char* kConvention =
    "MatMul/Gemm/Conv/Einsum: 2 FLOPs per multiply-accumulate (matmul_flops); elementwise 1, "
    "softmax 5, "
    "normalisation 8 per output element; reductions 1 per input element; data movement 0";

constexpr const char* kActivationConvention =
    "bytes of every activation tensor a block's nodes produce in one forward at the bound dims "
    "(shape arithmetic excluded): what the block keeps for backward without recomputation, an "
    "upper bound";

json exact(double v) {
  if (std::isfinite(v) && std::fabs(v) < 9e18) return static_cast<std::int64_t>(std::llround(v));
  return v;
}

json shape_json(const Tensor& t) {
  if (!t.has_shape) return nullptr;
  json dims = json::array();
  for (const auto& d : t.dims) {
    if (d.known())
      dims.push_back(d.value);
    else if (!d.symbol.empty())
      dims.push_back(d.symbol);
    else
      dims.push_back(nullptr);
  }
  return dims;
}

json block_json(const Block& b) {
  return json{{"name", b.name},
              {"parameters", b.parameters},
              {"flops", exact(b.flops)},
              {"matmul_flops", exact(b.matmul_flops)},
              {"activation_bytes", b.activation_bytes},
              {"nodes", b.nodes.size()},
              {"cost_known", b.cost_known}};
}

std::string dims_text(const DimBindings& dims) {
  std::string s;
  for (const auto& [k, v] : dims) s += fmt::format("{}{}={}", s.empty() ? "" : " ", k, v);
  return s.empty() ? "(none bound)" : s;
}

std::string list_text(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "none" : s;
}

}  // namespace

std::string format_summary_json(const ModelSummary& s) {
  json j;
  j["model"] = s.model;
  j["ir_version"] = s.ir_version;
  j["opsets"] = s.opsets;
  j["dims"] = s.dims;
  j["parameters"] = s.parameters;
  j["parameter_bytes"] = s.parameter_bytes;
  j["flops"] = exact(s.flops);
  j["matmul_flops"] = exact(s.matmul_flops);
  j["other_flops"] = exact(s.other_flops);
  j["flops_convention"] = kConvention;
  j["activation_bytes_convention"] = kActivationConvention;
  j["nodes"] = s.nodes;
  j["nodes_cost_unknown"] = s.nodes_cost_unknown;
  j["layer_discovery"] = {{"method", s.layering.method},
                          {"spine_tensors", s.layering.spine_tensors}};
  j["prologue"] = block_json(s.layering.prologue);
  j["layers"] = json::array();
  for (const auto& b : s.layering.blocks) j["layers"].push_back(block_json(b));
  j["epilogue"] = block_json(s.layering.epilogue);
  j["cuts"] = json::array();
  for (const auto& c : s.layering.cuts) {
    json tensors = json::array();
    for (int t : c.tensors) {
      const Tensor& tensor = s.graph.tensor(t);
      tensors.push_back({{"name", tensor.name},
                         {"shape", shape_json(tensor)},
                         {"bytes", tensor.bytes().value_or(0)}});
    }
    j["cuts"].push_back(
        {{"after", c.after}, {"before", c.before}, {"bytes", c.bytes}, {"tensors", tensors}});
  }
  j["ops"] = s.ops;
  j["unsupported_ops"] = s.unsupported_ops;
  j["unknown_dims"] = s.unknown_dims;
  j["missing_external_data"] = s.missing_external_data;
  j["tied_copies"] = s.tied_copies;
  j["aliased_weights"] = json::array();
  for (const auto& a : s.aliased_weights)
    j["aliased_weights"].push_back(
        {{"alias", a.alias}, {"source", a.source}, {"blocks", a.blocks}});
  j["unresolved_shapes"] = json::array();
  for (const auto& u : s.graph.unresolved)
    j["unresolved_shapes"].push_back(
        {{"node", u.node}, {"op", u.op}, {"tensor", u.tensor}, {"reason", u.reason}});
  j["warnings"] = s.warnings;
  // Names come from the file: invalid UTF-8 is replaced rather than failing the whole summary.
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string format_summary_text(const ModelSummary& s) {
  std::string out;
  auto line = [&](const char* key, const std::string& value) {
    out += fmt::format("{:<14}{}\n", key, value);
  };
  std::string opsets;
  for (const auto& [d, v] : s.opsets)
    opsets += fmt::format("{}{} {}", opsets.empty() ? "" : ", ", d.empty() ? "ai.onnx" : d, v);
  line("model", fmt::format("{} (ir {}, {})", s.model, s.ir_version, opsets));
  line("dims", dims_text(s.dims));
  line("parameters",
       fmt::format("{} ({}, {})", format_count(static_cast<double>(s.parameters)), s.parameters,
                   format_bytes(static_cast<double>(s.parameter_bytes))));
  line("flops", fmt::format("{} per forward (matmul {}, other {})", format_flops(s.flops),
                            format_flops(s.matmul_flops), format_flops(s.other_flops)));
  line("", "(matmul: 2 FLOPs per multiply-accumulate of MatMul/Gemm/Conv/Einsum)");
  line("nodes", fmt::format("{} ({} op types)", s.nodes, s.ops.size()));
  line("unsupported", list_text(s.unsupported_ops));
  line("unknown dims", list_text(s.unknown_dims));
  line("missing data", list_text(s.missing_external_data));
  // Where shapes stop being known (the first few; the JSON has them all).
  const auto& unresolved = s.graph.unresolved;
  if (unresolved.empty())
    line("unresolved", s.unknown_dims.empty() && s.nodes_cost_unknown == 0
                           ? "none (every tensor has a concrete shape)"
                       : !s.unknown_dims.empty()
                           ? "none (what is unknown follows from the unknown dims)"
                           : "none found (some nodes' costs are unknown; see the warnings)");
  for (std::size_t i = 0; i < unresolved.size() && i < 3; ++i)
    line(i == 0 ? "unresolved" : "", fmt::format("node '{}' ({}): {}", unresolved[i].node,
                                                 unresolved[i].op, unresolved[i].reason));
  if (unresolved.size() > 3) line("", fmt::format("... {} more nodes", unresolved.size() - 3));
  std::string aliases;
  for (const auto& a : s.aliased_weights) {
    std::string blocks;
    for (const auto& b : a.blocks) blocks += (blocks.empty() ? "" : ", ") + b;
    aliases +=
        fmt::format("{}{} = {} ({})", aliases.empty() ? "" : "; ", a.alias, a.source, blocks);
  }
  line("aliased", aliases.empty() ? "none"
                                  : fmt::format("{} weights (Identity of another initializer): {}",
                                                s.aliased_weights.size(), aliases));

  const auto& l = s.layering;
  out += fmt::format("\nlayers: {} repeated blocks (found by {}, {} single-tensor cut points)\n",
                     l.blocks.size(), l.method, l.spine_tensors);
  out += fmt::format("  {:<12} {:>6} {:>12} {:>13} {:>13} {:>13}\n", "block", "nodes", "parameters",
                     "flops", "matmul flops", "activations");
  auto row = [&](const Block& b) {
    out += fmt::format("  {:<12} {:>6} {:>12} {:>13} {:>13} {:>13}{}\n", b.name, b.nodes.size(),
                       format_count(static_cast<double>(b.parameters)), format_flops(b.flops),
                       format_flops(b.matmul_flops),
                       format_bytes(static_cast<double>(b.activation_bytes)),
                       b.cost_known ? "" : "  (incomplete)");
  };
  row(l.prologue);
  // Long stacks: first three, an ellipsis, the last one (the JSON has them all).
  for (std::size_t i = 0; i < l.blocks.size(); ++i) {
    if (l.blocks.size() > 6 && i == 3)
      out += fmt::format("  {:<12} ({} more like these)\n", "...", l.blocks.size() - 4);
    if (l.blocks.size() > 6 && i >= 3 && i + 1 < l.blocks.size()) continue;
    row(l.blocks[i]);
  }
  row(l.epilogue);
  if (!l.cuts.empty()) {
    const Cut& c = l.cuts.size() > 1 ? l.cuts[1] : l.cuts[0];
    out +=
        fmt::format("\ncut {} | {}: {} tensor{}, {}\n", c.after, c.before, c.tensors.size(),
                    c.tensors.size() == 1 ? "" : "s", format_bytes(static_cast<double>(c.bytes)));
  }
  out += "\nops:";
  for (const auto& [op, n] : s.ops) out += fmt::format(" {}={}", op, n);
  out += "\n";
  return out;
}

}  // namespace hp::model
