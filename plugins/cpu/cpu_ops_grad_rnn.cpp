// hp.train.RecurrentGrad on the cpu backend (docs/training.md, "The hp.train domain"), f32 and f64:
// the gradients of an ONNX LSTM, GRU or RNN node by backpropagation through time.
//
// Inputs: dY, dY_h, dY_c (each may be absent: no gradient reaches that output), then the forward
// node's inputs in their positions (X, W, R, B, sequence_lens, initial_h, initial_c, P). Outputs:
// dX, dW, dR, dB, d_initial_h, then for LSTM d_initial_c and dP. The forward is recomputed here,
// one direction and batch entry at a time, keeping each step's gates and states (a few H-vectors
// per step), then walked backward: a step's gate pre-activation gradients give dW, dR and dB as
// outer products with x_t and h_{t-1}, dX as W^T of them and dh_{t-1} as R^T of them. Recomputing
// costs one forward more than keeping the gates from the forward kernel, and keeps the forward op
// exactly ONNX's. The activation derivatives are taken from their outputs (sigmoid y(1-y), tanh
// 1-y^2, relu y>0), which is why the activation list is limited to those three; clip and
// input_forget are refused (the gradient rule, libs/train/src/rules_recurrent.cpp, says so before
// anything runs). Gate order and sequence_lens handling are the forward's (cpu_ops_rnn.cpp).
#include <algorithm>
#include <cmath>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

enum class Cell { rnn, gru, lstm };
enum class Fn { sigmoid, tanh, relu };

double apply(Fn f, double x) {
  switch (f) {
    case Fn::sigmoid: return 1 / (1 + std::exp(-x));
    case Fn::tanh: return std::tanh(x);
    case Fn::relu: return x > 0 ? x : 0;
  }
  return x;
}

/// f'(x) from y = f(x).
double slope(Fn f, double y) {
  switch (f) {
    case Fn::sigmoid: return y * (1 - y);
    case Fn::tanh: return 1 - y * y;
    case Fn::relu: return y > 0 ? 1 : 0;
  }
  return 1;
}

/// The node's activations (recurrent_activation_names: the forward's list and defaults).
std::vector<Fn> functions(const OpCall& c, const std::string& op, int dirs) {
  std::vector<Fn> out;
  for (const std::string& n : recurrent_activation_names(c, op, dirs)) {
    if (n == "sigmoid")
      out.push_back(Fn::sigmoid);
    else if (n == "tanh")
      out.push_back(Fn::tanh);
    else if (n == "relu")
      out.push_back(Fn::relu);
    else
      throw OpError("RecurrentGrad: activation '" + n + "' has no gradient here", HP_UNSUPPORTED);
  }
  return out;
}

/// One step of the recomputed forward of one (direction, batch entry).
template <class T>
struct Step {
  int64_t t = 0;
  std::vector<double> hprev, cprev, gates, extra;  // extra: GRU's R_h h + Rb_h or r (.) h_prev
  std::vector<double> cnew;                        // LSTM's new cell state
};

template <class T>
void recurrent_grad(OpCall& c) {
  const std::string kind = c.s("cell", "");
  const Cell cell = kind == "LSTM" ? Cell::lstm : kind == "GRU" ? Cell::gru : Cell::rnn;
  if (kind != "LSTM" && kind != "GRU" && kind != "RNN") c.fail("cell must be LSTM, GRU or RNN");
  if (c.has("clip")) c.fail("clip has no gradient here");
  if (c.i("input_forget", 0)) c.fail("input_forget has no gradient here");
  const View& dY = c.in(0);
  const View& dYh = c.in(1);
  const View& dYc = c.in(2);
  const View& X = c.need(3);
  const View& W = c.need(4);
  const View& R = c.need(5);
  const View& B = c.in(6);
  const View& L = c.in(7);
  const View& H0 = c.in(8);
  const View& C0 = cell == Cell::lstm ? c.in(9) : View{};
  const View& P = cell == Cell::lstm ? c.in(10) : View{};
  const int64_t layout = c.i("layout", 0);
  const std::string direction = c.s("direction", "forward");
  const int dirs = direction == "bidirectional" ? 2 : 1;
  const int64_t G = cell == Cell::lstm ? 4 : cell == Cell::gru ? 3 : 1;
  if (X.dims.size() != 3 || W.dims.size() != 3 || R.dims.size() != 3)
    c.fail("X, W and R must have rank 3");
  const int64_t seq = X.dims[layout ? 1 : 0], batch = X.dims[layout ? 0 : 1], in = X.dims[2];
  const int64_t H = R.dims[2];
  if (W.dims != Dims{dirs, G * H, in} || R.dims != Dims{dirs, G * H, H})
    c.fail("W " + dims_str(W.dims) + " or R " + dims_str(R.dims) + " does not fit the cell");
  const Dims state_dims = layout ? Dims{batch, dirs, H} : Dims{dirs, batch, H};
  const Dims ydims = layout ? Dims{batch, seq, dirs, H} : Dims{seq, dirs, batch, H};
  if (dY.present() && dY.dims != ydims) c.fail("dY " + dims_str(dY.dims) + " is not Y's shape");
  for (const View* v : {&dYh, &dYc, &H0, &C0})
    if (v->present() && v->dims != state_dims)
      c.fail("a state " + dims_str(v->dims) + " should be " + dims_str(state_dims));
  if (B.present() && B.dims != Dims{dirs, 2 * G * H}) c.fail("B has the wrong shape");
  if (P.present() && P.dims != Dims{dirs, 3 * H}) c.fail("P has the wrong shape");
  std::vector<int64_t> lens(static_cast<size_t>(batch), seq);
  if (L.present()) {
    auto l = L.ints();
    if (static_cast<int64_t>(l.size()) != batch) c.fail("sequence_lens must have batch entries");
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t v = l[static_cast<size_t>(b)];
      if (v < 0 || v > seq) c.fail("sequence length outside [0, seq]");
      lens[static_cast<size_t>(b)] = v;
    }
  }
  const std::vector<Fn> fns = functions(c, kind, dirs);
  const std::size_t per_dir = fns.size() / static_cast<std::size_t>(dirs);
  const bool lbr = c.i("linear_before_reset", 0) != 0;
  const auto GH = static_cast<size_t>(G * H), Hs = static_cast<size_t>(H);

  auto x_off = [&](int64_t t, int64_t b) {
    return (layout ? (b * seq + t) : (t * batch + b)) * in;
  };
  auto state_off = [&](int64_t d, int64_t b) {
    return layout ? (b * dirs + d) * H : (d * batch + b) * H;
  };
  auto y_off = [&](int64_t t, int64_t d, int64_t b) {
    return layout ? ((b * seq + t) * dirs + d) * H : ((t * dirs + d) * batch + b) * H;
  };
  auto at = [](const View& v, int64_t off) -> double {
    return v.present() ? static_cast<double>(v.as<T>()[off]) : 0.0;
  };

  std::vector<double> dX(static_cast<size_t>(X.numel()), 0), dW(static_cast<size_t>(W.numel()), 0),
      dR(static_cast<size_t>(R.numel()), 0), dB(static_cast<size_t>(dirs * 2 * G * H), 0),
      dH0(static_cast<size_t>(dirs * batch * H), 0), dC0(dH0.size(), 0),
      dP(static_cast<size_t>(dirs * 3 * H), 0);
  std::vector<double> da(GH), dh(Hs), dc(Hs), dhn(Hs), dcn(Hs), tmp(Hs);
  for (int d = 0; d < dirs; ++d) {
    const bool reverse = direction == "reverse" || d == 1;
    const T* w = W.as<T>() + d * G * H * in;
    const T* r = R.as<T>() + d * G * H * H;
    const T* wb = B.present() ? B.as<T>() + d * 2 * G * H : nullptr;
    const T* rb = wb ? wb + G * H : nullptr;
    const T* p = P.present() ? P.as<T>() + d * 3 * H : nullptr;
    const Fn* f = &fns[static_cast<size_t>(d) * per_dir];
    double* gw = dW.data() + d * G * H * in;
    double* gr = dR.data() + d * G * H * H;
    double* gwb = dB.data() + d * 2 * G * H;
    double* grb = gwb + G * H;
    double* gp = dP.data() + d * 3 * H;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = lens[static_cast<size_t>(b)];
      // Forward, keeping what the backward reads.
      std::vector<Step<T>> steps(static_cast<size_t>(len));
      std::vector<double> h(Hs), cs(Hs);
      for (int64_t k = 0; k < H; ++k) {
        h[static_cast<size_t>(k)] = at(H0, state_off(d, b) + k);
        cs[static_cast<size_t>(k)] = at(C0, state_off(d, b) + k);
      }
      std::vector<double> gx(GH), gh(GH);
      for (int64_t s = 0; s < len; ++s) {
        Step<T>& st = steps[static_cast<size_t>(s)];
        st.t = reverse ? len - 1 - s : s;
        st.hprev = h;
        st.cprev = cs;
        const T* xt = X.as<T>() + x_off(st.t, b);
        for (size_t j = 0; j < GH; ++j) {
          double ax = wb ? wb[j] : 0, ah = rb ? rb[j] : 0;
          for (int64_t q = 0; q < in; ++q) ax += static_cast<double>(w[j * in + q]) * xt[q];
          for (size_t q = 0; q < Hs; ++q) ah += static_cast<double>(r[j * Hs + q]) * h[q];
          gx[j] = ax, gh[j] = ah;
        }
        st.gates.assign(GH, 0);
        if (cell == Cell::rnn) {
          for (size_t k = 0; k < Hs; ++k) h[k] = st.gates[k] = apply(f[0], gx[k] + gh[k]);
        } else if (cell == Cell::gru) {
          st.extra.assign(Hs, 0);
          for (size_t k = 0; k < Hs; ++k) {
            st.gates[k] = apply(f[0], gx[k] + gh[k]);                 // z
            st.gates[Hs + k] = apply(f[0], gx[Hs + k] + gh[Hs + k]);  // r
          }
          for (size_t k = 0; k < Hs; ++k) {
            double cand;
            if (lbr) {
              st.extra[k] = gh[2 * Hs + k];  // R_h h_{t-1} + Rb_h
              cand = gx[2 * Hs + k] + st.gates[Hs + k] * st.extra[k];
            } else {
              double acc = rb ? rb[2 * Hs + k] : 0;
              for (size_t q = 0; q < Hs; ++q)
                acc +=
                    static_cast<double>(r[(2 * Hs + k) * Hs + q]) * st.gates[Hs + q] * st.hprev[q];
              cand = gx[2 * Hs + k] + acc;
            }
            st.gates[2 * Hs + k] = apply(f[1], cand);  // the candidate
          }
          if (!lbr)
            for (size_t q = 0; q < Hs; ++q) st.extra[q] = st.gates[Hs + q] * st.hprev[q];
          for (size_t k = 0; k < Hs; ++k)
            h[k] = (1 - st.gates[k]) * st.gates[2 * Hs + k] + st.gates[k] * st.hprev[k];
        } else {  // LSTM gates i, o, f, c
          st.cnew.assign(Hs, 0);
          for (size_t k = 0; k < Hs; ++k) {
            const double cp = st.cprev[k];
            const double ft =
                apply(f[0], gx[2 * Hs + k] + gh[2 * Hs + k] + (p ? p[2 * Hs + k] * cp : 0));
            const double it = apply(f[0], gx[k] + gh[k] + (p ? p[k] * cp : 0));
            const double ct = apply(f[1], gx[3 * Hs + k] + gh[3 * Hs + k]);
            const double cn = ft * cp + it * ct;
            const double ot = apply(f[0], gx[Hs + k] + gh[Hs + k] + (p ? p[Hs + k] * cn : 0));
            st.gates[k] = it, st.gates[Hs + k] = ot, st.gates[2 * Hs + k] = ft;
            st.gates[3 * Hs + k] = ct;
            st.cnew[k] = cs[k] = cn;
            h[k] = ot * apply(f[2], cn);
          }
        }
      }
      // Backward through time. The final states' gradients enter at the last step run.
      for (size_t k = 0; k < Hs; ++k) {
        dhn[k] = at(dYh, state_off(d, b) + static_cast<int64_t>(k));
        dcn[k] = at(dYc, state_off(d, b) + static_cast<int64_t>(k));
      }
      for (int64_t s = len - 1; s >= 0; --s) {
        const Step<T>& st = steps[static_cast<size_t>(s)];
        for (size_t k = 0; k < Hs; ++k)
          dh[k] = dhn[k] + at(dY, y_off(st.t, d, b) + static_cast<int64_t>(k));
        std::fill(dhn.begin(), dhn.end(), 0.0);
        if (cell == Cell::rnn) {
          for (size_t k = 0; k < Hs; ++k) da[k] = dh[k] * slope(f[0], st.gates[k]);
        } else if (cell == Cell::gru) {
          for (size_t k = 0; k < Hs; ++k) {
            const double z = st.gates[k], hh = st.gates[2 * Hs + k];
            da[k] = dh[k] * (st.hprev[k] - hh) * slope(f[0], z);  // z's pre-activation
            da[2 * Hs + k] = dh[k] * (1 - z) * slope(f[1], hh);   // the candidate's
            dhn[k] += dh[k] * z;
          }
          if (lbr) {
            for (size_t k = 0; k < Hs; ++k) {
              const double rr = st.gates[Hs + k];
              da[Hs + k] = da[2 * Hs + k] * st.extra[k] * slope(f[0], rr);
              tmp[k] = da[2 * Hs + k] * rr;  // d(R_h h + Rb_h)
            }
          } else {
            // d(r (.) h_prev) = R_h^T dcand; its R_h and Rb_h gradients are taken here.
            for (size_t q = 0; q < Hs; ++q) {
              double acc = 0;
              for (size_t k = 0; k < Hs; ++k)
                acc += static_cast<double>(r[(2 * Hs + k) * Hs + q]) * da[2 * Hs + k];
              tmp[q] = acc;
            }
            for (size_t k = 0; k < Hs; ++k) {
              for (size_t q = 0; q < Hs; ++q)
                gr[(2 * Hs + k) * Hs + q] += da[2 * Hs + k] * st.extra[q];
              grb[2 * Hs + k] += da[2 * Hs + k];
            }
            for (size_t q = 0; q < Hs; ++q) {
              const double rr = st.gates[Hs + q];
              da[Hs + q] = tmp[q] * st.hprev[q] * slope(f[0], rr);
              dhn[q] += tmp[q] * rr;
            }
          }
        } else {
          for (size_t k = 0; k < Hs; ++k) {
            const double it = st.gates[k], ot = st.gates[Hs + k], ft = st.gates[2 * Hs + k],
                         ct = st.gates[3 * Hs + k], cn = st.cnew[k], cp = st.cprev[k];
            const double gc = apply(f[2], cn);
            const double dop = dh[k] * gc * slope(f[0], ot);
            double dcell = dcn[k] + dh[k] * ot * slope(f[2], gc);
            if (p) dcell += dop * p[Hs + k], gp[Hs + k] += dop * cn;
            const double dip = dcell * ct * slope(f[0], it);
            const double dfp = dcell * cp * slope(f[0], ft);
            da[k] = dip, da[Hs + k] = dop, da[2 * Hs + k] = dfp;
            da[3 * Hs + k] = dcell * it * slope(f[1], ct);
            dcn[k] = dcell * ft + (p ? dip * p[k] + dfp * p[2 * Hs + k] : 0);
            if (p) gp[k] += dip * cp, gp[2 * Hs + k] += dfp * cp;
          }
        }
        // The gate pre-activations' products: W and Wb see every gate; R and Rb every gate but
        // GRU's candidate, whose R part was taken above.
        const T* xt = X.as<T>() + x_off(st.t, b);
        double* dxt = dX.data() + x_off(st.t, b);
        for (size_t j = 0; j < GH; ++j) {
          const double g = da[j];
          if (g == 0) continue;
          for (int64_t q = 0; q < in; ++q) {
            gw[j * in + q] += g * xt[q];
            dxt[q] += g * w[j * in + q];
          }
          gwb[j] += g;
          const bool own_r = cell == Cell::gru && j >= 2 * Hs;
          if (own_r) continue;
          for (size_t q = 0; q < Hs; ++q) {
            gr[j * Hs + q] += g * st.hprev[q];
            dhn[q] += g * r[j * Hs + q];
          }
          grb[j] += g;
        }
        if (cell == Cell::gru && lbr)
          for (size_t k = 0; k < Hs; ++k) {
            const double g = tmp[k];
            for (size_t q = 0; q < Hs; ++q) {
              gr[(2 * Hs + k) * Hs + q] += g * st.hprev[q];
              dhn[q] += g * r[(2 * Hs + k) * Hs + q];
            }
            grb[2 * Hs + k] += g;
          }
      }
      for (size_t k = 0; k < Hs; ++k) {
        dH0[static_cast<size_t>(state_off(d, b)) + k] = dhn[k];
        dC0[static_cast<size_t>(state_off(d, b)) + k] = dcn[k];
      }
    }
  }
  const int dt = X.dtype;
  auto put = [&](int k, const Dims& dims, const std::vector<double>& v) {
    if (c.n_outputs() <= k) return;
    View o = c.out(k, dt, dims);
    std::transform(v.begin(), v.end(), o.as<T>(), [](double x) { return static_cast<T>(x); });
  };
  put(0, X.dims, dX);
  put(1, W.dims, dW);
  put(2, R.dims, dR);
  put(3, Dims{dirs, 2 * G * H}, dB);
  put(4, state_dims, dH0);
  if (cell == Cell::lstm) {
    put(5, state_dims, dC0);
    put(6, Dims{dirs, 3 * H}, dP);
  }
}

/// Float inputs of one type, sequence_lens (input 7) an integer type; absent inputs are -1.
bool grad_dtypes(const std::vector<int32_t>& d) {
  if (d.size() < 6 || (d[3] != HP_F32 && d[3] != HP_F64)) return false;
  for (size_t k = 0; k < d.size(); ++k) {
    if (d[k] == -1) continue;
    if (k == 7 ? (d[k] != HP_I32 && d[k] != HP_I64) : d[k] != d[3]) return false;
  }
  return true;
}

}  // namespace

void register_grad_rnn_ops(OpTable& t) {
  t["hp.train.RecurrentGrad"] = {[](OpCall& c) {
                                   if (c.need(3).dtype == HP_F32)
                                     recurrent_grad<float>(c);
                                   else
                                     recurrent_grad<double>(c);
                                 },
                                 grad_dtypes};
}

}  // namespace hp_cpu
