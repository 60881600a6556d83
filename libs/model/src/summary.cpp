// `hp plan --summary` as one library call: load, infer at bound dims, cost, discover layers, total.
#include "hp/model/summary.h"

#include <fmt/core.h>

#include <charconv>
#include <set>

#include "hp/core/checked.h"
#include "hp/model/ops.h"
#include "hp/model/plan_options.h"

namespace hp::model {
namespace {

// Identity nodes reading a float initializer, with the units that read the alias or its source.
std::vector<WeightAlias> find_aliases(const Graph& g, const Layering& l) {
  std::vector<const Block*> unit_of(g.nodes.size(), nullptr);
  auto mark = [&](const Block& b) {
    for (int n : b.nodes) unit_of[static_cast<std::size_t>(n)] = &b;
  };
  mark(l.prologue);
  for (const auto& b : l.blocks) mark(b);
  mark(l.epilogue);
  auto readers = [&](const Tensor& t, std::set<std::string>& names) {
    for (int c : t.consumers)
      if (const Block* b = unit_of[static_cast<std::size_t>(c)];
          b && g.node(c).op_type != "Identity")
        names.insert(b->name);
  };
  std::vector<WeightAlias> out;
  for (const auto& n : g.nodes) {
    if (n.op_type != "Identity" || n.inputs.empty() || n.inputs[0] < 0 || n.outputs.empty() ||
        n.outputs[0] < 0)
      continue;
    const Tensor& src = g.tensor(n.inputs[0]);
    if (src.kind != TensorKind::initializer || !src.is_float()) continue;
    const Tensor& alias = g.tensor(n.outputs[0]);
    std::set<std::string> names;
    readers(alias, names);
    readers(src, names);
    out.push_back({alias.name, src.name, {names.begin(), names.end()}});
  }
  return out;
}

}  // namespace

ModelSummary summarize_graph(const Model& model, Graph graph, const DimBindings& dims) {
  ModelSummary s;
  s.model = model.path.string();
  s.ir_version = model.ir_version;
  s.opsets = model.opsets;
  s.dims = dims;
  s.nodes = static_cast<std::int64_t>(graph.nodes.size());
  // Parameters: every floating-point initializer once, whoever uses it (tied weights count once:
  // they are one initializer, or a copy tied.cpp recognised).
  for (const auto& t : graph.tensors) {
    if (!t.is_parameter()) continue;
    s.parameters = saturating_add(s.parameters, t.numel().value_or(0));
    s.parameter_bytes = saturating_add(s.parameter_bytes, t.bytes().value_or(0));
  }
  std::set<std::string> unsupported;
  for (const auto& n : graph.nodes) {
    s.matmul_flops += n.cost.matmul_flops;
    s.other_flops += n.cost.other_flops;
    if (!n.cost.known) ++s.nodes_cost_unknown;
    ++s.ops[n.domain.empty() ? n.op_type : n.domain + "." + n.op_type];
    if (!is_supported_op(n.domain, n.op_type))
      unsupported.insert(n.domain.empty() ? n.op_type : n.domain + "." + n.op_type);
  }
  s.flops = s.matmul_flops + s.other_flops;
  s.unsupported_ops.assign(unsupported.begin(), unsupported.end());
  s.unknown_dims = graph.unknown_dims;
  s.missing_external_data = model.missing_external_data;
  s.warnings = graph.warnings;
  for (const auto& f : model.missing_external_data)
    s.warnings.push_back(
        fmt::format("external data file '{}' is absent: fine for planning, needed to run", f));
  if (s.nodes_cost_unknown > 0)
    s.warnings.push_back(
        fmt::format("{} nodes have unknown shapes; their FLOPs and bytes are not counted",
                    s.nodes_cost_unknown));
  for (int c : graph.copies) {
    const Tensor& copy = graph.tensor(c);
    s.tied_copies.push_back(copy.name);
    s.warnings.push_back(
        fmt::format("initializer '{}' is a transposed copy of '{}' (tied weights): counted once",
                    copy.name, graph.tensor(copy.copy_of).name));
  }
  s.layering = discover_layers(graph);
  if (s.layering.blocks.empty())
    s.warnings.push_back("no repeated blocks found; the whole model is reported as the prologue");
  s.aliased_weights = find_aliases(graph, s.layering);
  std::size_t across = 0;
  for (const auto& a : s.aliased_weights) across += a.blocks.size() > 1;
  if (across > 0)
    s.warnings.push_back(fmt::format(
        "{} initializers are shared across blocks through Identity nodes (the exporter stored "
        "equal weights once): trained as in the graph, their gradients add up",
        across));
  s.graph = std::move(graph);
  return s;
}

Expected<ModelSummary> summarize_model(const SummaryOptions& options) {
  LoadOptions lo;
  lo.mode = options.require_data ? LoadMode::require_data : LoadMode::shapes_only;
  HP_ASSIGN_OR_RETURN(auto model, load_model(options.model, lo));
  HP_ASSIGN_OR_RETURN(auto graph, build_graph(model, options.dims));
  return summarize_graph(model, std::move(graph), options.dims);
}

Expected<DimBindings> parse_dim_bindings(const std::vector<std::string>& args) {
  DimBindings out;
  for (const auto& a : args) {
    auto eq = a.find('=');
    std::string name = a.substr(0, eq);
    std::string value = eq == std::string::npos ? std::string() : a.substr(eq + 1);
    std::int64_t v = -1;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (eq == std::string::npos || name.empty() || value.empty() || ec != std::errc() ||
        end != value.data() + value.size() || v < 0)
      return Error(Errc::usage,
                   fmt::format("--dim '{}' is not NAME=VALUE with a non-negative integer VALUE", a),
                   "", "for example --dim batch=8 --dim seq=2048");
    if (v > kMaxDim)
      return Error(
          Errc::usage,
          fmt::format("--dim '{}': {} is above hp's limit for a dim, 2^40 (1099511627776)", a, v),
          "", "bind a realistic size");
    out[name] = v;
  }
  return out;
}

}  // namespace hp::model
