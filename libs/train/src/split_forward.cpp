// split_forward_at (stages.h): a forward model cut in two at tensors; split_pipeline: in more.
//
// Each stage is the set of nodes its outputs need: the first stage's outputs are the cut tensors,
// the second's the model's outputs with the cut tensors given. A node both need is in both: that
// is right for what depends on the data inputs and constants alone (a mask computed from the ids,
// a position table), and wrong for an activation that crosses the cut without being listed (a
// residual): the second stage would recompute part of the first, and the first stage's weights
// would get part of their gradient in the second. The check tells the two apart by what the node
// reads: a weight (a floating-point initializer of more than one element) means an activation.
#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <set>

#include "graph_parts.h"
#include "hp/train/stages.h"

namespace hp::train {

namespace {

using detail::needed_nodes;

Status check_cut(const onnx::GraphProto& g, const std::vector<std::string>& cut,
                 const std::string& where) {
  if (cut.empty()) return Error(Errc::bad_input, "[train] the cut names no tensor", where);
  std::set<std::string> written, seen;
  for (const auto& n : g.node())
    for (const auto& o : n.output()) written.insert(o);
  std::vector<Diagnostic> errors;
  for (const auto& t : cut) {
    if (!seen.insert(t).second)
      errors.push_back({where, fmt::format("[train] the cut names '{}' twice", t), ""});
    else if (!written.count(t))
      errors.push_back(
          {where, fmt::format("[train] the cut names '{}', which no node of the model writes", t),
           "cut at activations: outputs of nodes"});
  }
  if (!errors.empty()) return collect_errors(Errc::bad_input, std::move(errors));
  return {};
}

/// Nodes in both stages that read a weight: activations crossing the cut unlisted.
Status check_separated(const onnx::GraphProto& g, const model::Graph& fg,
                       const std::vector<int>& first, const std::vector<int>& second,
                       const std::string& where) {
  std::vector<int> both;
  std::set_intersection(first.begin(), first.end(), second.begin(), second.end(),
                        std::back_inserter(both));
  std::vector<Diagnostic> errors;
  for (int k : both) {
    const auto& n = g.node(k);
    for (const auto& i : n.input()) {
      const int t = fg.find_tensor(i);
      if (t < 0 || !fg.tensor(t).is_parameter()) continue;
      const auto numel = fg.tensor(t).numel();
      if (numel && *numel <= 1) continue;
      errors.push_back(
          {where,
           fmt::format("[train] the cut does not separate the stages: node '{}' ({}) reading "
                       "weight '{}' is needed by both",
                       n.name().empty() ? n.output(0) : n.name(), n.op_type(), i),
           "add the activations that cross the cut (a residual) to the cut tensors"});
      break;
    }
  }
  if (!errors.empty()) return collect_errors(Errc::bad_input, std::move(errors));
  return {};
}

/// The model's graph inputs (not initializers) that `nodes` read, in the model's order.
std::vector<std::string> data_inputs_read(const onnx::GraphProto& g,
                                          const std::vector<int>& nodes) {
  const auto reads = detail::outside_reads(g, nodes);
  const std::set<std::string> r(reads.begin(), reads.end());
  std::set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  std::vector<std::string> out;
  for (const auto& v : g.input())
    if (r.count(v.name()) && !inits.count(v.name())) out.push_back(v.name());
  return out;
}

}  // namespace

Expected<ForwardStages> split_forward_at(const model::Model& model,
                                         const std::vector<std::string>& cut,
                                         const model::DimBindings& dims) {
  const onnx::GraphProto& g = model.proto->graph();
  const std::string where = model.path.string();
  HP_TRY(check_cut(g, cut, where));
  HP_ASSIGN_OR_RETURN(model::Graph fg, model::build_graph(model, dims));
  std::vector<std::string> outputs;
  for (const auto& o : g.output()) outputs.push_back(o.name());
  detail::PartSpec first, second;
  first.nodes = needed_nodes(g, cut, {});
  second.nodes = needed_nodes(g, outputs, std::set<std::string>(cut.begin(), cut.end()));
  for (int k : second.nodes)  // a Split whose other output the second stage needs
    for (const auto& o : g.node(k).output())
      if (std::find(cut.begin(), cut.end(), o) != cut.end())
        return Error(Errc::bad_input,
                     fmt::format("[train] node '{}' ({}) writes the cut tensor '{}' and another "
                                 "the second stage needs",
                                 g.node(k).name(), g.node(k).op_type(), o),
                     where, "cut at every output of the node that the second stage reads");
  HP_TRY(check_separated(g, fg, first.nodes, second.nodes, where));
  first.inputs = data_inputs_read(g, first.nodes);
  first.outputs = cut;
  second.inputs = cut;
  for (const auto& i : data_inputs_read(g, second.nodes))
    if (std::find(cut.begin(), cut.end(), i) == cut.end()) second.inputs.push_back(i);
  second.outputs = outputs;
  const detail::TensorInfo info(model, &fg);
  const std::string name = g.name().empty() ? "stage" : g.name();
  ForwardStages out;
  const auto r0 = detail::outside_reads(g, first.nodes),
             r1 = detail::outside_reads(g, second.nodes);
  const std::set<std::string> read_first(r0.begin(), r0.end());
  for (const auto& t : r1) {
    const int i = fg.find_tensor(t);
    if (read_first.count(t) && i >= 0 && fg.tensor(i).kind == model::TensorKind::initializer &&
        fg.tensor(i).is_float())
      out.shared_weights.push_back(t);
  }
  out.first = detail::part_model(model, first, info, name + "/first");
  out.second = detail::part_model(model, second, info, name + "/second");
  return out;
}

Expected<PipelinePieces> split_pipeline(const model::Model& model,
                                        const std::vector<std::vector<std::string>>& cuts,
                                        const model::DimBindings& dims) {
  std::set<std::string> graph_inputs;
  for (const auto& i : model.proto->graph().input()) graph_inputs.insert(i.name());
  std::map<std::string, std::size_t> boundary_of;  // a cut tensor -> its boundary
  PipelinePieces out;
  model::Model rest = model;
  for (std::size_t b = 0; b < cuts.size(); ++b) {
    HP_ASSIGN_OR_RETURN(ForwardStages fs, split_forward_at(rest, cuts[b], dims));
    for (const auto& t : cuts[b]) boundary_of.emplace(t, b);
    for (const auto& i : fs.second.proto->graph().input()) {
      auto it = boundary_of.find(i.name());
      if (it == boundary_of.end() || it->second == b || graph_inputs.count(i.name())) continue;
      return Error(Errc::not_implemented,
                   fmt::format("'{}' goes from stage {} to stage {} or later: pipeline training "
                               "passes activations to the next stage only",
                               i.name(), it->second, b + 1),
                   model.path.string(), "cut the stages where one tensor stream crosses");
    }
    out.stages.push_back(std::move(fs.first));
    rest = std::move(fs.second);
  }
  out.stages.push_back(std::move(rest));
  // Which stages read each floating-point initializer (each stage's model holds those it reads).
  std::set<std::string> floats;
  for (const auto& t : model.proto->graph().initializer())
    if (t.data_type() == onnx::TensorProto::FLOAT || t.data_type() == onnx::TensorProto::FLOAT16 ||
        t.data_type() == onnx::TensorProto::BFLOAT16 || t.data_type() == onnx::TensorProto::DOUBLE)
      floats.insert(t.name());
  std::map<std::string, std::vector<int>> readers;
  for (std::size_t s = 0; s < out.stages.size(); ++s)
    for (const auto& t : out.stages[s].proto->graph().initializer())
      if (floats.count(t.name())) readers[t.name()].push_back(static_cast<int>(s));
  for (auto& [name, stages] : readers)
    if (stages.size() > 1) out.shared[name] = std::move(stages);
  return out;
}

}  // namespace hp::train
