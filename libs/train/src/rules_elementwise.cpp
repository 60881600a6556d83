// Gradient rules of the elementwise ops (docs/training.md): each input's gradient is the incoming
// gradient times the local derivative, reduced back to the input's shape where the forward
// broadcast it (GradCtx::sum_to).
#include <cmath>

#include "grad_ctx.h"

namespace hp::train::detail {

namespace {

constexpr double kPi = 3.14159265358979323846;

/// The gradient of a unary op from dY and the local derivative, if the input wants one.
Status unary(GradCtx& c, const std::string& local) {
  c.grad(0, c.op("Mul", {c.dout(0), local}));
  return {};
}

Status add(GradCtx& c) {
  for (int i = 0; i < 2; ++i)
    if (c.wants(i)) c.grad(i, c.sum_to(c.dout(0), c.in(i), c.out(0)));
  return {};
}

Status sub(GradCtx& c) {
  if (c.wants(0)) c.grad(0, c.sum_to(c.dout(0), c.in(0), c.out(0)));
  if (c.wants(1)) c.grad(1, c.sum_to(c.op("Neg", {c.dout(0)}), c.in(1), c.out(0)));
  return {};
}

Status mul(GradCtx& c) {
  for (int i = 0; i < 2; ++i)
    if (c.wants(i)) c.grad(i, c.sum_to(c.op("Mul", {c.dout(0), c.in(1 - i)}), c.in(i), c.out(0)));
  return {};
}

Status div(GradCtx& c) {
  if (c.wants(0)) c.grad(0, c.sum_to(c.op("Div", {c.dout(0), c.in(1)}), c.in(0), c.out(0)));
  if (c.wants(1)) {  // d(a/b)/db = -a/b^2 = -y/b
    std::string g = c.op("Neg", {c.op("Mul", {c.dout(0), c.op("Div", {c.out(0), c.in(1)})})});
    c.grad(1, c.sum_to(g, c.in(1), c.out(0)));
  }
  return {};
}

Status pow(GradCtx& c) {
  std::string b = c.in(1);
  if (c.elem_type(b) != c.elem_type(c.in(0)))
    b = c.op("Cast", {b}, {{"to", static_cast<std::int64_t>(c.elem_type(c.in(0)))}});
  if (c.wants(0)) {
    // A constant exponent (RMSNorm's and the decomposed LayerNorm's x^2) needs no Sub and, for 2,
    // no Pow: e x^(e-1) with e-1 folded.
    std::string local;
    if (auto e = c.const_scalar(c.in(1)); e && c.elem_type(c.in(1)) == c.elem_type(c.in(0))) {
      if (*e == 2.0)
        local = c.op("Mul", {c.in(0), c.scalar(2.0, c.in(0))});
      else if (*e == 1.0)
        local = c.op("Expand", {c.scalar(1.0, c.in(0)), c.shape_of(c.in(0))});
      else
        local = c.op("Mul",
                     {c.op("Pow", {c.in(0), c.scalar(*e - 1.0, c.in(0))}), c.scalar(*e, c.in(0))});
    } else {
      local = c.op("Mul", {b, c.op("Pow", {c.in(0), c.op("Sub", {b, c.scalar(1.0, c.in(0))})})});
    }
    c.grad(0, c.sum_to(c.op("Mul", {c.dout(0), local}), c.in(0), c.out(0)));
  }
  if (c.wants(1)) {
    std::string g = c.op("Mul", {c.dout(0), c.op("Mul", {c.out(0), c.op("Log", {c.in(0)})})});
    c.grad(1, c.sum_to(g, c.in(1), c.out(0)));
  }
  return {};
}

Status where(GradCtx& c) {
  std::string zero = c.scalar(0.0, c.out(0));
  if (c.wants(1)) c.grad(1, c.sum_to(c.op("Where", {c.in(0), c.dout(0), zero}), c.in(1), c.out(0)));
  if (c.wants(2)) c.grad(2, c.sum_to(c.op("Where", {c.in(0), zero, c.dout(0)}), c.in(2), c.out(0)));
  return {};
}

Status relu(GradCtx& c) {
  std::string zero = c.scalar(0.0, c.out(0));
  c.grad(0, c.op("Where", {c.op("Greater", {c.out(0), zero}), c.dout(0), zero}));
  return {};
}

Status leaky_relu(GradCtx& c) {
  std::string zero = c.scalar(0.0, c.in(0));
  std::string scaled = c.op("Mul", {c.dout(0), c.scalar(c.attr_f("alpha", 0.01), c.in(0))});
  c.grad(0, c.op("Where", {c.op("Greater", {c.in(0), zero}), c.dout(0), scaled}));
  return {};
}

Status erf(GradCtx& c) {  // 2/sqrt(pi) exp(-x^2)
  std::string e = c.op("Exp", {c.op("Neg", {c.op("Mul", {c.in(0), c.in(0)})})});
  return unary(c, c.op("Mul", {e, c.scalar(2.0 / std::sqrt(kPi), c.in(0))}));
}

Status gelu(GradCtx& c) {
  const std::string& x = c.in(0);
  if (c.attr_s("approximate", "none") == "tanh") {
    // y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
    const double k = std::sqrt(2.0 / kPi);
    std::string x2 = c.op("Mul", {x, x});
    std::string u =
        c.op("Mul", {c.op("Add", {x, c.op("Mul", {c.op("Mul", {x2, x}), c.scalar(0.044715, x)})}),
                     c.scalar(k, x)});
    std::string t = c.op("Tanh", {u});
    std::string du = c.op(
        "Mul", {c.scalar(k, x),
                c.op("Add", {c.scalar(1.0, x), c.op("Mul", {x2, c.scalar(3 * 0.044715, x)})})});
    std::string sech2 = c.op("Sub", {c.scalar(1.0, x), c.op("Mul", {t, t})});
    std::string local =
        c.op("Add", {c.op("Mul", {c.scalar(0.5, x), c.op("Add", {c.scalar(1.0, x), t})}),
                     c.op("Mul", {c.op("Mul", {c.scalar(0.5, x), x}), c.op("Mul", {sech2, du})})});
    return unary(c, local);
  }
  // Phi(x) + x phi(x)
  std::string cdf = c.op(
      "Mul", {c.scalar(0.5, x),
              c.op("Add", {c.scalar(1.0, x),
                           c.op("Erf", {c.op("Mul", {x, c.scalar(1.0 / std::sqrt(2.0), x)})})})});
  std::string pdf =
      c.op("Mul", {c.op("Exp", {c.op("Mul", {c.op("Mul", {x, x}), c.scalar(-0.5, x)})}),
                   c.scalar(1.0 / std::sqrt(2.0 * kPi), x)});
  return unary(c, c.op("Add", {cdf, c.op("Mul", {x, pdf})}));
}

Status clip(GradCtx& c) {
  std::string keep;
  if (!c.in(1).empty()) keep = c.op("GreaterOrEqual", {c.in(0), c.in(1)});
  if (!c.in(2).empty()) {
    std::string hi = c.op("LessOrEqual", {c.in(0), c.in(2)});
    keep = keep.empty() ? hi : c.op("And", {keep, hi});
  }
  if (keep.empty()) {
    c.grad(0, c.dout(0));
    return {};
  }
  c.grad(0, c.op("Where", {keep, c.dout(0), c.scalar(0.0, c.in(0))}));
  return {};
}

Status min_max(GradCtx& c) {
  // The gradient goes to the inputs equal to the result (torch splits ties between two tensors;
  // here each tied input receives it).
  for (int i = 0; i < c.n_in(); ++i)
    if (c.wants(i)) {
      std::string hit = c.op("Equal", {c.in(i), c.out(0)});
      std::string g = c.op("Where", {hit, c.dout(0), c.scalar(0.0, c.out(0))});
      c.grad(i, c.sum_to(g, c.in(i), c.out(0)));
    }
  return {};
}

Status dropout(GradCtx& c) {
  if (c.out(1).empty()) {  // inference form: y = x
    c.grad(0, c.dout(0));
    return {};
  }
  std::string ratio = c.in(1).empty() ? c.scalar(c.attr_f("ratio", 0.5), c.in(0)) : c.in(1);
  if (c.elem_type(ratio) != c.elem_type(c.in(0)))
    ratio = c.op("Cast", {ratio}, {{"to", static_cast<std::int64_t>(c.elem_type(c.in(0)))}});
  std::string one = c.scalar(1.0, c.in(0));
  std::string scale = c.op("Div", {one, c.op("Sub", {one, ratio})});
  // Outside training mode Dropout is the identity (mask all true): scale 1.
  if (!c.in(2).empty()) scale = c.op("Where", {c.in(2), scale, one});
  std::string g =
      c.op("Where", {c.out(1), c.op("Mul", {c.dout(0), scale}), c.scalar(0.0, c.in(0))});
  c.grad(0, g);
  return {};
}

Status cast(GradCtx& c) {
  c.grad(0, c.op("Cast", {c.dout(0)}, {{"to", static_cast<std::int64_t>(c.elem_type(c.in(0)))}}));
  return {};
}

}  // namespace

void register_elementwise_rules(RuleTable& t) {
  t["Add"] = add;
  t["Sub"] = sub;
  t["Mul"] = mul;
  t["Div"] = div;
  t["Pow"] = pow;
  t["Where"] = where;
  t["Relu"] = relu;
  t["LeakyRelu"] = leaky_relu;
  t["Erf"] = erf;
  t["Gelu"] = gelu;
  t["Clip"] = clip;
  t["Max"] = min_max;
  t["Min"] = min_max;
  t["Dropout"] = dropout;
  t["Cast"] = cast;
  t["Identity"] = [](GradCtx& c) -> Status {
    // An entry of a tensor-parallel region (GradSpec::tp): every member computed its part of the
    // gradient from its slice of the region, so the whole gradient is their sum.
    if (const auto* group = c.reduce_group(c.out(0)))
      return c.grad(0, all_reduce(c, c.dout(0), *group)), Status{};
    c.grad(0, c.dout(0));
    return {};
  };
  t["Neg"] = [](GradCtx& c) -> Status {
    c.grad(0, c.op("Neg", {c.dout(0)}));
    return {};
  };
  t["Sqrt"] = [](GradCtx& c) {  // 1 / (2 y)
    return unary(c, c.op("Reciprocal", {c.op("Mul", {c.out(0), c.scalar(2.0, c.out(0))})}));
  };
  t["Reciprocal"] = [](GradCtx& c) {  // -y^2
    return unary(c, c.op("Neg", {c.op("Mul", {c.out(0), c.out(0)})}));
  };
  t["Exp"] = [](GradCtx& c) { return unary(c, c.out(0)); };
  t["Log"] = [](GradCtx& c) -> Status {
    c.grad(0, c.op("Div", {c.dout(0), c.in(0)}));
    return {};
  };
  t["Tanh"] = [](GradCtx& c) {  // 1 - y^2
    return unary(c, c.op("Sub", {c.scalar(1.0, c.out(0)), c.op("Mul", {c.out(0), c.out(0)})}));
  };
  t["Sigmoid"] = [](GradCtx& c) {  // y (1 - y)
    return unary(c, c.op("Mul", {c.out(0), c.op("Sub", {c.scalar(1.0, c.out(0)), c.out(0)})}));
  };
  t["Abs"] = [](GradCtx& c) { return unary(c, c.op("Sign", {c.in(0)})); };
  t["Sin"] = [](GradCtx& c) { return unary(c, c.op("Cos", {c.in(0)})); };
  t["Cos"] = [](GradCtx& c) { return unary(c, c.op("Neg", {c.op("Sin", {c.in(0)})})); };
  t["Softplus"] = [](GradCtx& c) { return unary(c, c.op("Sigmoid", {c.in(0)})); };
  t["Sum"] = [](GradCtx& c) -> Status {
    for (int i = 0; i < c.n_in(); ++i)
      if (c.wants(i)) c.grad(i, c.sum_to(c.dout(0), c.in(i), c.out(0)));
    return {};
  };
}

bool cuts_gradient(const std::string& op) {
  static const char* const kCut[] = {"Floor",
                                     "Ceil",
                                     "Round",
                                     "Sign",
                                     "RandomNormalLike",
                                     "RandomUniformLike",
                                     "Bernoulli",
                                     "EyeLike",
                                     "ConstantOfShape",
                                     "Shape",
                                     "Size",
                                     "ArgMax",
                                     "ArgMin",
                                     "NonZero",
                                     "IsNaN",
                                     "IsInf",
                                     "Range",
                                     "OneHot",
                                     "RandomNormal",
                                     "RandomUniform"};
  for (const char* k : kCut)
    if (op == k) return true;
  return false;
}

const RuleTable& rules() {
  static const RuleTable table = [] {
    RuleTable t;
    register_elementwise_rules(t);
    register_shape_rules(t);
    register_linalg_rules(t);
    register_nn_rules(t);
    register_reduce_rules(t);
    register_activation_rules(t);
    register_recurrent_rules(t);
    register_comm_rules(t);
    return t;
  }();
  return table;
}

}  // namespace hp::train::detail
