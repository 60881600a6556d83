// Evaluating the shape arithmetic exporters write into graphs.
//
// PyTorch's exporter turns `x.view(b, t, h, d)` with dynamic axes into Shape -> Gather -> Unsqueeze
// -> Concat -> Reshape, often with Cast and Div in between (`c // heads`), and `torch.arange(t)`
// into a Range over Cast(Gather(Shape(x))). ONNX's own data propagation (1.12) covers only a few of
// these ops, so once the symbolic dims are bound most Reshape outputs would still have unknown
// shapes and every FLOP downstream would be lost. This file is a tiny interpreter for that
// arithmetic: it computes the values of small integer (and float scalar) tensors from constants and
// the shapes known so far. shape.cpp then pins those values into the graph as initializers and
// reruns ONNX inference, which knows how to use constant shape inputs.
//
// Only small tensors (<= kMaxElems elements) are evaluated; anything else, or any op not listed
// here, simply has no value, which is always safe: its consumers keep their unknown shapes.
#include <cmath>
#include <functional>

#include "shape_infer.h"
#include "values_arith.h"

namespace hp::model {
namespace {

using T = onnx::TensorProto;
using namespace shape_values;

struct Evaluator {
  const ShapeMap& shapes;
  int opset;
  ValueMap values;

  const Value* get(const onnx::NodeProto& n, int i) const {
    if (i >= n.input_size() || n.input(i).empty()) return nullptr;
    auto it = values.find(n.input(i));
    return it == values.end() ? nullptr : &it->second;
  }
  std::vector<std::int64_t> ints(const Value& v) const {
    std::vector<std::int64_t> out;
    for (double d : v.data) out.push_back(saturate_i64(d));
    return out;
  }

  // The value of node `n`'s first output, or nullopt (always safe: its consumers keep unknown
  // shapes). Dispatches to one helper per family of ops.
  std::optional<Value> eval(const onnx::NodeProto& n) {
    const std::string& op = n.op_type();
    if (op == "Constant") return eval_constant(n);
    if (op == "Shape" || op == "Size") return eval_shape(n);
    const Value* a = get(n, 0);
    if (!a) return std::nullopt;
    if (op == "Identity" || op == "Cast") return eval_cast(n, *a);
    if (op == "Neg" || op == "Floor" || op == "Ceil" || op == "Abs" || op == "Sqrt" || op == "Not")
      return eval_unary(op, *a);
    if (op == "Unsqueeze" || op == "Squeeze") return eval_squeeze(n, *a);
    if (op == "Concat") return eval_concat(n, *a);
    if (op == "Gather") return eval_gather(n, *a);
    if (op == "Slice") return eval_slice(n, *a);
    if (op == "Range") return eval_range(n, *a);
    if (op == "ConstantOfShape") return eval_constant_of_shape(n, *a);
    if (op == "Reshape") return eval_reshape(n, *a);
    if (op == "Expand") return eval_expand(n, *a);
    if (op == "ReduceProd" || op == "ReduceSum" || op == "ReduceMax" || op == "ReduceMin")
      return eval_reduce(n, *a);
    const Value* b = get(n, 1);
    if (!b) return std::nullopt;
    if (op == "Where") return eval_where(n, *a, *b);
    // Max, Min and Sum are variadic: fold the inputs left to right.
    std::optional<Value> r = eval_binary(op == "Sum" ? "Add" : op, *a, *b);
    for (int i = 2; r && i < n.input_size() && (op == "Max" || op == "Min" || op == "Sum"); ++i) {
      const Value* c = get(n, i);
      r = c ? eval_binary(op == "Sum" ? "Add" : op, *r, *c) : std::nullopt;
    }
    return r;
  }

  // Constant nodes carry their value in an attribute: a small tensor or a scalar/list form.
  std::optional<Value> eval_constant(const onnx::NodeProto& n) const {
    if (const auto* t = attr_tensor(n, "value")) {
      auto data = read_small_tensor(*t, kMaxElems);
      if (!data) return std::nullopt;
      return Value{{t->dims().begin(), t->dims().end()}, *data, t->data_type()};
    }
    for (const auto& at : n.attribute()) {
      if (at.name() == "value_int") return Value{{}, {static_cast<double>(at.i())}, T::INT64};
      if (at.name() == "value_ints") {
        Value v{{at.ints_size()}, {}, T::INT64};
        for (auto x : at.ints()) v.data.push_back(static_cast<double>(x));
        return v;
      }
      if (at.name() == "value_float") return Value{{}, {at.f()}, T::FLOAT};
    }
    return std::nullopt;
  }

  // Shape/Size read the shapes inferred so far, which is where every exporter's shape arithmetic
  // starts; known only when every dim of the input is.
  std::optional<Value> eval_shape(const onnx::NodeProto& n) const {
    auto it = shapes.find(n.input(0));
    if (it == shapes.end() || !it->second.has_shape) return std::nullopt;
    std::vector<double> dims;
    for (const auto& d : it->second.dims) {
      if (!d.known()) return std::nullopt;
      dims.push_back(static_cast<double>(d.value));
    }
    if (n.op_type() == "Size") {
      double p = 1;
      for (double d : dims) p *= d;
      return Value{{}, {p}, T::INT64};
    }
    auto r = static_cast<std::int64_t>(dims.size());
    std::int64_t s = std::clamp<std::int64_t>(wrap(attr_int(n, "start", 0), r), 0, r);
    std::int64_t e = std::clamp<std::int64_t>(wrap(attr_int(n, "end", r), r), 0, r);
    Value v{{std::max<std::int64_t>(0, e - s)}, {}, T::INT64};
    for (std::int64_t i = s; i < e; ++i) v.data.push_back(dims[static_cast<std::size_t>(i)]);
    return v;
  }

  // Identity and Cast: the same values, Cast rounding them to the target type (`c // heads` is
  // often a float division cast back to int64).
  std::optional<Value> eval_cast(const onnx::NodeProto& n, const Value& a) const {
    if (n.op_type() == "Identity") return a;
    Value r = a;
    r.elem_type = static_cast<std::int32_t>(attr_int(n, "to", T::INT64));
    for (auto& d : r.data) d = cast_to(d, r.elem_type);
    return r;
  }

  // Elementwise unary math on every element.
  static std::optional<Value> eval_unary(const std::string& op, const Value& a) {
    Value r = a;
    for (auto& d : r.data)
      d = op == "Neg"     ? -d
          : op == "Floor" ? std::floor(d)
          : op == "Ceil"  ? std::ceil(d)
          : op == "Abs"   ? std::fabs(d)
          : op == "Not"   ? (d == 0)
                          : std::sqrt(d);
    return r;
  }

  // Unsqueeze/Squeeze change only the shape; their axes are an input from opset 13, an attribute
  // before.
  std::optional<Value> eval_squeeze(const onnx::NodeProto& n, const Value& a) const {
    const Value* b = get(n, 1);
    std::vector<std::int64_t> axes =
        opset >= 13 ? (b ? ints(*b) : std::vector<std::int64_t>{}) : attr_ints(n, "axes");
    Value r = a;
    r.shape.clear();
    if (n.op_type() == "Unsqueeze") {
      auto rank = static_cast<std::int64_t>(a.shape.size() + axes.size());
      std::vector<bool> is_new(static_cast<std::size_t>(rank), false);
      for (auto ax : axes) {
        std::int64_t i = wrap(ax, rank);
        if (i < 0 || i >= rank || is_new[static_cast<std::size_t>(i)]) return std::nullopt;
        is_new[static_cast<std::size_t>(i)] = true;
      }
      std::size_t k = 0;
      for (std::int64_t i = 0; i < rank; ++i)
        r.shape.push_back(is_new[static_cast<std::size_t>(i)] ? 1 : a.shape[k++]);
    } else {
      auto rank = static_cast<std::int64_t>(a.shape.size());
      for (std::int64_t i = 0; i < rank; ++i) {
        bool drop = axes.empty() ? a.shape[static_cast<std::size_t>(i)] == 1 : false;
        for (auto ax : axes) drop = drop || wrap(ax, rank) == i;
        if (!drop) r.shape.push_back(a.shape[static_cast<std::size_t>(i)]);
      }
    }
    return r;
  }

  // Concat of 1-D values: how exporters assemble a Reshape target from its pieces.
  std::optional<Value> eval_concat(const onnx::NodeProto& n, const Value& a) const {
    Value r{{0}, {}, a.elem_type};
    for (int i = 0; i < n.input_size(); ++i) {
      const Value* v = get(n, i);
      if (!v || v->shape.size() != 1) return std::nullopt;
      r.data.insert(r.data.end(), v->data.begin(), v->data.end());
    }
    r.shape[0] = static_cast<std::int64_t>(r.data.size());
    return r;
  }

  // Gather from a 1-D value: picking dims out of a Shape.
  std::optional<Value> eval_gather(const onnx::NodeProto& n, const Value& a) const {
    const Value* b = get(n, 1);
    if (!b || a.shape.size() != 1 || wrap(attr_int(n, "axis", 0), 1) != 0) return std::nullopt;
    Value r{b->shape, {}, a.elem_type};
    for (double idx : b->data) {
      auto i = wrap(saturate_i64(idx), a.shape[0]);
      if (i < 0 || i >= a.shape[0]) return std::nullopt;
      r.data.push_back(a.data[static_cast<std::size_t>(i)]);
    }
    return r;
  }

  // 1-D Slice of a value; starts/ends/steps are inputs from opset 10, attributes before.
  std::optional<Value> eval_slice(const onnx::NodeProto& n, const Value& a) const {
    std::vector<std::int64_t> starts, ends, steps;
    if (opset >= 10) {
      const Value* s = get(n, 1);
      const Value* e = get(n, 2);
      const Value* st = get(n, 4);
      if (!s || !e || (n.input_size() > 4 && !n.input(4).empty() && !st)) return std::nullopt;
      starts = ints(*s), ends = ints(*e);
      if (st) steps = ints(*st);
    } else {
      starts = attr_ints(n, "starts"), ends = attr_ints(n, "ends");
    }
    if (starts.size() != 1 || ends.size() != 1) return std::nullopt;
    return slice_1d(a, starts[0], ends[0], steps.empty() ? 1 : steps[0]);
  }

  // Range over scalars: `torch.arange(t)` in exported graphs.
  std::optional<Value> eval_range(const onnx::NodeProto& n, const Value& a) const {
    const Value* b = get(n, 1);
    const Value* d = get(n, 2);
    if (!b || !d || a.data.size() != 1 || b->data.size() != 1 || d->data.size() != 1 ||
        d->data[0] == 0)
      return std::nullopt;
    double count = std::max(0.0, std::ceil((b->data[0] - a.data[0]) / d->data[0]));
    if (count > kMaxElems) return std::nullopt;
    Value r{{static_cast<std::int64_t>(count)}, {}, a.elem_type};
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(count); ++i)
      r.data.push_back(a.data[0] + static_cast<double>(i) * d->data[0]);
    return r;
  }

  // ConstantOfShape of a small shape, filled with the attribute's value (0.0f by default).
  std::optional<Value> eval_constant_of_shape(const onnx::NodeProto& n, const Value& a) const {
    std::vector<std::int64_t> shape = ints(a);
    if (!small_shape(shape)) return std::nullopt;
    double fill = 0;
    std::int32_t type = T::FLOAT;
    if (const auto* t = attr_tensor(n, "value")) {
      auto data = read_small_tensor(*t, 1);
      if (!data || data->empty()) return std::nullopt;
      fill = (*data)[0];
      type = t->data_type();
    }
    return Value{shape, std::vector<double>(static_cast<std::size_t>(numel_of(shape)), fill), type};
  }

  // Reshape of a value, with ONNX's 0 (copy the dim) and -1 (infer it) in the target.
  std::optional<Value> eval_reshape(const onnx::NodeProto& n, const Value& a) const {
    const Value* b = get(n, 1);
    if (!b) return std::nullopt;
    std::vector<std::int64_t> shape = ints(*b);
    for (auto d : shape)
      if (d < -1 || d > kMaxElems) return std::nullopt;
    std::int64_t known = 1, infer = -1;
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] == 0 && i < a.shape.size()) shape[i] = a.shape[i];
      if (shape[i] == -1)
        infer = static_cast<std::int64_t>(i);
      else
        known *= shape[i];
      if (known > kMaxElems) return std::nullopt;
    }
    if (infer >= 0) shape[static_cast<std::size_t>(infer)] = known ? numel_of(a.shape) / known : 0;
    if (!small_shape(shape) || numel_of(shape) != numel_of(a.shape)) return std::nullopt;
    Value r = a;
    r.shape = shape;
    return r;
  }

  // Expand: numpy broadcasting of the value to the shape input (repeat counts, masks of ones).
  std::optional<Value> eval_expand(const onnx::NodeProto& n, const Value& a) const {
    const Value* b = get(n, 1);
    if (!b) return std::nullopt;
    std::vector<std::int64_t> target = ints(*b);
    // The product, not just each dim, must be small before anything is allocated: [4096]*6 is
    // 2^72 elements.
    if (!small_shape(target)) return std::nullopt;
    Value shape_only{target, std::vector<double>(static_cast<std::size_t>(numel_of(target)), 0),
                     a.elem_type};
    return binary(a, shape_only, a.elem_type, [](double x, double) { return x; });
  }

  // Reductions over a whole small value or some of its axes (ReduceProd of a shape slice is how
  // exporters compute a flattened dim); axes are an input from opset 18 (13 for ReduceSum).
  std::optional<Value> eval_reduce(const onnx::NodeProto& n, const Value& a) const {
    const std::string& op = n.op_type();
    bool axes_input = opset >= 18 || (op == "ReduceSum" && opset >= 13);
    std::vector<std::int64_t> axes = attr_ints(n, "axes");
    if (axes_input && n.input_size() > 1 && !n.input(1).empty()) {
      const Value* b = get(n, 1);
      if (!b) return std::nullopt;
      axes = ints(*b);
    }
    bool keep = attr_int(n, "keepdims", 1) != 0;
    auto rank = static_cast<std::int64_t>(a.shape.size());
    std::vector<bool> reduced(a.shape.size(), axes.empty());
    if (axes.empty() && axes_input && attr_int(n, "noop_with_empty_axes", 0) != 0) return a;
    for (auto ax : axes) {
      std::int64_t i = wrap(ax, rank);
      if (i < 0 || i >= rank) return std::nullopt;
      reduced[static_cast<std::size_t>(i)] = true;
    }
    Value r{{}, {}, a.elem_type};
    std::vector<std::int64_t> kept;  // the output shape with reduced dims as 1
    for (std::size_t i = 0; i < a.shape.size(); ++i) {
      kept.push_back(reduced[i] ? 1 : a.shape[i]);
      if (!reduced[i] || keep) r.shape.push_back(reduced[i] ? 1 : a.shape[i]);
    }
    double init = op == "ReduceProd"  ? 1
                  : op == "ReduceMax" ? -HUGE_VAL
                  : op == "ReduceMin" ? HUGE_VAL
                                      : 0;
    r.data.assign(static_cast<std::size_t>(numel_of(kept)), init);
    for (std::int64_t i = 0; i < numel_of(a.shape); ++i) {
      // Output index of input element i: its coordinates with the reduced ones set to 0.
      std::int64_t rest = i, out = 0, stride = 1;
      for (std::size_t k = a.shape.size(); k-- > 0;) {
        std::int64_t c = rest % a.shape[k];
        rest /= a.shape[k];
        if (!reduced[k]) out += c * stride;
        stride *= kept[k];
      }
      double& acc = r.data[static_cast<std::size_t>(out)];
      double x = a.data[static_cast<std::size_t>(i)];
      acc = op == "ReduceProd"  ? acc * x
            : op == "ReduceMax" ? std::max(acc, x)
            : op == "ReduceMin" ? std::min(acc, x)
                                : acc + x;
    }
    return r;
  }

  // Split of a 1-D value into its outputs (all of them, unlike the other ops here); sizes are an
  // input from opset 13, an attribute before, else equal parts.
  void eval_split(const onnx::NodeProto& n) {
    const Value* a = get(n, 0);
    if (!a || a->shape.size() != 1 || wrap(attr_int(n, "axis", 0), 1) != 0) return;
    std::vector<std::int64_t> sizes = attr_ints(n, "split");
    if (opset >= 13 && n.input_size() > 1 && !n.input(1).empty()) {
      const Value* b = get(n, 1);
      if (!b) return;
      sizes = ints(*b);
    }
    const auto outs = static_cast<std::int64_t>(n.output_size());
    if (sizes.empty()) {
      if (outs == 0 || a->shape[0] % outs != 0) return;
      sizes.assign(static_cast<std::size_t>(outs), a->shape[0] / outs);
    }
    if (static_cast<std::int64_t>(sizes.size()) != outs) return;
    std::int64_t at = 0;
    for (int o = 0; o < n.output_size(); ++o) {
      std::int64_t len = sizes[static_cast<std::size_t>(o)];
      if (len < 0 || at + len > a->shape[0]) return;
      Value v{{len}, {a->data.begin() + at, a->data.begin() + at + len}, a->elem_type};
      at += len;
      if (!n.output(o).empty()) values[n.output(o)] = std::move(v);
    }
  }

  // Broadcasting binary arithmetic and comparisons; integer division truncates like the
  // exporters' `//`, and division or modulo by zero gives 0 rather than a trap.
  static std::optional<Value> eval_binary(const std::string& op, const Value& a, const Value& b) {
    bool is_int = is_int_type(a.elem_type);
    if (op == "Add") return binary(a, b, a.elem_type, [](double x, double y) { return x + y; });
    if (op == "Sub") return binary(a, b, a.elem_type, [](double x, double y) { return x - y; });
    if (op == "Mul") return binary(a, b, a.elem_type, [](double x, double y) { return x * y; });
    if (op == "Div")
      return binary(a, b, a.elem_type, [is_int](double x, double y) {
        if (y == 0) return 0.0;
        return is_int ? std::trunc(x / y) : x / y;
      });
    if (op == "Pow")
      return binary(a, b, a.elem_type, [](double x, double y) { return std::pow(x, y); });
    if (op == "Max")
      return binary(a, b, a.elem_type, [](double x, double y) { return std::max(x, y); });
    if (op == "Min")
      return binary(a, b, a.elem_type, [](double x, double y) { return std::min(x, y); });
    if (op == "Mod")
      return binary(a, b, a.elem_type,
                    [](double x, double y) { return y == 0 ? 0 : std::fmod(x, y); });
    if (op == "Equal")
      return binary(a, b, T::BOOL, [](double x, double y) { return x == y ? 1.0 : 0.0; });
    if (op == "Less")
      return binary(a, b, T::BOOL, [](double x, double y) { return x < y ? 1.0 : 0.0; });
    if (op == "Greater")
      return binary(a, b, T::BOOL, [](double x, double y) { return x > y ? 1.0 : 0.0; });
    if (op == "LessOrEqual")
      return binary(a, b, T::BOOL, [](double x, double y) { return x <= y ? 1.0 : 0.0; });
    if (op == "GreaterOrEqual")
      return binary(a, b, T::BOOL, [](double x, double y) { return x >= y ? 1.0 : 0.0; });
    if (op == "And")
      return binary(a, b, T::BOOL, [](double x, double y) { return x != 0 && y != 0 ? 1.0 : 0.0; });
    if (op == "Or")
      return binary(a, b, T::BOOL, [](double x, double y) { return x != 0 || y != 0 ? 1.0 : 0.0; });
    return std::nullopt;
  }

  // Where: cond ? x : y, with all three broadcast to one shape.
  std::optional<Value> eval_where(const onnx::NodeProto& n, const Value& a, const Value& b) const {
    const Value* c = get(n, 2);
    if (!c) return std::nullopt;
    auto xy = binary(b, *c, b.elem_type, [](double x, double) { return x; });
    if (!xy) return std::nullopt;
    Value r;
    for (const Value* v : {&a, &b, c})
      if (!small_shape(v->shape) || numel_of(v->shape) != static_cast<std::int64_t>(v->data.size()))
        return std::nullopt;
    if (!broadcast_shape(a.shape, xy->shape, r.shape) || !small_shape(r.shape)) return std::nullopt;
    r.elem_type = b.elem_type;
    for (std::int64_t i = 0; i < numel_of(r.shape); ++i)
      r.data.push_back(a.data[bcast_index(a.shape, r.shape, i)] != 0
                           ? b.data[bcast_index(b.shape, r.shape, i)]
                           : c->data[bcast_index(c->shape, r.shape, i)]);
    return r;
  }
};

}  // namespace

ValueMap evaluate_shape_values(const onnx::GraphProto& graph, const ShapeMap& shapes, int opset) {
  Evaluator ev{shapes, opset, {}};
  for (const auto& t : graph.initializer()) {
    if (t.data_location() == T::EXTERNAL) continue;
    std::vector<std::int64_t> dims(t.dims().begin(), t.dims().end());
    if (!small_shape(dims)) continue;  // [2^32, 2^32, 0] holds 0 values but no small shape
    if (auto data = read_small_tensor(t, kMaxElems))
      ev.values[t.name()] =
          Value{{t.dims().begin(), t.dims().end()}, std::move(*data), t.data_type()};
  }
  for (const auto& n : graph.node()) {
    if (n.output_size() == 0 || n.output(0).empty()) continue;
    if (n.op_type() == "Split") {
      ev.eval_split(n);
      continue;
    }
    auto v = ev.eval(n);
    // small_shape first: a shape like [2^32, 2^32] has a wrapped numel of 0 that an empty value
    // would match, and every consumer indexes the data by the shape.
    if (v && small_shape(v->shape) &&
        numel_of(v->shape) == static_cast<std::int64_t>(v->data.size()))
      ev.values[n.output(0)] = std::move(*v);
  }
  return std::move(ev.values);
}

}  // namespace hp::model
