// What libonnx's shape inference is fed, checked first.
//
// libonnx runs each op's inference function on the node as written, and those functions trust
// the node to match its schema: Scan's reads its `body` attribute without checking it is there, so
// a node renamed to Scan (or a Loop without a body, an op with too few inputs) is a SIGSEGV inside
// the library, not an exception hp could catch. The schema's own Verify (what onnx.checker runs)
// checks input and output counts and required attributes and throws on a mismatch, so running it
// on every node first turns those crashes into errors naming the node.
#include <onnx/defs/schema.h>

#include <fmt/core.h>

#include "shape_infer.h"

namespace hp::model {

Status check_node_schemas(const onnx::GraphProto& g,
                          const std::map<std::string, std::int64_t>& opsets,
                          const std::string& where) {
  const auto& registry = *onnx::OpSchemaRegistry::Instance();
  // Let go while a subgraph is checked (the recursion takes it itself).
  std::unique_lock<std::mutex> lock(onnx_registry_mutex());
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& n = g.node(i);
    const std::string domain = n.domain() == "ai.onnx" ? "" : n.domain();
    auto it = opsets.find(domain);
    if (it == opsets.end()) continue;  // a domain the model does not import: no schema to apply
    // An opset newer than this libonnx knows may have changed the op (ReduceMean takes its axes
    // as an input from opset 18); the older schema would refuse a valid node, so it is not applied.
    const auto& known = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
    auto range = known.find(domain);
    if (range == known.end() || it->second > range->second.second) continue;
    const onnx::OpSchema* schema = registry.GetSchema(n.op_type(), it->second, domain);
    if (!schema) continue;  // unknown ops are reported by the op table, not here
    std::string label = n.name().empty() ? fmt::format("#{}", i) : "'" + n.name() + "'";
    try {
      schema->Verify(n);
    } catch (const std::exception& e) {
      return Error(
          Errc::bad_input,
          fmt::format("node {} ({}) does not match its schema: {}", label, n.op_type(), e.what()),
          where);
    }
    lock.unlock();  // the recursion takes it again
    for (const auto& a : n.attribute()) {
      if (a.has_g()) HP_TRY(check_node_schemas(a.g(), opsets, where));
      for (const auto& sub : a.graphs()) HP_TRY(check_node_schemas(sub, opsets, where));
    }
    lock.lock();
  }
  return Status::success();
}

}  // namespace hp::model
