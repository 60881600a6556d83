// Output shapes of the "hp" domain's communication nodes (hp/core/hp_domain.h), which ONNX's own
// inference does not know: partitions written by `hp shard` hold them, and the executor's offload
// planner and the cost model need every tensor's size.
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include "hp/core/hp_domain.h"
#include "shape_infer.h"

namespace hp::model {

namespace {

/// hp.Dispatch: each output is [rows routed to the expert (known only when it runs), the row's
/// dims]; hp.Combine: [tokens, experts, the row's dims]. Returns the outputs fixed.
int fix_routed_shapes(const onnx::NodeProto& n, const ShapeMap& shapes, ShapeMap& fixed) {
  if (n.input_size() < 2) return 0;
  auto x = shapes.find(n.input(0));
  auto idx = shapes.find(n.input(n.input_size() - 1));
  if (x == shapes.end() || !x->second.has_shape || x->second.dims.empty()) return 0;
  const bool dispatch = n.op_type() == domain::kDispatch;
  const std::size_t lead =
      dispatch && attr_int(n, std::string(domain::kAttrStacked), 0) != 0 ? 2 : 1;
  if (x->second.dims.size() < lead) return 0;
  std::vector<Dim> rest(x->second.dims.begin() + static_cast<std::ptrdiff_t>(lead),
                        x->second.dims.end());
  int added = 0;
  if (dispatch) {
    for (const auto& out : n.output()) {
      if (out.empty() || fixed.count(out)) continue;
      ShapeInfo y;
      y.elem_type = x->second.elem_type;
      y.dims.push_back(Dim{-1, out + "_rows"});
      y.dims.insert(y.dims.end(), rest.begin(), rest.end());
      y.has_shape = true;
      fixed[out] = std::move(y);
      ++added;
    }
    return added;
  }
  const std::string& out = n.output(0);
  if (out.empty() || fixed.count(out) || idx == shapes.end() || !idx->second.has_shape ||
      idx->second.dims.size() != 2)
    return 0;
  ShapeInfo y;
  y.elem_type = x->second.elem_type;
  y.dims.push_back(idx->second.dims[0]);
  y.dims.push_back(Dim{attr_int(n, std::string(domain::kAttrExperts), -1), {}});
  y.dims.insert(y.dims.end(), rest.begin(), rest.end());
  y.has_shape = true;
  fixed[out] = std::move(y);
  return 1;
}

}  // namespace

int fix_hp_domain_shapes(const onnx::GraphProto& g, const ShapeMap& shapes, ShapeMap& fixed) {
  int added = 0;
  for (const auto& n : g.node()) {
    if (n.domain() != domain::kDomain || n.output_size() == 0 || n.output(0).empty()) continue;
    const std::string& out = n.output(0);
    if (fixed.count(out)) continue;
    if (auto it = shapes.find(out); it != shapes.end() && it->second.has_shape) {
      bool known = true;
      for (const auto& d : it->second.dims) known = known && d.known();
      if (known) continue;
    }
    ShapeInfo y;
    const std::string op = n.op_type();
    if (op == domain::kDispatch || op == domain::kCombine) {
      added += fix_routed_shapes(n, shapes, fixed);
      continue;
    }
    if (op == domain::kRecv) {
      y.elem_type = static_cast<std::int32_t>(attr_int(n, std::string(domain::kAttrDtype), 0));
      for (auto d : attr_ints(n, std::string(domain::kAttrShape))) y.dims.push_back(Dim{d, {}});
    } else {
      if (n.input_size() == 0) continue;
      auto it = shapes.find(n.input(0));
      if (it == shapes.end() || !it->second.has_shape) continue;
      y = it->second;
      bool known = true;
      for (const auto& d : y.dims) known = known && d.known();
      if (!known) continue;
      const auto p =
          static_cast<std::int64_t>(attr_ints(n, std::string(domain::kAttrGroup)).size());
      const auto rank = static_cast<std::int64_t>(y.dims.size());
      auto at = [&](std::string_view name) {
        std::int64_t a = attr_int(n, std::string(name), 0);
        return a < 0 ? a + rank : a;
      };
      auto in_range = [&](std::int64_t a) { return a >= 0 && a < rank; };
      if (op == domain::kAllGather) {
        const auto a = at(domain::kAttrAxis);
        if (!in_range(a) || p < 1) continue;
        y.dims[static_cast<std::size_t>(a)].value *= p;
      } else if (op == domain::kReduceScatter) {
        const auto a = at(domain::kAttrAxis);
        if (!in_range(a) || p < 1 || y.dims[static_cast<std::size_t>(a)].value % p != 0) continue;
        y.dims[static_cast<std::size_t>(a)].value /= p;
      } else if (op == domain::kAllToAll) {
        const auto s = at(domain::kAttrSplitAxis), c = at(domain::kAttrConcatAxis);
        if (!in_range(s) || !in_range(c) || p < 1 ||
            y.dims[static_cast<std::size_t>(s)].value % p != 0)
          continue;
        y.dims[static_cast<std::size_t>(s)].value /= p;
        y.dims[static_cast<std::size_t>(c)].value *= p;
      } else if (op != domain::kAllReduce && op != domain::kCollectivePermute) {
        continue;  // Send has no output; anything else is not an hp op this build knows
      }
    }
    y.has_shape = true;
    fixed[out] = std::move(y);
    ++added;
  }
  return added;
}

}  // namespace hp::model

namespace hp::model {

int add_type_stubs(onnx::GraphProto& g, const ShapeMap& fixed, const ShapeMap& shapes, int opset) {
  std::vector<std::pair<std::string, std::int32_t>> stubs;
  const std::lock_guard<std::mutex> registry(onnx_registry_mutex());
  for (const auto& n : g.node()) {
    const std::string domain = n.domain() == "ai.onnx" ? "" : n.domain();
    if (onnx::OpSchemaRegistry::Schema(n.op_type(), domain.empty() ? opset : 1, domain)) continue;
    std::int32_t type = onnx::TensorProto::FLOAT;
    if (n.op_type() == domain::kRecv)
      type = static_cast<std::int32_t>(attr_int(n, std::string(domain::kAttrDtype), type));
    else if (n.input_size() > 0)
      if (auto it = shapes.find(n.input(0)); it != shapes.end() && it->second.elem_type != 0)
        type = it->second.elem_type;
    for (const auto& o : n.output())
      if (!o.empty() && !fixed.count(o)) stubs.emplace_back(o, type);
  }
  for (const auto& [name, type] : stubs) {
    auto* vi = g.add_value_info();
    vi->set_name(name);
    vi->mutable_type()->mutable_tensor_type()->set_elem_type(type);
  }
  return static_cast<int>(stubs.size());
}

}  // namespace hp::model
