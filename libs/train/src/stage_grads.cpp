// The stage names of a GradSpec (stage_grads.h). A middle pipeline stage has no loss: the gradient
// of each output it sends on comes back from the next stage as a graph input, and the gradient of
// each activation it received is sent back as a graph output. Both are named "<tensor>.grad" so
// the runtime wires stages by name without a table.
#include "stage_grads.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "graph_parts.h"

namespace hp::train::detail {

namespace {

std::string type_label(std::int32_t t) {
  if (!onnx::TensorProto::DataType_IsValid(t) || t == 0) return "untyped";
  std::string s = onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(t));
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "none" : s;
}

}  // namespace

std::string stage_grad_name(const std::string& tensor) { return tensor + ".grad"; }

Status check_stage_spec(const GraphWriter& w, const GradSpec& spec, const std::string& where) {
  const onnx::GraphProto& pg = *w.fwd_proto;
  std::vector<std::string> outputs, inputs;
  std::set<std::string> inits;
  for (const auto& t : pg.initializer()) inits.insert(t.name());
  for (const auto& o : pg.output()) outputs.push_back(o.name());
  for (const auto& i : pg.input())
    if (!inits.count(i.name())) inputs.push_back(i.name());
  std::vector<Diagnostic> errors;
  auto fail = [&](std::string message, std::string hint = {}) {
    errors.push_back({where, "[train] " + std::move(message), std::move(hint)});
  };
  if (spec.logits.empty() && spec.output_grads.empty())
    fail("no loss and no output_grads: nothing to differentiate",
         "name the logits the loss reads, or the outputs whose gradient the next stage sends");
  std::set<std::string> seen;
  auto check_new_name = [&](const std::string& list, const std::string& name) {
    if (!seen.insert(list + "/" + name).second) {
      fail(fmt::format("{} names '{}' twice", list, name));
      return false;
    }
    const std::string g = stage_grad_name(name);
    if (w.fwd->find_tensor(g) >= 0 || g == spec.labels) {
      fail(
          fmt::format("{}: the name '{}' for the gradient of '{}' is already a tensor of the model",
                      list, g, name));
      return false;
    }
    return true;
  };
  for (const auto& o : spec.output_grads) {
    if (std::find(outputs.begin(), outputs.end(), o) == outputs.end()) {
      fail(fmt::format("output_grads names '{}', which is no graph output (the outputs: {})", o,
                       joined(outputs)));
      continue;
    }
    if (const std::int32_t t = w.elem_type(o); !is_float_type(t)) {
      fail(
          fmt::format("output_grads names '{}', an output of type {}: only floating-point outputs "
                      "carry a gradient",
                      o, type_label(t)));
      continue;
    }
    check_new_name("output_grads", o);
  }
  for (const auto& i : spec.input_grads) {
    if (std::find(inputs.begin(), inputs.end(), i) == inputs.end()) {
      fail(inits.count(i)
               ? fmt::format("input_grads names '{}', an initializer: its gradient is a parameter "
                             "gradient, not an input's",
                             i)
               : fmt::format("input_grads names '{}', which is no graph input (the inputs: {})", i,
                             joined(inputs)));
      continue;
    }
    if (const std::int32_t t = w.elem_type(i); !is_float_type(t)) {
      fail(
          fmt::format("input_grads names '{}', an input of type {}: only floating-point inputs "
                      "carry a gradient",
                      i, type_label(t)));
      continue;
    }
    check_new_name("input_grads", i);
  }
  if (!errors.empty()) return collect_errors(Errc::bad_input, std::move(errors));
  return {};
}

std::vector<std::string> declare_output_grads(GraphWriter& w, const GradSpec& spec) {
  std::vector<std::string> names;
  for (const auto& o : spec.output_grads) {
    const std::string g = stage_grad_name(o);
    const std::int32_t et = w.elem_type(o);
    onnx::ValueInfoProto* v = w.graph->add_input();
    v->set_name(g);
    w.declare_like(*v, et, o);
    w.types[g] = et;
    w.origin[g] = o;  // shaped like the output, for the rules' static shapes
    names.push_back(g);
  }
  return names;
}

}  // namespace hp::train::detail
