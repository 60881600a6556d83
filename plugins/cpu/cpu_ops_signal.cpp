// The ONNX signal ops on the cpu backend (f32): DFT, STFT, MelWeightMatrix and the window functions
// HannWindow, HammingWindow and BlackmanWindow (what STFT front ends multiply frames by).
//
// DFT and STFT are direct O(n^2) transforms in double: X[k] = sum_n x[n] e^(-2 pi i k n / N)
// (e^(+...) / N for the inverse). Signals carry a trailing dim of 1 (real) or 2 (real, imaginary),
// outputs always 2; onesided keeps the N / 2 + 1 bins a real signal's spectrum is determined by.
//
// Each is a cosine sum w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N) for n in [0, size), with
// N = size for a periodic window (the default, for spectral analysis) and size - 1 for a symmetric
// one (filter design). Hamming's coefficients are ONNX's 25/46 and 21/46.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

int onnx_float_type(const OpCall& c) {
  switch (c.i("output_datatype", 1)) {
    case 1: return HP_F32;
    case 11: return HP_F64;
    default: throw OpError("output_datatype must be float or double", HP_UNSUPPORTED);
  }
}

void window(OpCall& c, double a0, double a1, double a2) {
  const View& s = c.need(0);
  if (s.numel() != 1) c.fail("size must be a scalar");
  const int64_t size = s.ints()[0];
  if (size < 0) c.fail("size must not be negative");
  const double N = c.i("periodic", 1) ? double(size) : double(size - 1);
  const int dt = onnx_float_type(c);
  View y = c.out(0, dt, {size});
  for (int64_t n = 0; n < size; ++n) {
    const double x = N > 0 ? 2 * M_PI * double(n) / N : 0.0;
    const double v = a0 - a1 * std::cos(x) + a2 * std::cos(2 * x);
    if (dt == HP_F32)
      y.as<float>()[n] = static_cast<float>(v);
    else
      y.as<double>()[n] = v;
  }
}

/// The DFT of n complex values (re, im) read with stride `in_st`, written as `bins` (re, im)
/// pairs with stride `out_st`; len > n zero-pads.
void dft_1d(const float* in, int64_t in_st, int64_t n, bool complex_in, int64_t len, bool inverse,
            int64_t bins, float* out, int64_t out_st) {
  const double sign = inverse ? 1.0 : -1.0;
  for (int64_t k = 0; k < bins; ++k) {
    double re = 0, im = 0;
    for (int64_t t = 0; t < std::min(n, len); ++t) {
      const double xr = in[t * in_st], xi = complex_in ? in[t * in_st + 1] : 0.0;
      const double a = sign * 2 * M_PI * double((k * t) % len) / double(len);
      re += xr * std::cos(a) - xi * std::sin(a);
      im += xr * std::sin(a) + xi * std::cos(a);
    }
    if (inverse) re /= double(len), im /= double(len);
    out[k * out_st] = static_cast<float>(re);
    out[k * out_st + 1] = static_cast<float>(im);
  }
}

void dft(OpCall& c) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  if (r < 3 || (x.dims.back() != 1 && x.dims.back() != 2))
    c.fail("input must be [batch, ..., 1 or 2], got " + dims_str(x.dims));
  const int64_t ax = c.axis(c.i("axis", 1), r - 1);
  if (ax == 0) c.fail("axis 0 is the batch dim");
  const bool inverse = c.i("inverse", 0) != 0, onesided = c.i("onesided", 0) != 0;
  const bool cplx = x.dims.back() == 2;
  const int64_t n = x.dims[ax];
  const int64_t len = c.in(1).present() && c.in(1).numel() > 0 ? c.in(1).ints()[0] : n;
  if (len <= 0) c.fail("dft_length must be positive");
  const int64_t bins = onesided ? len / 2 + 1 : len;
  Dims od = x.dims;
  od[ax] = bins;
  od.back() = 2;
  View y = c.out(0, HP_F32, od);
  const Dims xs = strides_of(x.dims), ys = strides_of(od);
  // Every index of the other dims (the last one excluded) starts one transform.
  Dims outer(x.dims.begin(), x.dims.end() - 1);
  outer[ax] = 1;
  const Dims ost = strides_of(outer);
  for (int64_t q = 0, nq = numel(outer); q < nq; ++q) {
    int64_t xo = 0, yo = 0;
    for (size_t d = 0; d < outer.size(); ++d) {
      const int64_t i = q / ost[d] % outer[d];
      xo += i * xs[d];
      yo += i * ys[d];
    }
    dft_1d(x.as<float>() + xo, xs[ax], n, cplx, len, inverse, bins, y.as<float>() + yo, ys[ax]);
  }
}

void stft(OpCall& c) {
  const View &x = c.need(0), &window = c.in(2);
  if (x.dims.size() != 3 || (x.dims[2] != 1 && x.dims[2] != 2))
    c.fail("signal must be [batch, length, 1 or 2], got " + dims_str(x.dims));
  const int64_t step = c.need(1).ints().at(0);
  int64_t flen = c.in(3).present() && c.in(3).numel() > 0 ? c.in(3).ints()[0] : -1;
  if (window.present()) {
    if (window.dims.size() != 1) c.fail("window must be 1-D");
    if (flen < 0) flen = window.dims[0];
    if (flen != window.dims[0]) c.fail("frame_length differs from the window's length");
  }
  if (flen <= 0 || step <= 0) c.fail("frame_length and frame_step must be positive");
  const int64_t B = x.dims[0], L = x.dims[1], ch = x.dims[2];
  if (L < flen) c.fail("the signal is shorter than one frame");
  const int64_t frames = 1 + (L - flen) / step;
  const bool onesided = c.i("onesided", 1) != 0;
  const int64_t bins = onesided ? flen / 2 + 1 : flen;
  View y = c.out(0, HP_F32, {B, frames, bins, 2});
  std::vector<float> frame(static_cast<size_t>(flen * ch));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < frames; ++f) {
      for (int64_t t = 0; t < flen; ++t)
        for (int64_t k = 0; k < ch; ++k) {
          const float w = window.present() ? window.as<float>()[t] : 1.f;
          frame[t * ch + k] = x.as<float>()[(b * L + f * step + t) * ch + k] * w;
        }
      dft_1d(frame.data(), ch, flen, ch == 2, flen, false, bins,
             y.as<float>() + (b * frames + f) * bins * 2, 2);
    }
}

/// MelWeightMatrix: [dft_length / 2 + 1, num_mel_bins] triangular filters, computed as the ONNX
/// definition's reference does: num_mel_bins + 2 edges evenly spaced in mel (2595 log10(1 + f /
/// 700)) from the lower edge, in steps of the mel range / (num_mel_bins + 2), mapped back to hertz
/// and to spectrogram bins floor((dft_length + 1) f / sample_rate); filter i rises from edge i to
/// edge i + 1 and falls to edge i + 2.
void mel_weight_matrix(OpCall& c) {
  const int64_t mels = c.need(0).ints().at(0), dft_len = c.need(1).ints().at(0),
                rate = c.need(2).ints().at(0);
  const double lo = c.need(3).scalar(), hi = c.need(4).scalar();
  if (mels <= 0 || dft_len <= 0 || rate <= 0)
    c.fail("bins, dft_length and sample_rate must be > 0");
  const int64_t spec_bins = dft_len / 2 + 1;
  const double lo_mel = 2595 * std::log10(1 + lo / 700), hi_mel = 2595 * std::log10(1 + hi / 700);
  const double step = (hi_mel - lo_mel) / double(mels + 2);
  std::vector<int64_t> edge(static_cast<size_t>(mels + 2));
  for (int64_t i = 0; i < mels + 2; ++i) {
    const double hz = 700 * (std::pow(10.0, (double(i) * step + lo_mel) / 2595) - 1);
    edge[i] = static_cast<int64_t>(std::floor(double(dft_len + 1) * hz / double(rate)));
    if (edge[i] < 0 || edge[i] >= spec_bins) c.fail("a mel edge falls outside the spectrogram");
  }
  const int dt = onnx_float_type(c);
  std::vector<double> w(static_cast<size_t>(spec_bins * mels), 0.0);
  for (int64_t i = 0; i < mels; ++i) {
    const int64_t l = edge[i], m = edge[i + 1], h = edge[i + 2];
    if (m == l)
      w[m * mels + i] = 1;
    else
      for (int64_t j = l; j <= m; ++j) w[j * mels + i] = double(j - l) / double(m - l);
    for (int64_t j = m; j < h; ++j) w[j * mels + i] = double(h - j) / double(h - m);
  }
  View y = c.out(0, dt, {spec_bins, mels});
  for (size_t k = 0; k < w.size(); ++k) {
    if (dt == HP_F32)
      y.as<float>()[k] = static_cast<float>(w[k]);
    else
      y.as<double>()[k] = w[k];
  }
}

bool int_scalar(const std::vector<int32_t>& d) {
  return d.size() == 1 && (d[0] == HP_I32 || d[0] == HP_I64);
}

}  // namespace

void register_signal_ops(OpTable& t) {
  t["DFT"] = {dft, [](const std::vector<int32_t>& d) { return !d.empty() && d[0] == HP_F32; }};
  t["STFT"] = {stft, [](const std::vector<int32_t>& d) {
                 return d.size() >= 2 && d[0] == HP_F32 && (d[1] == HP_I64 || d[1] == HP_I32);
               }};
  t["MelWeightMatrix"] = {mel_weight_matrix, [](const std::vector<int32_t>& d) {
                            return d.size() == 5 && is_int(d[0]) && is_int(d[1]) && is_int(d[2]) &&
                                   is_num(d[3]) && is_num(d[4]);
                          }};
  t["HannWindow"] = {[](OpCall& c) { window(c, 0.5, 0.5, 0); }, int_scalar};
  t["HammingWindow"] = {[](OpCall& c) { window(c, 25.0 / 46, 21.0 / 46, 0); }, int_scalar};
  t["BlackmanWindow"] = {[](OpCall& c) { window(c, 0.42, 0.5, 0.08); }, int_scalar};
}

}  // namespace hp_cpu
