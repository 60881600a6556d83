// ConvTranspose on the cpu backend (f32): the gradient of Conv with respect to its input, the
// upsampling layer of decoders and segmentation heads.
//
// Every input element scatters x * w into a "full" output of size stride*(in-1) + (k-1)*dil + 1 +
// output_padding per spatial dim; the result is that full output cropped by the begin pads (a
// negative pad, which output_shape can imply, adds zeros instead). Pads come from `pads`, or from
// output_shape / auto_pad as the ONNX definition gives them: total = full - output size, with
// floor(total / 2) at the start for SAME_UPPER and at the end otherwise (a negative total, an
// output larger than the full one, so adds its zeros at the end under NOTSET). A direct loop:
// decoders of the test models are small; oneDNN's deconvolution primitive is the next step for
// large ones.
#include <algorithm>
#include <string>
#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

void conv_transpose(OpCall& c) {
  const View &x = c.need(0), &w = c.need(1), &bias = c.in(2);
  if (x.dims.size() < 3 || w.dims.size() != x.dims.size())
    c.fail("input and weight must have the same rank >= 3");
  const size_t sp = x.dims.size() - 2;
  const int64_t N = x.dims[0], C = x.dims[1], G = c.i("group", 1);
  if (G <= 0 || C % G || w.dims[0] != C) c.fail("weight dim 0 must equal the input channels");
  const int64_t mg = w.dims[1], M = mg * G, cg = C / G;
  if (bias.present() && bias.numel() != M) c.fail("bias must have one value per output channel");
  auto attr = [&](const char* name, int64_t dflt) {
    std::vector<int64_t> v = c.ints(name);
    if (v.empty()) v.assign(sp, dflt);
    if (v.size() != sp) c.fail(std::string(name) + " must have one value per spatial dim");
    return v;
  };
  const std::vector<int64_t> strides = attr("strides", 1), dil = attr("dilations", 1),
                             opad = attr("output_padding", 0);
  Dims k(w.dims.begin() + 2, w.dims.end()), in(x.dims.begin() + 2, x.dims.end()), full(sp);
  for (size_t d = 0; d < sp; ++d)
    full[d] = strides[d] * (in[d] - 1) + (k[d] - 1) * dil[d] + 1 + opad[d];
  std::vector<int64_t> begin(sp, 0), out(sp);
  const std::string autopad = c.s("auto_pad", "NOTSET");
  const std::vector<int64_t> oshape = c.ints("output_shape");
  if (!oshape.empty() || autopad == "SAME_UPPER" || autopad == "SAME_LOWER") {
    for (size_t d = 0; d < sp; ++d) {
      if (!oshape.empty())
        out[d] = oshape[oshape.size() - sp + d];
      else
        out[d] = in[d] * strides[d];
      const int64_t total = full[d] - out[d];
      const int64_t small = total >= 0 ? total / 2 : -((-total + 1) / 2);  // floor(total / 2)
      begin[d] = autopad == "SAME_UPPER" ? small : total - small;
    }
  } else {
    std::vector<int64_t> pads = c.ints("pads");
    if (pads.empty()) pads.assign(2 * sp, 0);
    if (pads.size() != 2 * sp) c.fail("pads must have two values per spatial dim");
    for (size_t d = 0; d < sp; ++d) {
      begin[d] = pads[d];
      out[d] = full[d] - pads[d] - pads[sp + d];
    }
  }
  Dims od = {N, M};
  od.insert(od.end(), out.begin(), out.end());
  View y = c.out(0, x.dtype, od);
  const int64_t fn = numel(full), on = numel(out), in_n = numel(in), kn = numel(k);
  const Dims fst = strides_of(full), ist = strides_of(in), kst = strides_of(k),
             ost = strides_of(out);
  std::vector<double> acc(static_cast<size_t>(fn));
  const float* px = x.as<float>();
  const float* pw = w.as<float>();
  std::vector<int64_t> koff(static_cast<size_t>(kn));  // offset in `full` of each kernel tap
  for (int64_t kp = 0; kp < kn; ++kp) {
    int64_t o = 0;
    for (size_t d = 0; d < sp; ++d) o += (kp / kst[d] % k[d]) * dil[d] * fst[d];
    koff[kp] = o;
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t g = m / mg, mi = m % mg;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t ci = 0; ci < cg; ++ci) {
        const int64_t ch = g * cg + ci;
        const float* xs = px + (n * C + ch) * in_n;
        const float* ws = pw + (ch * mg + mi) * kn;
        for (int64_t ip = 0; ip < in_n; ++ip) {
          int64_t base = 0;
          for (size_t d = 0; d < sp; ++d) base += (ip / ist[d] % in[d]) * strides[d] * fst[d];
          const double v = xs[ip];
          for (int64_t kp = 0; kp < kn; ++kp) acc[base + koff[kp]] += v * ws[kp];
        }
      }
      float* ys = y.as<float>() + (n * M + m) * on;
      const double b = bias.present() ? bias.as<float>()[m] : 0.0;
      for (int64_t op = 0; op < on; ++op) {
        int64_t f = 0;
        bool inside = true;
        for (size_t d = 0; d < sp && inside; ++d) {
          const int64_t pos = op / ost[d] % out[d] + begin[d];
          inside = pos >= 0 && pos < full[d];
          f += pos * fst[d];
        }
        ys[op] = static_cast<float>((inside ? acc[f] : 0.0) + b);
      }
    }
}

}  // namespace

void register_convt_ops(OpTable& t) { t["ConvTranspose"] = {conv_transpose, all_f32}; }

}  // namespace hp_cpu
