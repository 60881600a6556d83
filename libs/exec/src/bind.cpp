// Binding input_K.pb tensors to graph inputs, with the checks a user needs to find a wrong file:
// which file, which input, what the graph declares and what the file holds.
#include <fmt/core.h>

#include "hp/exec/executor.h"

namespace hp::exec {

Expected<std::vector<HostTensor>> bind_inputs(const std::vector<GraphIO>& graph_inputs,
                                              std::vector<HostTensor> given,
                                              const std::string& source) {
  std::vector<HostTensor> bound(graph_inputs.size());
  std::vector<bool> have(graph_inputs.size(), false);
  std::vector<Diagnostic> errors;
  auto file_of = [&](std::size_t k) { return fmt::format("{}/input_{}.pb", source, k); };
  for (std::size_t k = 0; k < given.size(); ++k) {
    std::size_t slot = k;
    if (!given[k].name.empty()) {
      slot = graph_inputs.size();
      for (std::size_t j = 0; j < graph_inputs.size(); ++j)
        if (graph_inputs[j].name == given[k].name) slot = j;
      if (slot == graph_inputs.size()) {
        errors.push_back({file_of(k),
                          fmt::format("names input '{}', which the graph lacks", given[k].name),
                          "the graph's inputs are listed by 'hp plan MODEL --summary'"});
        continue;
      }
    }
    if (slot >= graph_inputs.size()) {
      errors.push_back(
          {file_of(k), fmt::format("the graph has only {} inputs", graph_inputs.size()), ""});
      continue;
    }
    if (have[slot]) {
      errors.push_back(
          {file_of(k), fmt::format("input '{}' is given twice", graph_inputs[slot].name), ""});
      continue;
    }
    const GraphIO& io = graph_inputs[slot];
    const HostTensor& t = given[k];
    if (io.dtype >= 0 && t.dtype != io.dtype) {
      errors.push_back({file_of(k),
                        fmt::format("input '{}' must be {}, the file holds {}", io.name,
                                    dtype_label(io.dtype), dtype_label(t.dtype)),
                        ""});
      continue;
    }
    bool shape_ok = !io.has_shape || io.dims.size() == t.dims.size();
    for (std::size_t d = 0; shape_ok && io.has_shape && d < io.dims.size(); ++d)
      if (io.dims[d] >= 0 && io.dims[d] != t.dims[d]) shape_ok = false;
    if (!shape_ok) {
      std::string want = "[";
      for (std::size_t d = 0; d < io.dims.size(); ++d)
        want += (d ? "," : "") + (io.dims[d] < 0 ? std::string("?") : std::to_string(io.dims[d]));
      errors.push_back({file_of(k),
                        fmt::format("input '{}' must have shape {}, the file holds {}", io.name,
                                    want + "]", dims_label(t.dims)),
                        ""});
      continue;
    }
    have[slot] = true;
    bound[slot] = std::move(given[k]);
    bound[slot].name = io.name;
  }
  for (std::size_t j = 0; j < graph_inputs.size(); ++j)
    if (!have[j] && errors.empty())
      errors.push_back(
          {file_of(j),
           fmt::format("input file is missing (graph input '{}')", graph_inputs[j].name),
           "each graph input needs an input_K.pb file, K in graph input order"});
  if (!errors.empty()) return collect_errors(Errc::bad_input, std::move(errors));
  return bound;
}

}  // namespace hp::exec
