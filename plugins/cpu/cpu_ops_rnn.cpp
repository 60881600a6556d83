// Recurrent layers: ONNX LSTM, GRU and RNN (opset 7 and 14 forms: forward, reverse and
// bidirectional; per-batch sequence_lens; initial states; LSTM peepholes and input_forget; GRU
// linear_before_reset; clip; the activation lists; layout 0 = [seq, batch, ...] and layout 1 =
// [batch, seq, ...]).
//
// One cell kernel serves the three ops: per direction, per batch entry, per step, the gate
// pre-activations are X_t W^T + H_{t-1} R^T + Wb + Rb (GRU's candidate gate differs: its R product
// sees r (.) H_{t-1}, or is scaled by r after the product with linear_before_reset), then the
// cell's update. Plain loops, row by row (a dot product per gate row): the recurrent models hp
// meets are small, and the step-to-step dependency leaves a batched GEMM little to win at batch 1.
// Steps past a batch entry's sequence length are not computed: Y is zero there and Y_h / Y_c hold
// the state of the last valid step (for the reverse direction, the state after step 0). The gate
// order is ONNX's: LSTM i, o, f, c; GRU z, r, h; peepholes i, o, f.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

enum class Cell { rnn, gru, lstm };

/// One activation function with its parameters (defaults are those of the ONNX op of that name).
struct Act {
  std::string name;  ///< lower case
  double alpha = 0, beta = 0;
  double operator()(double x) const {
    if (name == "sigmoid") return 1 / (1 + std::exp(-x));
    if (name == "tanh") return std::tanh(x);
    if (name == "relu") return x > 0 ? x : 0;
    if (name == "affine") return alpha * x + beta;
    if (name == "leakyrelu") return x >= 0 ? x : alpha * x;
    if (name == "thresholdedrelu") return x > alpha ? x : 0;
    if (name == "scaledtanh") return alpha * std::tanh(beta * x);
    if (name == "hardsigmoid") return std::max(0.0, std::min(1.0, alpha * x + beta));
    if (name == "elu") return x >= 0 ? x : alpha * (std::exp(x) - 1);
    if (name == "softsign") return x / (1 + std::abs(x));
    if (name == "softplus") return std::log1p(std::exp(x));
    return x;
  }
};

/// The activation list of the node (recurrent_activation_names), with activation_alpha /
/// activation_beta consumed in order by the functions that take them.
std::vector<Act> activations(const OpCall& c, const std::string& op, int dirs) {
  const std::vector<std::string> names = recurrent_activation_names(c, op, dirs);
  const auto alphas = c.floats("activation_alpha"), betas = c.floats("activation_beta");
  std::size_t ai = 0, bi = 0;
  std::vector<Act> out;
  for (const std::string& n : names) {
    Act a;
    a.name = n;
    double da = 0, db = 0;
    bool uses_a = true, uses_b = false;
    if (n == "affine")
      da = 1, db = 0, uses_b = true;
    else if (n == "leakyrelu")
      da = 0.01;
    else if (n == "thresholdedrelu")
      da = 1;
    else if (n == "scaledtanh")
      da = 1, db = 1, uses_b = true;
    else if (n == "hardsigmoid")
      da = 0.2, db = 0.5, uses_b = true;
    else if (n == "elu")
      da = 1;
    else if (n == "sigmoid" || n == "tanh" || n == "relu" || n == "softsign" || n == "softplus")
      uses_a = false;
    else
      throw OpError("activation '" + n + "' is not implemented", HP_UNSUPPORTED);
    a.alpha = uses_a && ai < alphas.size() ? alphas[ai++] : da;
    a.beta = uses_b && bi < betas.size() ? betas[bi++] : db;
    out.push_back(a);
  }
  return out;
}

template <class T>
double dot(const T* a, const T* b, int64_t n) {
  double s = 0;
  for (int64_t k = 0; k < n; ++k) s += static_cast<double>(a[k]) * static_cast<double>(b[k]);
  return s;
}

template <class T>
void recurrent(OpCall& c, Cell cell) {
  const View& X = c.need(0);
  const View& W = c.need(1);
  const View& R = c.need(2);
  const View& B = c.in(3);
  const View& L = c.in(4);
  const View& H0 = c.in(5);
  const View& C0 = cell == Cell::lstm ? c.in(6) : View{};
  const View& P = cell == Cell::lstm ? c.in(7) : View{};
  const int64_t layout = c.i("layout", 0);
  const std::string direction = c.s("direction", "forward");
  const int dirs = direction == "bidirectional" ? 2 : 1;
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    c.fail("unknown direction '" + direction + "'");
  const int64_t G = cell == Cell::lstm ? 4 : cell == Cell::gru ? 3 : 1;
  if (X.dims.size() != 3 || W.dims.size() != 3 || R.dims.size() != 3)
    c.fail("X, W and R must have rank 3");
  const int64_t seq = X.dims[layout ? 1 : 0], batch = X.dims[layout ? 0 : 1], in = X.dims[2];
  const int64_t H = c.i("hidden_size", R.dims[2]);
  if (W.dims != Dims{dirs, G * H, in} || R.dims != Dims{dirs, G * H, H})
    c.fail("W " + dims_str(W.dims) + " or R " + dims_str(R.dims) + " does not fit " +
           std::to_string(dirs) + " direction(s), hidden size " + std::to_string(H) +
           " and input size " + std::to_string(in));
  if (B.present() && B.dims != Dims{dirs, 2 * G * H})
    c.fail("B " + dims_str(B.dims) + " should be " + dims_str({dirs, 2 * G * H}));
  const Dims state_dims = layout ? Dims{batch, dirs, H} : Dims{dirs, batch, H};
  for (const View* v : {&H0, &C0})
    if (v->present() && v->dims != state_dims)
      c.fail("initial state " + dims_str(v->dims) + " should be " + dims_str(state_dims));
  if (P.present() && P.dims != Dims{dirs, 3 * H})
    c.fail("P " + dims_str(P.dims) + " should be " + dims_str({dirs, 3 * H}));
  std::vector<int64_t> lens(static_cast<size_t>(batch), seq);
  if (L.present()) {
    auto l = L.ints();
    if (static_cast<int64_t>(l.size()) != batch) c.fail("sequence_lens must have batch entries");
    for (int64_t b = 0; b < batch; ++b) {
      if (l[static_cast<size_t>(b)] < 0 || l[static_cast<size_t>(b)] > seq)
        c.fail("sequence length " + std::to_string(l[static_cast<size_t>(b)]) + " outside [0, " +
               std::to_string(seq) + "]");
      lens[static_cast<size_t>(b)] = l[static_cast<size_t>(b)];
    }
  }
  const std::vector<Act> acts = activations(c,
                                            cell == Cell::lstm  ? "LSTM"
                                            : cell == Cell::gru ? "GRU"
                                                                : "RNN",
                                            dirs);
  const std::size_t per_dir = acts.size() / static_cast<std::size_t>(dirs);
  const bool has_clip = c.has("clip");
  const double clip = c.f("clip", 0);
  const bool input_forget = c.i("input_forget", 0) != 0;
  const bool lbr = c.i("linear_before_reset", 0) != 0;

  // Offsets in the layout-dependent tensors.
  auto x_at = [&](int64_t t, int64_t b) {
    return X.as<T>() + (layout ? (b * seq + t) : (t * batch + b)) * in;
  };
  auto state_at = [&](int64_t d, int64_t b) {
    return layout ? (b * dirs + d) * H : (d * batch + b) * H;
  };
  auto y_at = [&](int64_t t, int64_t d, int64_t b) {
    return layout ? ((b * seq + t) * dirs + d) * H : ((t * dirs + d) * batch + b) * H;
  };

  std::vector<T> y(static_cast<size_t>(seq * dirs * batch * H), T(0));
  std::vector<T> hs(static_cast<size_t>(dirs * batch * H), T(0)), cs(hs.size(), T(0));
  if (H0.present()) std::copy(H0.as<T>(), H0.as<T>() + hs.size(), hs.begin());
  if (C0.present()) std::copy(C0.as<T>(), C0.as<T>() + cs.size(), cs.begin());
  std::vector<double> gx(static_cast<size_t>(G * H)), gh(static_cast<size_t>(G * H));
  std::vector<T> hprev(static_cast<size_t>(H));
  std::vector<double> rh_in(static_cast<size_t>(H)), rh(static_cast<size_t>(H));
  auto clipped = [&](double v) { return has_clip ? std::max(-clip, std::min(clip, v)) : v; };

  for (int d = 0; d < dirs; ++d) {
    const bool reverse = direction == "reverse" || d == 1;
    const T* w = W.as<T>() + d * G * H * in;
    const T* r = R.as<T>() + d * G * H * H;
    const T* wb = B.present() ? B.as<T>() + d * 2 * G * H : nullptr;
    const T* rb = wb ? wb + G * H : nullptr;
    const T* p = P.present() ? P.as<T>() + d * 3 * H : nullptr;
    const Act* f = &acts[static_cast<size_t>(d) * per_dir];
    for (int64_t b = 0; b < batch; ++b) {
      T* h = hs.data() + state_at(d, b);
      T* cst = cs.data() + state_at(d, b);
      const int64_t len = lens[static_cast<size_t>(b)];
      for (int64_t s = 0; s < len; ++s) {
        const int64_t t = reverse ? len - 1 - s : s;
        const T* xt = x_at(t, b);
        std::copy(h, h + H, hprev.begin());
        for (int64_t j = 0; j < G * H; ++j) {
          gx[static_cast<size_t>(j)] = dot(w + j * in, xt, in) + (wb ? wb[j] : 0);
          gh[static_cast<size_t>(j)] = dot(r + j * H, hprev.data(), H) + (rb ? rb[j] : 0);
        }
        if (cell == Cell::gru && !lbr) {
          for (int64_t q = 0; q < H; ++q) {
            const auto ri = static_cast<size_t>(H + q);
            rh_in[static_cast<size_t>(q)] =
                f[0](clipped(gx[ri] + gh[ri])) * static_cast<double>(hprev[static_cast<size_t>(q)]);
          }
          for (int64_t k = 0; k < H; ++k) {
            const T* row = r + (2 * H + k) * H;
            double acc = rb ? rb[2 * H + k] : 0;
            for (int64_t q = 0; q < H; ++q)
              acc += static_cast<double>(row[q]) * rh_in[static_cast<size_t>(q)];
            rh[static_cast<size_t>(k)] = acc;
          }
        }
        for (int64_t k = 0; k < H; ++k) {
          const auto K = static_cast<size_t>(k);
          double hn = 0;
          if (cell == Cell::rnn) {
            hn = f[0](clipped(gx[K] + gh[K]));
          } else if (cell == Cell::gru) {
            const size_t zi = K, ri = static_cast<size_t>(H) + K,
                         hi = static_cast<size_t>(2 * H) + K;
            const double z = f[0](clipped(gx[zi] + gh[zi]));
            const double rr = f[0](clipped(gx[ri] + gh[ri]));
            // Without linear_before_reset, R_h multiplies r (.) H_{t-1} (rh below).
            const double cand = lbr ? gx[hi] + rr * gh[hi] : gx[hi] + rh[K];
            const double hh = f[1](clipped(cand));
            hn = (1 - z) * hh + z * static_cast<double>(hprev[K]);
          } else {
            const size_t ii = K, oi = static_cast<size_t>(H) + K,
                         fi = static_cast<size_t>(2 * H) + K, ci = static_cast<size_t>(3 * H) + K;
            const double cprev = cst[k];
            const double ft = f[0](clipped(gx[fi] + gh[fi] + (p ? p[2 * H + k] * cprev : 0)));
            const double it =
                input_forget ? 1 - ft : f[0](clipped(gx[ii] + gh[ii] + (p ? p[k] * cprev : 0)));
            const double ct = f[1](clipped(gx[ci] + gh[ci]));
            const double cnew = ft * cprev + it * ct;
            const double ot = f[0](clipped(gx[oi] + gh[oi] + (p ? p[H + k] * cnew : 0)));
            cst[k] = static_cast<T>(cnew);
            hn = ot * f[2](cnew);
          }
          h[k] = static_cast<T>(hn);
        }
        std::copy(h, h + H, y.begin() + y_at(t, d, b));
      }
    }
  }
  const int dt = X.dtype;
  const Dims ydims = layout ? Dims{batch, seq, dirs, H} : Dims{seq, dirs, batch, H};
  if (c.n_outputs() > 0) {
    View o = c.out(0, dt, ydims);
    std::copy(y.begin(), y.end(), o.as<T>());
  }
  if (c.n_outputs() > 1) {
    View o = c.out(1, dt, state_dims);
    std::copy(hs.begin(), hs.end(), o.as<T>());
  }
  if (cell == Cell::lstm && c.n_outputs() > 2) {
    View o = c.out(2, dt, state_dims);
    std::copy(cs.begin(), cs.end(), o.as<T>());
  }
}

void run(OpCall& c, Cell cell) {
  const int dt = c.need(0).dtype;
  if (dt == HP_F32)
    recurrent<float>(c, cell);
  else if (dt == HP_F64)
    recurrent<double>(c, cell);
  else
    throw OpError("recurrent layers run on f32 and f64", HP_UNSUPPORTED);
}

/// X, W, R, B, initial states and P share one float type; sequence_lens (input 4) is i32.
bool recurrent_dtypes(const std::vector<int32_t>& d) {
  if (d.size() < 3 || (d[0] != HP_F32 && d[0] != HP_F64)) return false;
  for (size_t k = 1; k < d.size(); ++k) {
    if (d[k] == -1) continue;
    if (k == 4 ? (d[k] != HP_I32 && d[k] != HP_I64) : d[k] != d[0]) return false;
  }
  return true;
}

}  // namespace

std::vector<std::string> recurrent_activation_names(const OpCall& c, const std::string& op,
                                                    int dirs) {
  const std::vector<std::string> defaults =
      op == "LSTM"  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
      : op == "GRU" ? std::vector<std::string>{"Sigmoid", "Tanh"}
                    : std::vector<std::string>{"Tanh"};
  const std::size_t per_dir = defaults.size();
  std::vector<std::string> names = c.strings("activations");
  if (names.empty())
    for (int d = 0; d < dirs; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  if (names.size() == per_dir && dirs == 2) names.insert(names.end(), names.begin(), names.end());
  if (names.size() != per_dir * static_cast<std::size_t>(dirs))
    c.fail("expected " + std::to_string(per_dir * static_cast<std::size_t>(dirs)) +
           " activations, got " + std::to_string(names.size()));
  for (auto& n : names)
    std::transform(n.begin(), n.end(), n.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
  return names;
}

void register_rnn_ops(OpTable& t) {
  t["LSTM"] = {[](OpCall& c) { run(c, Cell::lstm); }, recurrent_dtypes};
  t["GRU"] = {[](OpCall& c) { run(c, Cell::gru); }, recurrent_dtypes};
  t["RNN"] = {[](OpCall& c) { run(c, Cell::rnn); }, recurrent_dtypes};
}

}  // namespace hp_cpu
