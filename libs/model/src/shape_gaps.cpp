// Output shapes ONNX's inference (1.12) leaves incomplete although the inputs decide them, computed
// here the way fix_einsum_shapes (shape.cpp) does for Einsum. OneHot: the output is the indices'
// shape with `depth` inserted at `axis`, but ONNX reads depth only from an initializer, not from a
// Constant node or from shape arithmetic, which is what F.one_hot(x, num_classes) exports to.
#include "shape_infer.h"

namespace hp::model {
namespace {

bool fully_known(const ShapeMap& shapes, const std::string& name) {
  auto it = shapes.find(name);
  if (it == shapes.end() || !it->second.has_shape) return false;
  for (const auto& d : it->second.dims)
    if (!d.known()) return false;
  return true;
}

}  // namespace

int fix_onehot_shapes(const onnx::GraphProto& g, const ShapeMap& shapes, const ValueMap& values,
                      ShapeMap& fixed) {
  int added = 0;
  for (const auto& n : g.node()) {
    if (n.op_type() != "OneHot" || n.input_size() < 3 || n.output_size() == 0 ||
        fully_known(shapes, n.output(0)) || fixed.count(n.output(0)) ||
        !fully_known(shapes, n.input(0)))
      continue;
    auto depth = values.find(n.input(1));
    auto vals = shapes.find(n.input(2));
    if (depth == values.end() || depth->second.data.size() != 1 || vals == shapes.end()) continue;
    const double d = depth->second.data[0];
    if (d < 0 || d > 1e12) continue;  // ONNX rejects a negative depth; an absurd one is no shape
    std::vector<Dim> dims = shapes.at(n.input(0)).dims;
    auto rank = static_cast<std::int64_t>(dims.size()) + 1;
    std::int64_t axis = attr_int(n, "axis", -1);
    axis = axis < 0 ? axis + rank : axis;
    if (axis < 0 || axis >= rank) continue;
    dims.insert(dims.begin() + axis, Dim{static_cast<std::int64_t>(d), {}});
    ShapeInfo& out = fixed[n.output(0)];
    out.elem_type = vals->second.elem_type;
    out.has_shape = true;
    out.dims = std::move(dims);
    ++added;
  }
  return added;
}

}  // namespace hp::model
