// The optimizer ops of the ai.onnx.preview.training domain on the cpu backend (f32, f64):
// Adagrad, Momentum and Adam, each updating n tensors at once.
//
// Inputs are R (learning rate), T (update count), then n tensors X, n gradients G and the n (or
// 2n for Adam) optimizer states; outputs are the n new X then the new states, in the same order.
// Every op first adds norm_coefficient * X to the gradient (L2 regularisation), then:
//   Adagrad:  r = R / (1 + T * decay_factor); H' = H + G^2; X' = X - r * G / (sqrt(H') + eps)
//   Momentum: V' = alpha * V + beta' * G (beta' = 1 on the first update, T = 0); X' = X - R * V'
//             ("standard") or X - R * (G + alpha * V') ("nesterov")
//   Adam:     V' = alpha V + (1 - alpha) G; H' = beta H + (1 - beta) G^2; from T > 0 the rate is
//             R sqrt(1 - beta^T) / (1 - alpha^T); X' = (1 - norm_coefficient_post) *
//             (X - rate * V' / (sqrt(H') + eps))
// computed in double per element.
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

/// Checks the input count (2 + groups * n) and returns n.
int64_t tensor_count(const OpCall& c, int64_t groups) {
  const int64_t rest = static_cast<int64_t>(c.n_inputs()) - 2;
  if (rest <= 0 || rest % groups) c.fail("expected R, T and " + std::to_string(groups) + " groups");
  const int64_t n = rest / groups;
  if (c.n_outputs() != n * (groups - 1)) c.fail("output count does not match the inputs");
  for (int64_t g = 1; g < groups; ++g)
    for (int64_t k = 0; k < n; ++k)
      if (c.need(2 + g * n + k).dims != c.need(2 + k).dims)
        c.fail("input " + std::to_string(2 + g * n + k) + " differs in shape from its tensor");
  return n;
}

/// Calls f(i, x, g, states..., outs...) per element of tensor k, all as doubles read/written by T.
template <class F>
void update(OpCall& c, int64_t groups, F&& f) {
  const int64_t n = tensor_count(c, groups);
  const View& x0 = c.need(2);
  dispatch(x0.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      for (int64_t k = 0; k < n; ++k) {
        const View& x = c.need(2 + k);
        std::vector<const T*> in;
        for (int64_t g = 0; g < groups; ++g) in.push_back(c.need(2 + g * n + k).as<T>());
        std::vector<T*> out;
        for (int64_t g = 0; g + 1 < groups; ++g)
          out.push_back(c.out(g * n + k, x.dtype, x.dims).template as<T>());
        for (int64_t i = 0, m = x.numel(); i < m; ++i) {
          double v[3] = {0, 0, 0}, o[3] = {0, 0, 0};
          for (int64_t g = 2; g < groups; ++g) v[g - 2] = in[g][i];
          f(double(in[0][i]), double(in[1][i]), v, o);
          for (int64_t g = 0; g + 1 < groups; ++g) out[g][i] = static_cast<T>(o[g]);
        }
      }
    }
  });
}

void adagrad(OpCall& c) {
  const double R = c.need(0).scalar(), T = c.need(1).scalar();
  const double decay = c.f("decay_factor", 0), eps = c.f("epsilon", 1e-6),
               norm = c.f("norm_coefficient", 0);
  const double r = R / (1 + T * decay);
  update(c, 3, [&](double x, double g, const double* s, double* o) {
    g += norm * x;
    const double h = s[0] + g * g;
    o[0] = x - r * g / (std::sqrt(h) + eps);
    o[1] = h;
  });
}

void momentum(OpCall& c) {
  const double R = c.need(0).scalar(), T = c.need(1).scalar();
  const double alpha = c.f("alpha", 0), beta = T > 0 ? c.f("beta", 0) : 1.0,
               norm = c.f("norm_coefficient", 0);
  const std::string mode = c.s("mode", "standard");
  if (mode != "standard" && mode != "nesterov") c.fail("unknown mode '" + mode + "'");
  const bool nesterov = mode == "nesterov";
  update(c, 3, [&](double x, double g, const double* s, double* o) {
    g += norm * x;
    const double v = alpha * s[0] + beta * g;
    o[0] = x - R * (nesterov ? g + alpha * v : v);
    o[1] = v;
  });
}

void adam(OpCall& c) {
  const double R = c.need(0).scalar(), T = c.need(1).scalar();
  const double alpha = c.f("alpha", 0.9), beta = c.f("beta", 0.999), eps = c.f("epsilon", 1e-6),
               norm = c.f("norm_coefficient", 0), post = c.f("norm_coefficient_post", 0);
  const double rate = T > 0 ? R * std::sqrt(1 - std::pow(beta, T)) / (1 - std::pow(alpha, T)) : R;
  update(c, 4, [&](double x, double g, const double* s, double* o) {
    g += norm * x;
    const double v = alpha * s[0] + (1 - alpha) * g, h = beta * s[1] + (1 - beta) * g * g;
    o[0] = (1 - post) * (x - rate * v / (std::sqrt(h) + eps));
    o[1] = v;
    o[2] = h;
  });
}

bool optim_types(const std::vector<int32_t>& d) {
  if (d.size() < 5 || (d[2] != HP_F32 && d[2] != HP_F64)) return false;
  for (size_t k = 3; k < d.size(); ++k)
    if (d[k] != d[2]) return false;
  return is_num(d[0]) && is_int(d[1]);
}

}  // namespace

void register_optim_ops(OpTable& t) {
  // Keyed by domain and op type: these are not ai.onnx ops (cpu_ops.cpp, supports_op).
  t["ai.onnx.preview.training.Adagrad"] = {adagrad, optim_types};
  t["ai.onnx.preview.training.Momentum"] = {momentum, optim_types};
  t["ai.onnx.preview.training.Adam"] = {adam, optim_types};
}

}  // namespace hp_cpu
