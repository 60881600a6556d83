// Elementwise ONNX ops on the cpu backend: unary math and activations, binary arithmetic with ONNX
// multidirectional broadcasting, comparisons and logic (bool results), variadic Sum/Mean/Max/Min,
// Where and Clip (Cast and CastLike: cpu_ops_cast.cpp).
//
// Float math is done in the element type (f32 stays f32; exp/erf/tanh from <cmath>), which matches
// the reference outputs of the ONNX backend tests within their tolerances. Integer Div truncates
// toward zero, as C and ONNX Runtime do.
#include <cmath>
#include <functional>
#include <limits>
#include <type_traits>

#include "cpu_bcast.h"
#include "cpu_half.h"
#include "cpu_kernels.h"
#include "cpu_math.h"

namespace hp_cpu {
namespace {

bool same_num(const std::vector<int32_t>& d) {
  if (d.empty() || !is_num(d[0])) return false;
  for (int32_t t : d)
    if (t != d[0]) return false;
  return true;
}
bool f32_or_f64(const std::vector<int32_t>& d) {
  return same_num(d) && (d[0] == HP_F32 || d[0] == HP_F64);
}
bool all_bool(const std::vector<int32_t>& d) {
  for (int32_t t : d)
    if (t != HP_BOOL) return false;
  return !d.empty();
}

/// Registers a float unary op computed by `fn(x, alpha, beta)`.
void unary_float(OpTable& t, const char* name, double (*fn)(double, double, double),
                 const char* a_name, double a_dflt, const char* b_name, double b_dflt) {
  t[name] = {[=](OpCall& c) {
               const View& x = c.need(0);
               View y = c.out(0, x.dtype, x.dims);
               const double a = a_name ? c.f(a_name, a_dflt) : 0,
                            b = b_name ? c.f(b_name, b_dflt) : 0;
               const int64_t n = x.numel();
               if (x.dtype == HP_F32) {
                 const float* px = x.as<float>();
                 float* py = y.as<float>();
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
                 for (int64_t i = 0; i < n; ++i) py[i] = static_cast<float>(fn(px[i], a, b));
               } else {
                 const double* px = x.as<double>();
                 double* py = y.as<double>();
                 for (int64_t i = 0; i < n; ++i) py[i] = fn(px[i], a, b);
               }
             },
             [](const std::vector<int32_t>& d) { return d.size() == 1 && f32_or_f64(d); }};
}

/// Single-precision fast paths for the ops that dominate transformer graphs.
template <class F>
void unary_f32_fast(OpTable& t, const char* name, F fn) {
  t[name] = {[=](OpCall& c) {
               const View& x = c.need(0);
               View y = c.out(0, x.dtype, x.dims);
               const int64_t n = x.numel();
               if (x.dtype == HP_F32) {
                 const float* px = x.as<float>();
                 float* py = y.as<float>();
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
                 for (int64_t i = 0; i < n; ++i) py[i] = fn(px[i]);
               } else {
                 const double* px = x.as<double>();
                 double* py = y.as<double>();
                 for (int64_t i = 0; i < n; ++i) py[i] = fn(px[i]);
               }
             },
             [](const std::vector<int32_t>& d) { return d.size() == 1 && f32_or_f64(d); }};
}

/// Unary ops defined on every numeric type (Abs, Neg, Sign, Relu).
template <class F>
void unary_num(OpTable& t, const char* name, F fn) {
  t[name] = {[=](OpCall& c) {
               const View& x = c.need(0);
               View y = c.out(0, x.dtype, x.dims);
               dispatch_num(x.dtype, [&](auto tag) {
                 using T = decltype(tag);
                 const T* px = x.as<T>();
                 T* py = y.as<T>();
                 for (int64_t i = 0, n = x.numel(); i < n; ++i) py[i] = static_cast<T>(fn(px[i]));
               });
             },
             [](const std::vector<int32_t>& d) { return d.size() == 1 && is_num(d[0]); }};
}

/// Binary arithmetic on matching numeric types.
template <class F>
void binary_num(OpTable& t, const char* name, F fn, bool float_only = false) {
  t[name] = {[=](OpCall& c) {
               const View &a = c.need(0), &b = c.need(1);
               if (a.dtype != b.dtype) c.fail("operand dtypes differ");
               View y = c.out(0, a.dtype, broadcast_shapes(a.dims, b.dims, c));
               dispatch_num(a.dtype, [&](auto tag) {
                 using T = decltype(tag);
                 binary_bcast<T, T, T>(a, b, y, [&](T p, T q) { return static_cast<T>(fn(p, q)); });
               });
             },
             [=](const std::vector<int32_t>& d) {
               return d.size() == 2 && (float_only ? f32_or_f64(d) : same_num(d));
             }};
}

/// Comparisons: numeric operands of one type, bool result.
template <class F>
void compare(OpTable& t, const char* name, F fn, bool allow_bool = false) {
  t[name] = {[=](OpCall& c) {
               const View &a = c.need(0), &b = c.need(1);
               if (a.dtype != b.dtype) c.fail("operand dtypes differ");
               View y = c.out(0, HP_BOOL, broadcast_shapes(a.dims, b.dims, c));
               dispatch(a.dtype, [&](auto tag) {
                 using T = decltype(tag);
                 binary_bcast<T, T, uint8_t>(a, b, y,
                                             [&](T p, T q) { return uint8_t(fn(p, q) ? 1 : 0); });
               });
             },
             [=](const std::vector<int32_t>& d) {
               return d.size() == 2 && (same_num(d) || (allow_bool && all_bool(d)));
             }};
}

template <class F>
void logic(OpTable& t, const char* name, F fn) {
  t[name] = {[=](OpCall& c) {
               const View &a = c.need(0), &b = c.need(1);
               View y = c.out(0, HP_BOOL, broadcast_shapes(a.dims, b.dims, c));
               binary_bcast<uint8_t, uint8_t, uint8_t>(a, b, y, [&](uint8_t p, uint8_t q) {
                 return uint8_t(fn(p != 0, q != 0) ? 1 : 0);
               });
             },
             [](const std::vector<int32_t>& d) { return d.size() == 2 && all_bool(d); }};
}

/// Sum/Mean/Max/Min over any number of inputs, folded pairwise into the output.
template <class F>
void variadic(OpTable& t, const char* name, F fn, bool mean) {
  t[name] = {[=](OpCall& c) {
               const View& first = c.need(0);
               Dims shape = first.dims;
               for (size_t k = 1; k < c.n_inputs(); ++k)
                 shape = broadcast_shapes(shape, c.need(k).dims, c);
               View y = c.out(0, first.dtype, shape);
               dispatch_num(first.dtype, [&](auto tag) {
                 using T = decltype(tag);
                 View acc = y;
                 // Start from input 0 broadcast to the output shape.
                 View ones{first.dtype, {}, nullptr};
                 T one = T(0);
                 ones.data = &one;
                 binary_bcast<T, T, T>(first, ones, acc, [](T p, T) { return p; });
                 for (size_t k = 1; k < c.n_inputs(); ++k)
                   binary_bcast<T, T, T>(acc, c.need(k), acc,
                                         [&](T p, T q) { return static_cast<T>(fn(p, q)); });
                 if (mean) {
                   T* p = y.as<T>();
                   for (int64_t i = 0, n = y.numel(); i < n; ++i)
                     p[i] = static_cast<T>(p[i] / T(c.n_inputs()));
                 }
               });
             },
             [](const std::vector<int32_t>& d) { return same_num(d); }};
}

double softplus_d(double x, double, double) { return x > 30 ? x : std::log1p(std::exp(x)); }
double softsign_d(double x, double, double) { return x / (1 + std::fabs(x)); }
double leaky_d(double x, double a, double) { return x >= 0 ? x : a * x; }
double elu_d(double x, double a, double) { return x >= 0 ? x : a * (std::exp(x) - 1); }
double selu_d(double x, double a, double g) { return x > 0 ? g * x : g * (a * std::exp(x) - a); }
double celu_d(double x, double a, double) {
  return std::max(0.0, x) + std::min(0.0, a * (std::exp(x / a) - 1));
}
double hsig_d(double x, double a, double b) { return std::max(0.0, std::min(1.0, a * x + b)); }
double hswish_d(double x, double, double) { return x * std::max(0.0, std::min(1.0, x / 6 + 0.5)); }
double thresh_d(double x, double a, double) { return x > a ? x : 0; }
double mish_d(double x, double, double) { return x * std::tanh(std::log1p(std::exp(x))); }
double round_d(double x, double, double) { return std::nearbyint(x); }
double recip_d(double x, double, double) { return 1.0 / x; }
double log_d(double x, double, double) { return std::log(x); }
double sin_d(double x, double, double) { return std::sin(x); }
double cos_d(double x, double, double) { return std::cos(x); }
double tan_d(double x, double, double) { return std::tan(x); }
double asin_d(double x, double, double) { return std::asin(x); }
double acos_d(double x, double, double) { return std::acos(x); }
double atan_d(double x, double, double) { return std::atan(x); }
double sinh_d(double x, double, double) { return std::sinh(x); }
double cosh_d(double x, double, double) { return std::cosh(x); }
double asinh_d(double x, double, double) { return std::asinh(x); }
double acosh_d(double x, double, double) { return std::acosh(x); }
double atanh_d(double x, double, double) { return std::atanh(x); }
double floor_d(double x, double, double) { return std::floor(x); }
double ceil_d(double x, double, double) { return std::ceil(x); }

/// Erf: float32 through the vectorisable erf_f (cpu_math.h), float64 through libm.
void erf_op(OpCall& c) {
  const View& x = c.need(0);
  View y = c.out(0, x.dtype, x.dims);
  const int64_t n = x.numel();
  if (x.dtype == HP_F32) {
    const float* px = x.as<float>();
    float* py = y.as<float>();
    for_spans(n, [&](int64_t b, int64_t e) { erf_span(px + b, py + b, e - b); });
  } else {
    const double* px = x.as<double>();
    double* py = y.as<double>();
    for (int64_t i = 0; i < n; ++i) py[i] = std::erf(px[i]);
  }
}

void gelu(OpCall& c) {
  const View& x = c.need(0);
  View y = c.out(0, x.dtype, x.dims);
  const bool tanh_approx = c.s("approximate", "none") == "tanh";
  if (x.dtype == HP_F32 && !tanh_approx) {
    const float* px = x.as<float>();
    float* py = y.as<float>();
    for_spans(x.numel(), [&](int64_t b, int64_t e) { gelu_span(px + b, py + b, e - b); });
    return;
  }
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    T* py = y.as<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      double v = static_cast<double>(px[i]);
      py[i] = static_cast<T>(
          tanh_approx ? 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
                      : 0.5 * v * (1 + std::erf(v * 0.7071067811865476)));
    }
  });
}

void clip(OpCall& c) {
  const View& x = c.need(0);
  View y = c.out(0, x.dtype, x.dims);
  dispatch_num(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
    if (c.opset() < 11) {
      if (c.has("min")) lo = static_cast<T>(c.f("min", 0));
      if (c.has("max")) hi = static_cast<T>(c.f("max", 0));
    } else {
      if (c.in(1).present() && c.in(1).numel() > 0) lo = static_cast<T>(c.in(1).scalar());
      if (c.in(2).present() && c.in(2).numel() > 0) hi = static_cast<T>(c.in(2).scalar());
    }
    const T* px = x.as<T>();
    T* py = y.as<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i)
      py[i] = px[i] < lo ? lo : (px[i] > hi ? hi : px[i]);
  });
}

void where(OpCall& c) {
  const View &cond = c.need(0), &a = c.need(1), &b = c.need(2);
  if (a.dtype != b.dtype) c.fail("x and y dtypes differ");
  Dims shape = broadcast_shapes(broadcast_shapes(cond.dims, a.dims, c), b.dims, c);
  View y = c.out(0, a.dtype, shape);
  std::array<Dims, 3> st{broadcast_strides(cond.dims, shape), broadcast_strides(a.dims, shape),
                         broadcast_strides(b.dims, shape)};
  dispatch(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const uint8_t* pc = cond.as<uint8_t>();
    const T *pa = a.as<T>(), *pb = b.as<T>();
    T* po = y.as<T>();
    bcast_rows<3>(shape, st,
                  [&](int64_t o, const std::array<int64_t, 3>& off, int64_t n,
                      const std::array<int64_t, 3>& in) {
                    for (int64_t i = 0; i < n; ++i)
                      po[o + i] =
                          pc[off[0] + i * in[0]] ? pa[off[1] + i * in[1]] : pb[off[2] + i * in[2]];
                  });
  });
}

}  // namespace

void register_elementwise_ops(OpTable& t) {
  t["Erf"] = {erf_op, [](const std::vector<int32_t>& d) { return d.size() == 1 && f32_or_f64(d); }};
  unary_f32_fast(t, "Sigmoid", [](auto x) {
    if constexpr (std::is_same_v<decltype(x), float>)
      return 1.f / (1.f + exp_f(-x));
    else
      return 1.0 / (1.0 + std::exp(-x));
  });
  unary_f32_fast(t, "Tanh", [](auto x) { return std::tanh(x); });
  unary_f32_fast(t, "Exp", [](auto x) {
    if constexpr (std::is_same_v<decltype(x), float>)
      return exp_f(x);
    else
      return std::exp(x);
  });
  unary_f32_fast(t, "Sqrt", [](auto x) { return std::sqrt(x); });
  unary_float(t, "Log", log_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Reciprocal", recip_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Floor", floor_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Ceil", ceil_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Round", round_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Sin", sin_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Cos", cos_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Tan", tan_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Asin", asin_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Acos", acos_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Atan", atan_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Sinh", sinh_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Cosh", cosh_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Asinh", asinh_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Acosh", acosh_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Atanh", atanh_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Softplus", softplus_d, nullptr, 0, nullptr, 0);
  unary_float(t, "Softsign", softsign_d, nullptr, 0, nullptr, 0);
  unary_float(t, "LeakyRelu", leaky_d, "alpha", 0.01, nullptr, 0);
  unary_float(t, "Elu", elu_d, "alpha", 1.0, nullptr, 0);
  unary_float(t, "Selu", selu_d, "alpha", 1.67326319217681884765625, "gamma",
              1.05070102214813232421875);
  unary_float(t, "Celu", celu_d, "alpha", 1.0, nullptr, 0);
  unary_float(t, "HardSigmoid", hsig_d, "alpha", 0.2, "beta", 0.5);
  unary_float(t, "HardSwish", hswish_d, nullptr, 0, nullptr, 0);
  unary_float(t, "ThresholdedRelu", thresh_d, "alpha", 1.0, nullptr, 0);
  unary_float(t, "Mish", mish_d, nullptr, 0, nullptr, 0);
  unary_num(t, "Abs",
            [](auto x) { return x < 0 ? wrapping(decltype(x)(0), x, std::minus<>()) : x; });
  unary_num(t, "Neg", [](auto x) { return wrapping(decltype(x)(0), x, std::minus<>()); });
  unary_num(t, "Relu", [](auto x) { return x > 0 ? x : decltype(x)(0); });
  unary_num(t, "Sign", [](auto x) { return (x > 0) - (x < 0); });
  t["Gelu"] = {gelu, [](const std::vector<int32_t>& d) { return d.size() == 1 && f32_or_f64(d); }};
  t["Clip"] = {clip, [](const std::vector<int32_t>& d) { return !d.empty() && is_num(d[0]); }};
  t["Not"] = {[](OpCall& c) {
                const View& x = c.need(0);
                View y = c.out(0, HP_BOOL, x.dims);
                for (int64_t i = 0, n = x.numel(); i < n; ++i)
                  y.as<uint8_t>()[i] = x.as<uint8_t>()[i] ? 0 : 1;
              },
              [](const std::vector<int32_t>& d) { return d.size() == 1 && all_bool(d); }};

  // Integers wrap as two's complement (numpy's and ONNX Runtime's results), computed unsigned:
  // signed overflow is undefined in C++.
  binary_num(t, "Add", [](auto a, auto b) { return wrapping(a, b, std::plus<>()); });
  binary_num(t, "Sub", [](auto a, auto b) { return wrapping(a, b, std::minus<>()); });
  binary_num(t, "Mul", [](auto a, auto b) { return wrapping(a, b, std::multiplies<>()); });
  binary_num(t, "Div", [](auto a, auto b) {
    using T = decltype(a);
    if constexpr (std::is_integral_v<T>) {
      if (b == T(0)) return T(0);
      // min / -1 overflows, and x86 traps on it (SIGFPE): wrap as two's complement does.
      if constexpr (std::is_signed_v<T>)
        if (b == T(-1)) return static_cast<T>(T(0) - static_cast<std::make_unsigned_t<T>>(a));
      return static_cast<T>(a / b);
    } else {
      return a / b;
    }
  });
  t["Pow"] = {
      [](OpCall& c) {
        const View &a = c.need(0), &b = c.need(1);
        View y = c.out(0, a.dtype, broadcast_shapes(a.dims, b.dims, c));
        dispatch_num(a.dtype, [&](auto ta) {
          using A = decltype(ta);
          dispatch_num(b.dtype, [&](auto tb) {
            using B = decltype(tb);
            if (std::is_same_v<A, float> && std::is_same_v<B, float>)
              binary_bcast<A, B, A>(a, b, y, [](A p, B q) {
                return q == B(2) ? p * p : static_cast<A>(std::pow(float(p), float(q)));
              });
            else
              binary_bcast<A, B, A>(
                  a, b, y, [](A p, B q) { return static_cast<A>(std::pow(double(p), double(q))); });
          });
        });
      },
      [](const std::vector<int32_t>& d) { return d.size() == 2 && is_num(d[0]) && is_num(d[1]); }};
  t["Mod"] = {[](OpCall& c) {
                const View &a = c.need(0), &b = c.need(1);
                View y = c.out(0, a.dtype, broadcast_shapes(a.dims, b.dims, c));
                const bool fmod_mode = c.i("fmod", 0) != 0;
                dispatch_num(a.dtype, [&](auto tag) {
                  using T = decltype(tag);
                  binary_bcast<T, T, T>(a, b, y, [&](T p, T q) -> T {
                    if constexpr (std::is_integral_v<T>) {
                      if (q == 0) return 0;
                      if constexpr (std::is_signed_v<T>)
                        if (q == T(-1)) return 0;  // min % -1 traps on x86 (SIGFPE)
                      T r = p % q;
                      if (!fmod_mode && r != 0 && ((r < 0) != (q < 0))) r += q;
                      return r;
                    } else {
                      T r = std::fmod(p, q);
                      if (!fmod_mode && r != 0 && ((r < 0) != (q < 0))) r += q;
                      return r;
                    }
                  });
                });
              },
              [](const std::vector<int32_t>& d) { return d.size() == 2 && same_num(d); }};
  binary_num(t, "PRelu", [](auto x, auto slope) { return x < decltype(x)(0) ? slope * x : x; });
  // Before opset 7 (and in exporters of that time) a 1-D slope holds one value per channel (dim 1).
  t["PRelu"].run = [run = t["PRelu"].run](OpCall& c) {
    const View &x = c.need(0), &slope = c.need(1);
    if (slope.dims.size() == 1 && x.dims.size() > 2 && slope.dims[0] == x.dims[1] &&
        slope.dims[0] != x.dims.back() && slope.dims[0] != 1) {
      View s2 = slope;
      s2.dims.assign(x.dims.size() - 1, 1);
      s2.dims[0] = slope.dims[0];
      View y = c.out(0, x.dtype, x.dims);
      dispatch_num(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        binary_bcast<T, T, T>(x, s2, y, [](T a, T b) { return a < T(0) ? b * a : a; });
      });
      return;
    }
    run(c);
  };
  variadic(
      t, "Sum", [](auto a, auto b) { return a + b; }, false);
  variadic(
      t, "Mean", [](auto a, auto b) { return a + b; }, true);
  variadic(
      t, "Max", [](auto a, auto b) { return a > b || b != b ? a : b; }, false);
  variadic(
      t, "Min", [](auto a, auto b) { return a < b || b != b ? a : b; }, false);
  compare(
      t, "Equal", [](auto a, auto b) { return a == b; }, true);
  compare(t, "Less", [](auto a, auto b) { return a < b; });
  compare(t, "Greater", [](auto a, auto b) { return a > b; });
  compare(t, "LessOrEqual", [](auto a, auto b) { return a <= b; });
  compare(t, "GreaterOrEqual", [](auto a, auto b) { return a >= b; });
  logic(t, "And", [](bool a, bool b) { return a && b; });
  logic(t, "Or", [](bool a, bool b) { return a || b; });
  logic(t, "Xor", [](bool a, bool b) { return a != b; });
  t["Where"] = {where, [](const std::vector<int32_t>& d) {
                  return d.size() == 3 && d[0] == HP_BOOL && d[1] == d[2] &&
                         (is_num(d[1]) || d[1] == HP_BOOL);
                }};
}

}  // namespace hp_cpu
