// Gradient rules of the remaining pointwise ops PyTorch exports (docs/training.md, "Gradient
// rules"): the trigonometric and hyperbolic functions, the activations with a piecewise or
// parametric derivative (ELU, CELU, SELU, hard sigmoid and swish, Mish, softsign, thresholded
// ReLU, shrink, PReLU), the variadic Mean, CastLike, CumSum and Trilu. Each derivative is written
// with ONNX ops so every backend runs it, and matches PyTorch's at the kinks (the value torch's
// backward formula gives there, e.g. hardswish's at x = 3).
#include "grad_ctx.h"

namespace hp::train::detail {

namespace {

/// dY times the local derivative `local` (both x's shape).
Status times(GradCtx& c, const std::string& local) {
  c.grad(0, c.op("Mul", {c.dout(0), local}));
  return {};
}

/// 1 / sqrt(v), v written from x.
std::string rsqrt(GradCtx& c, const std::string& v) {
  return c.op("Reciprocal", {c.op("Sqrt", {v})});
}

std::string square(GradCtx& c, const std::string& x) { return c.op("Mul", {x, x}); }

/// dY where `keep` holds, else `other` (0 when empty).
Status select(GradCtx& c, const std::string& keep, const std::string& other = "") {
  const std::string& x = c.in(0);
  c.grad(0, c.op("Where", {keep, c.dout(0), other.empty() ? c.scalar(0.0, x) : other}));
  return {};
}

void register_trig(RuleTable& t) {
  t["Tan"] = [](GradCtx& c) {  // 1 + y^2
    return times(c, c.op("Add", {c.scalar(1.0, c.out(0)), square(c, c.out(0))}));
  };
  t["Asin"] = [](GradCtx& c) {  // 1 / sqrt(1 - x^2)
    return times(c, rsqrt(c, c.op("Sub", {c.scalar(1.0, c.in(0)), square(c, c.in(0))})));
  };
  t["Acos"] = [](GradCtx& c) {  // -1 / sqrt(1 - x^2)
    return times(
        c, c.op("Neg", {rsqrt(c, c.op("Sub", {c.scalar(1.0, c.in(0)), square(c, c.in(0))}))}));
  };
  t["Atan"] = [](GradCtx& c) {  // 1 / (1 + x^2)
    return times(c,
                 c.op("Reciprocal", {c.op("Add", {c.scalar(1.0, c.in(0)), square(c, c.in(0))})}));
  };
  t["Sinh"] = [](GradCtx& c) { return times(c, c.op("Cosh", {c.in(0)})); };
  t["Cosh"] = [](GradCtx& c) { return times(c, c.op("Sinh", {c.in(0)})); };
  t["Asinh"] = [](GradCtx& c) {  // 1 / sqrt(x^2 + 1)
    return times(c, rsqrt(c, c.op("Add", {square(c, c.in(0)), c.scalar(1.0, c.in(0))})));
  };
  t["Acosh"] = [](GradCtx& c) {  // 1 / sqrt(x^2 - 1)
    return times(c, rsqrt(c, c.op("Sub", {square(c, c.in(0)), c.scalar(1.0, c.in(0))})));
  };
  t["Atanh"] = [](GradCtx& c) {  // 1 / (1 - x^2)
    return times(c,
                 c.op("Reciprocal", {c.op("Sub", {c.scalar(1.0, c.in(0)), square(c, c.in(0))})}));
  };
}

Status elu(GradCtx& c) {  // x > 0: 1, else y + alpha (= alpha e^x)
  const std::string& x = c.in(0);
  const std::string neg =
      c.op("Mul", {c.dout(0), c.op("Add", {c.out(0), c.scalar(c.attr_f("alpha", 1.0), x)})});
  return select(c, c.op("Greater", {x, c.scalar(0.0, x)}), neg);
}

Status celu(GradCtx& c) {  // x > 0: 1, else exp(x / alpha)
  const std::string& x = c.in(0);
  const std::string e = c.op("Exp", {c.op("Div", {x, c.scalar(c.attr_f("alpha", 1.0), x)})});
  return select(c, c.op("Greater", {x, c.scalar(0.0, x)}), c.op("Mul", {c.dout(0), e}));
}

Status selu(GradCtx& c) {  // gamma (x > 0: 1, else alpha e^x)
  const std::string& x = c.in(0);
  const double alpha = c.attr_f("alpha", 1.67326319217681884765625);
  const double gamma = c.attr_f("gamma", 1.05070102214813232421875);
  const std::string dy = c.op("Mul", {c.dout(0), c.scalar(gamma, x)});
  const std::string neg = c.op("Mul", {dy, c.op("Mul", {c.op("Exp", {x}), c.scalar(alpha, x)})});
  c.grad(0, c.op("Where", {c.op("Greater", {x, c.scalar(0.0, x)}), dy, neg}));
  return {};
}

Status hard_sigmoid(GradCtx& c) {  // alpha inside the ramp 0 < alpha x + beta < 1, else 0
  const std::string& x = c.in(0);
  const double alpha = c.attr_f("alpha", 0.2);
  const std::string z =
      c.op("Add", {c.op("Mul", {x, c.scalar(alpha, x)}), c.scalar(c.attr_f("beta", 0.5), x)});
  const std::string inside =
      c.op("And", {c.op("Greater", {z, c.scalar(0.0, x)}), c.op("Less", {z, c.scalar(1.0, x)})});
  return times(c, c.op("Where", {inside, c.scalar(alpha, x), c.scalar(0.0, x)}));
}

Status hard_swish(GradCtx& c) {  // torch: x < -3: 0, x <= 3: x / 3 + 1/2, else 1
  const std::string& x = c.in(0);
  const std::string ramp = c.op("Add", {c.op("Div", {x, c.scalar(3.0, x)}), c.scalar(0.5, x)});
  const std::string upper =
      c.op("Where", {c.op("LessOrEqual", {x, c.scalar(3.0, x)}), ramp, c.scalar(1.0, x)});
  return times(c, c.op("Where", {c.op("Less", {x, c.scalar(-3.0, x)}), c.scalar(0.0, x), upper}));
}

Status mish(GradCtx& c) {  // y = x tanh(sp), sp = softplus(x): tanh(sp) + x sigmoid(x) (1 - tanh^2)
  const std::string& x = c.in(0);
  const std::string t = c.op("Tanh", {c.op("Softplus", {x})});
  const std::string sech2 = c.op("Sub", {c.scalar(1.0, x), square(c, t)});
  return times(c, c.op("Add", {t, c.op("Mul", {c.op("Mul", {x, c.op("Sigmoid", {x})}), sech2})}));
}

Status softsign(GradCtx& c) {  // 1 / (1 + |x|)^2
  const std::string& x = c.in(0);
  const std::string d = c.op("Add", {c.scalar(1.0, x), c.op("Abs", {x})});
  return times(c, c.op("Reciprocal", {square(c, d)}));
}

Status thresholded_relu(GradCtx& c) {  // x > alpha: 1
  const std::string& x = c.in(0);
  return select(c, c.op("Greater", {x, c.scalar(c.attr_f("alpha", 1.0), x)}));
}

Status shrink(GradCtx& c) {  // |x| > lambd: 1 (the bias only shifts)
  const std::string& x = c.in(0);
  return select(c, c.op("Greater", {c.op("Abs", {x}), c.scalar(c.attr_f("lambd", 0.5), x)}));
}

/// PReLU, y = x > 0 ? x : slope x with slope broadcast to x: dx = dY or slope dY, and dslope the
/// sum of dY x over where x <= 0, reduced to the slope's shape.
Status prelu(GradCtx& c) {
  const std::string& x = c.in(0);
  const std::string pos = c.op("Greater", {x, c.scalar(0.0, x)});
  if (c.wants(0)) c.grad(0, c.op("Where", {pos, c.dout(0), c.op("Mul", {c.dout(0), c.in(1)})}));
  if (c.wants(1)) {
    const std::string g = c.op("Where", {pos, c.scalar(0.0, x), c.op("Mul", {c.dout(0), x})});
    c.grad(1, c.sum_to(g, c.in(1), c.out(0)));
  }
  return {};
}

Status mean(GradCtx& c) {  // each input gets dY / n, reduced to its shape
  const std::string g = c.op("Div", {c.dout(0), c.scalar(static_cast<double>(c.n_in()), c.out(0))});
  for (int i = 0; i < c.n_in(); ++i)
    if (c.wants(i)) c.grad(i, c.sum_to(g, c.in(i), c.out(0)));
  return {};
}

/// CumSum's adjoint is the cumulative sum the other way along the same axis (exclusive stays
/// exclusive).
Status cumsum(GradCtx& c) {
  c.grad(0, c.op("CumSum", {c.dout(0), c.in(1)},
                 {{"exclusive", c.attr_i("exclusive", 0)},
                  {"reverse", static_cast<std::int64_t>(c.attr_i("reverse", 0) == 0)}}));
  return {};
}

/// Trilu keeps a triangle: its gradient keeps the same one.
Status trilu(GradCtx& c) {
  std::vector<std::string> in = {c.dout(0)};
  if (!c.in(1).empty()) in.push_back(c.in(1));
  c.grad(0, c.op("Trilu", in, {{"upper", c.attr_i("upper", 1)}}));
  return {};
}

Status cast_like(GradCtx& c) {
  c.grad(0, c.op("Cast", {c.dout(0)}, {{"to", static_cast<std::int64_t>(c.elem_type(c.in(0)))}}));
  return {};
}

}  // namespace

void register_activation_rules(RuleTable& t) {
  register_trig(t);
  t["Elu"] = elu;
  t["Celu"] = celu;
  t["Selu"] = selu;
  t["HardSigmoid"] = hard_sigmoid;
  t["HardSwish"] = hard_swish;
  t["Mish"] = mish;
  t["Softsign"] = softsign;
  t["ThresholdedRelu"] = thresholded_relu;
  t["Shrink"] = shrink;
  t["PRelu"] = prelu;
  t["Mean"] = mean;
  t["CumSum"] = cumsum;
  t["Trilu"] = trilu;
  t["CastLike"] = cast_like;
}

}  // namespace hp::train::detail
