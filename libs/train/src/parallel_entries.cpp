// mark_parallel_entries (rewrite.h): the entries of tensor-parallel regions, where the gradient of
// a tensor every member holds whole is summed over the members' parts.
#include <fmt/core.h>

#include "graph_parts.h"
#include "hp/core/hp_domain.h"
#include "rewrite.h"

namespace hp::train::detail {

int mark_parallel_entries(onnx::GraphProto& g, std::set<std::string> varying,
                          const std::set<std::string>& original,
                          const std::vector<std::int64_t>& group,
                          std::map<std::string, std::vector<std::int64_t>>& reduce_grad) {
  // Integer initializers (shapes, indices, axes) and Constant nodes carry no gradient: no entry
  // for them. A float Constant (GELU's sqrt 2, attention's scale) would otherwise be read through
  // an Identity, hiding it from the rewrites that look for constants (find_gelu_chains, the
  // executor's fusions) and all-reducing a gradient nobody uses.
  std::set<std::string> no_grad;
  for (const auto& t : g.initializer())
    if (!is_float_type(t.data_type())) no_grad.insert(t.name());
  for (const auto& n : g.node())
    if (n.op_type() == "Constant" && (n.domain().empty() || n.domain() == "ai.onnx"))
      for (const auto& o : n.output()) no_grad.insert(o);
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  nodes.Swap(g.mutable_node());
  std::map<std::string, std::string> entry;  // same-valued tensor -> its entry
  for (auto& n : nodes) {
    // A routed dispatch moves each token's rows to the members holding its experts and its
    // gradient back (rules_comm.cpp): what enters it is this member's own, no sum over the group.
    if (n.domain() == domain::kDomain && n.op_type() == domain::kDispatch) {
      *g.add_node() = std::move(n);
      continue;
    }
    bool reads_varying = false;
    for (const auto& i : n.input()) reads_varying = reads_varying || varying.count(i);
    for (const auto& o : n.output())
      if (!original.count(o) && reads_varying) varying.insert(o);
    bool computes_varying = false;
    for (const auto& o : n.output()) computes_varying = computes_varying || varying.count(o);
    if (computes_varying)
      for (int i = 0; i < n.input_size(); ++i) {
        const std::string& x = n.input(i);
        if (x.empty() || varying.count(x) || no_grad.count(x)) continue;
        auto [it, fresh] = entry.try_emplace(x, x + ".tp_entry");
        if (fresh) {
          onnx::NodeProto* id = g.add_node();
          id->set_op_type("Identity");
          id->set_name(it->second);
          id->add_input(x);
          id->add_output(it->second);
          reduce_grad[it->second] = group;
        }
        n.set_input(i, it->second);
      }
    *g.add_node() = std::move(n);
  }
  return static_cast<int>(entry.size());
}

}  // namespace hp::train::detail
