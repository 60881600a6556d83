// Padding, resampling and scans on the cpu backend: Pad (constant, edge, reflect, wrap; negative
// pads crop), Resize (nearest, N-linear and cubic, every coordinate transformation mode of opsets
// 10-19) and CumSum (exclusive, reverse).
//
// Pad and Resize map each output index to input indices dim by dim: a per-dim table is built once
// (source index, or -1 for "outside" in Pad; two taps and a weight in Resize), then the output is
// walked row-major, so the per-element work is a table lookup per dim (and, in Resize, a sum over
// the product of the dims' taps).
//
// Resize's antialias, axes and keep_aspect_ratio_policy other than "stretch" report HP_UNSUPPORTED
// (the executor names the node).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <functional>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

/// Pads before opset 11 are an attribute, from 11 an input (with optional axes from 18).
void pad(OpCall& c) {
  const View& x = c.need(0);
  const size_t r = x.dims.size();
  Dims pads;
  double value = 0;
  std::vector<int64_t> axes;
  if (c.opset() < 11) {
    pads = c.ints("pads");
    value = c.f("value", 0.0);
  } else {
    pads = c.need(1).ints();
    if (c.in(2).present() && c.in(2).numel() > 0) value = c.in(2).scalar();
    if (c.in(3).present()) axes = c.in(3).ints();
  }
  if (axes.empty())
    for (size_t d = 0; d < r; ++d) axes.push_back(static_cast<int64_t>(d));
  if (pads.size() != 2 * axes.size()) c.fail("pads must have two entries per padded axis");
  Dims begin(r, 0), end(r, 0);
  for (size_t k = 0; k < axes.size(); ++k) {
    const size_t a = static_cast<size_t>(c.axis(axes[k], static_cast<int64_t>(r)));
    begin[a] = pads[k];
    end[a] = pads[k + axes.size()];
  }
  const std::string mode = c.s("mode", "constant");
  if (mode != "constant" && mode != "edge" && mode != "reflect" && mode != "wrap")
    throw OpError("pad mode '" + mode + "' is not implemented", HP_UNSUPPORTED);
  Dims out(r);
  for (size_t d = 0; d < r; ++d) {
    out[d] = x.dims[d] + begin[d] + end[d];
    if (out[d] < 0) c.fail("pads remove more than the input has");
    if (mode != "constant" && x.dims[d] == 0 && out[d] > 0)
      c.fail("cannot " + mode + "-pad an empty dim");
  }
  View y = c.out(0, x.dtype, out);
  if (y.numel() == 0) return;
  // Per dim: the source index of each output index, -1 where the constant goes.
  std::vector<std::vector<int64_t>> src(r);
  for (size_t d = 0; d < r; ++d) {
    const int64_t n = x.dims[d];
    src[d].resize(static_cast<size_t>(out[d]));
    for (int64_t i = 0; i < out[d]; ++i) {
      int64_t s = i - begin[d];
      if (s < 0 || s >= n) {
        if (mode == "constant")
          s = -1;
        else if (mode == "edge")
          s = std::clamp<int64_t>(s, 0, n - 1);
        else if (mode == "wrap")
          s = ((s % n) + n) % n;
        else if (n == 1)
          s = 0;
        else {  // reflect about the edge elements, which are not repeated
          const int64_t period = 2 * (n - 1);
          s = ((s % period) + period) % period;
          if (s >= n) s = period - s;
        }
      }
      src[d][static_cast<size_t>(i)] = s;
    }
  }
  const Dims xs = strides_of(x.dims);
  const int es = dtype_size(x.dtype);
  std::vector<unsigned char> fill(static_cast<size_t>(es), 0);
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = static_cast<T>(value);
    std::memcpy(fill.data(), &v, sizeof v);
  });
  const char* px = static_cast<const char*>(x.data);
  char* py = static_cast<char*>(y.data);
  Dims idx(r, 0);
  for (int64_t i = 0, n = y.numel(); i < n; ++i) {
    int64_t off = 0;
    bool outside = false;
    for (size_t d = 0; d < r; ++d) {
      const int64_t s = src[d][static_cast<size_t>(idx[d])];
      if (s < 0) {
        outside = true;
        break;
      }
      off += s * xs[d];
    }
    std::memcpy(py + i * es,
                outside ? fill.data() : reinterpret_cast<const unsigned char*>(px + off * es),
                static_cast<size_t>(es));
    for (size_t d = r; d-- > 0;) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
}

void cumsum(OpCall& c) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  const size_t a = static_cast<size_t>(c.axis(c.need(1).ints().at(0), r));
  const bool exclusive = c.i("exclusive", 0) != 0, reverse = c.i("reverse", 0) != 0;
  View y = c.out(0, x.dtype, x.dims);
  int64_t outer = 1, len = x.dims[a], inner = 1;
  for (size_t d = 0; d < a; ++d) outer *= x.dims[d];
  for (size_t d = a + 1; d < x.dims.size(); ++d) inner *= x.dims[d];
  dispatch_num(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    T* py = y.as<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        T acc = 0;
        for (int64_t k = 0; k < len; ++k) {
          const int64_t i = reverse ? len - 1 - k : k;
          const int64_t at = (o * len + i) * inner + in;
          if (exclusive) {
            py[at] = acc;
            acc = wrapping(acc, px[at], std::plus<>());
          } else {
            acc = wrapping(acc, px[at], std::plus<>());
            py[at] = acc;
          }
        }
      }
  });
}

/// One output index of one dim of Resize: up to four input taps and their weights (1 for nearest, 2
/// for linear, 4 for cubic); `outside` for a tf_crop_and_resize point off the input.
struct Tap {
  int n = 1;
  int64_t idx[4] = {0, 0, 0, 0};
  double w[4] = {1, 0, 0, 0};
  bool outside = false;
};

/// Cubic convolution weights (Keys, coefficient a) of the taps at floor(x) - 1 .. floor(x) + 2, t =
/// x - floor(x).
void cubic_weights(double t, double a, double* w) {
  const double d[4] = {t + 1, t, 1 - t, 2 - t};
  for (int k = 0; k < 4; ++k) {
    const double z = d[k];
    w[k] = z <= 1 ? ((a + 2) * z - (a + 3)) * z * z + 1 : ((a * z - 5 * a) * z + 8 * a) * z - 4 * a;
  }
}

double original_coord(const std::string& mode, double x, double scale, int64_t in, int64_t out,
                      double roi_start, double roi_end) {
  if (mode == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (mode == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (mode == "align_corners") {
    // The resized length is in * scale before flooring, as in the ONNX reference (sizes give out /
    // in).
    const double len = static_cast<double>(in) * scale;
    return out == 1 ? 0.0 : x * static_cast<double>(in - 1) / (len - 1);
  }
  if (mode == "asymmetric") return x / scale;
  if (mode == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (mode == "half_pixel_symmetric") {
    const double adj = static_cast<double>(out) / (scale * static_cast<double>(in));
    const double center = static_cast<double>(in) / 2, offset = center * (1 - adj);
    return offset + (x + 0.5) / scale - 0.5;
  }
  // tf_crop_and_resize
  return out > 1 ? roi_start * static_cast<double>(in - 1) + x * (roi_end - roi_start) *
                                                                 static_cast<double>(in - 1) /
                                                                 static_cast<double>(out - 1)
                 : 0.5 * (roi_start + roi_end) * static_cast<double>(in - 1);
}

int64_t nearest_index(const std::string& mode, double x) {
  const double f = std::floor(x);
  if (mode == "floor") return static_cast<int64_t>(f);
  if (mode == "ceil") return static_cast<int64_t>(std::ceil(x));
  if (x - f == 0.5) return static_cast<int64_t>(mode == "round_prefer_ceil" ? f + 1 : f);
  return static_cast<int64_t>(std::round(x));
}

void resize(OpCall& c) {
  const View& x = c.need(0);
  const size_t r = x.dims.size();
  const std::string mode = c.s("mode", "nearest");
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    throw OpError("resize mode '" + mode + "' is not implemented", HP_UNSUPPORTED);
  if (c.i("antialias", 0) != 0)
    throw OpError("resize with antialias is not implemented", HP_UNSUPPORTED);
  if (c.s("keep_aspect_ratio_policy", "stretch") != "stretch")
    throw OpError("keep_aspect_ratio_policy other than stretch is not implemented", HP_UNSUPPORTED);
  if (c.has("axes")) throw OpError("resize with axes is not implemented", HP_UNSUPPORTED);
  // Opset 10: (X, scales), asymmetric coordinates, nearest rounds down. From 11: (X, roi, scales,
  // sizes).
  const bool v10 = c.opset() < 11;
  const std::string coord =
      v10 ? "asymmetric" : c.s("coordinate_transformation_mode", "half_pixel");
  const std::string nearest = v10 ? "floor" : c.s("nearest_mode", "round_prefer_floor");
  const double extrapolation = c.f("extrapolation_value", 0.0);
  std::vector<double> scales, roi;
  std::vector<int64_t> sizes;
  const View& sc = c.in(v10 ? 1 : 2);
  for (const View* v : {&sc, &c.in(1)})
    if (v->present() && v->dtype != HP_F32 && v->dtype != HP_F64)
      c.fail("scales and roi must be float32 or float64");  // read as such below
  if (sc.present() && sc.numel() > 0) {
    for (int64_t k = 0; k < sc.numel(); ++k)
      scales.push_back(sc.dtype == HP_F64 ? sc.as<double>()[k]
                                          : static_cast<double>(sc.as<float>()[k]));
  }
  if (!v10 && c.in(3).present() && c.in(3).numel() > 0) sizes = c.in(3).ints();
  if (!v10 && c.in(1).present() && c.in(1).numel() > 0) {
    const View& ro = c.in(1);
    for (int64_t k = 0; k < ro.numel(); ++k)
      roi.push_back(ro.dtype == HP_F64 ? ro.as<double>()[k]
                                       : static_cast<double>(ro.as<float>()[k]));
  }
  if (scales.empty() == sizes.empty()) c.fail("exactly one of scales and sizes must be given");
  Dims out(r);
  for (size_t d = 0; d < r; ++d) {
    if (!sizes.empty()) {
      if (sizes.size() != r) c.fail("sizes must have one entry per dim");
      out[d] = sizes[d];
      scales.resize(r);
    } else {
      if (scales.size() != r) c.fail("scales must have one entry per dim");
      if (!(scales[d] > 0)) c.fail("scales must be positive");
      out[d] = static_cast<int64_t>(std::floor(static_cast<double>(x.dims[d]) * scales[d]));
    }
  }
  if (!sizes.empty())
    for (size_t d = 0; d < r; ++d)
      scales[d] = x.dims[d] ? static_cast<double>(out[d]) / static_cast<double>(x.dims[d]) : 1.0;
  if (coord == "tf_crop_and_resize" && roi.size() != 2 * r)
    c.fail("tf_crop_and_resize needs an roi of 2 x rank values");
  View y = c.out(0, x.dtype, out);
  if (y.numel() == 0 || x.numel() == 0) return;
  const double cubic_a = c.f("cubic_coeff_a", -0.75);
  const bool exclude_outside = c.i("exclude_outside", 0) != 0;
  std::vector<std::vector<Tap>> taps(r);
  for (size_t d = 0; d < r; ++d) {
    const int64_t in = x.dims[d];
    taps[d].resize(static_cast<size_t>(out[d]));
    for (int64_t i = 0; i < out[d]; ++i) {
      Tap& t = taps[d][static_cast<size_t>(i)];
      if (scales[d] == 1.0 && in == out[d] &&
          coord != "tf_crop_and_resize") {  // an unscaled dim maps to itself
        t.idx[0] = i;
        continue;
      }
      const double xo = original_coord(coord, static_cast<double>(i), scales[d], in, out[d],
                                       roi.empty() ? 0 : roi[d], roi.empty() ? 1 : roi[d + r]);
      if (coord == "tf_crop_and_resize" && (xo < 0 || xo > static_cast<double>(in - 1))) {
        t.outside = true;
        continue;
      }
      if (mode == "nearest") {
        t.idx[0] = std::clamp<int64_t>(nearest_index(nearest, xo), 0, in - 1);
      } else if (mode == "linear") {
        const double xc = std::clamp(xo, 0.0, static_cast<double>(in - 1));
        t.n = 2;
        t.idx[0] = static_cast<int64_t>(std::floor(xc));
        t.idx[1] = std::min(t.idx[0] + 1, in - 1);
        t.w[1] = xc - static_cast<double>(t.idx[0]);
        t.w[0] = 1 - t.w[1];
      } else {  // cubic: taps past the edge repeat the edge value, or with exclude_outside drop out
        const double f = std::floor(xo);
        t.n = 4;
        cubic_weights(xo - f, cubic_a, t.w);
        double sum = 0;
        for (int k = 0; k < 4; ++k) {
          const int64_t at = static_cast<int64_t>(f) - 1 + k;
          if (exclude_outside && (at < 0 || at >= in)) t.w[k] = 0;
          sum += t.w[k];
          t.idx[k] = std::clamp<int64_t>(at, 0, in - 1);
        }
        if (exclude_outside && sum != 0)
          for (double& w : t.w) w /= sum;
      }
    }
  }
  const Dims xs = strides_of(x.dims);
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    T* py = y.as<T>();
    Dims idx(r, 0);
    std::vector<int> k(r, 0);  // the tap of each dim in the current combination
    for (int64_t i = 0, n = y.numel(); i < n; ++i) {
      bool outside = false;
      for (size_t d = 0; d < r; ++d)
        outside = outside || taps[d][static_cast<size_t>(idx[d])].outside;
      double v = 0;
      if (outside) {
        v = extrapolation;
      } else {
        std::fill(k.begin(), k.end(), 0);
        while (true) {  // every combination of the dims' taps
          double w = 1;
          int64_t off = 0;
          for (size_t d = 0; d < r; ++d) {
            const Tap& t = taps[d][static_cast<size_t>(idx[d])];
            w *= t.w[k[d]];
            off += t.idx[k[d]] * xs[d];
          }
          if (w != 0) v += w * static_cast<double>(px[off]);
          size_t d = r;
          while (d-- > 0) {
            if (++k[d] < taps[d][static_cast<size_t>(idx[d])].n) break;
            k[d] = 0;
          }
          if (d == static_cast<size_t>(-1)) break;
        }
      }
      if constexpr (std::is_floating_point_v<T>)
        py[i] = static_cast<T>(v);
      else
        py[i] = static_cast<T>(std::nearbyint(v));
      for (size_t d = r; d-- > 0;) {
        if (++idx[d] < out[d]) break;
        idx[d] = 0;
      }
    }
  });
}

}  // namespace

void register_resample_ops(OpTable& t) {
  t["Pad"] = {pad, [](const std::vector<int32_t>& d) {
                return !d.empty() && d[0] >= 0 && dtype_size(d[0]) > 0;
              }};
  t["CumSum"] = {cumsum,
                 [](const std::vector<int32_t>& d) { return d.size() == 2 && is_num(d[0]); }};
  t["Resize"] = {resize, [](const std::vector<int32_t>& d) {
                   return !d.empty() && d[0] >= 0 && dtype_size(d[0]) > 0;
                 }};
  // Upsample (opset 9, deprecated) is Resize of opset 10: (X, scales), asymmetric coordinates,
  // nearest rounding down. Before opset 9 its scales were an attribute, which resize does not read.
  t["Upsample"] = {[](OpCall& c) {
                     if (c.opset() < 9 || c.opset() > 10)
                       throw OpError("Upsample is implemented for opsets 9 and 10", HP_UNSUPPORTED);
                     resize(c);
                   },
                   t["Resize"].accepts};
}

}  // namespace hp_cpu
