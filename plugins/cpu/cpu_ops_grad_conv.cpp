// ConvGrad, MaxPoolGrad and AveragePoolGrad of the "hp.train" domain (docs/training.md) on the cpu
// backend, f32 and f64.
//
// ConvGrad takes the forward Conv's attributes and recomputes its geometry (as cpu_ops_nn.cpp's
// Conv does), checking that dY has the forward's output shape. f32 dX of a 3x3, stride-1
// convolution runs by Winograd where cpu_winograd.cpp takes the shape; the rest of f32 runs on
// oneDNN's backward convolution primitives (created per call: a cache like cpu_gemm.cpp's would
// save their JIT time). f64, which oneDNN lacks, and any geometry oneDNN rejects run direct loops
// that treat 1-, 2- and 3-D convolutions as 3-D ones with unit leading dims: dX split across
// threads by (n, input channel), dW and dB by output channel, so no two threads write one element.
// For each kernel tap the range of output positions that read inside the input is computed up
// front, so the innermost loop has no bounds test. The ABI gives a kernel no way to tell an output
// the node names with "" from a used one, so ConvGrad computes every output up to the node's count.
//
// The pool gradients walk the forward's windows (cpu_pool_window.h): MaxPoolGrad adds dY at each
// window's first maximum (the element the forward's Indices output names), AveragePoolGrad spreads
// dY evenly over the window with the forward's divisor.
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu_grad.h"
#include "cpu_ops.h"
#include "cpu_pool_window.h"
#include "cpu_winograd.h"

namespace hp_cpu {
namespace {

using grad::dispatch_float;

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

/// Convolution geometry as 3 spatial dims (leading ones of size 1 for 1-D and 2-D).
struct ConvGeom {
  int64_t N = 0, C = 0, M = 0, group = 1, cg = 0, mg = 0;
  int64_t in[3], k[3], out[3], s[3], p[3], pe[3], d[3];
  size_t sp = 0;  // the real spatial rank: dims [3 - sp, 3) of the arrays
  Dims out_dims;
};

ConvGeom conv_geom(const OpCall& c, const View& x, const View& w) {
  const size_t r = x.dims.size();
  if (r < 3 || r > 5 || w.dims.size() != r)
    c.fail("ConvGrad needs N x C x spatial X (1 to 3 spatial dims) and W of its rank, got X " +
           dims_str(x.dims) + " W " + dims_str(w.dims));
  const size_t sp = r - 2;
  ConvGeom g;
  g.N = x.dims[0];
  g.C = x.dims[1];
  g.M = w.dims[0];
  g.group = c.i("group", 1);
  if (g.group < 1 || g.C != w.dims[1] * g.group || g.M % g.group)
    c.fail("channels of X " + dims_str(x.dims) + " do not match W " + dims_str(w.dims) +
           " and group " + std::to_string(g.group));
  g.cg = g.C / g.group;
  g.mg = g.M / g.group;
  Dims strides = c.ints("strides"), dil = c.ints("dilations"), pads = c.ints("pads");
  const Dims ks = c.ints("kernel_shape");
  if (!ks.empty() && !std::equal(ks.begin(), ks.end(), w.dims.begin() + 2, w.dims.end()))
    c.fail("kernel_shape differs from W's spatial dims");
  strides.resize(sp, 1);
  dil.resize(sp, 1);
  pads.resize(2 * sp, 0);
  const std::string ap = c.s("auto_pad", "NOTSET");
  g.out_dims = {g.N, g.M};
  const size_t lead = 3 - sp;
  g.sp = sp;
  for (size_t q = 0; q < 3; ++q) {
    g.in[q] = g.k[q] = g.out[q] = g.s[q] = g.d[q] = 1;
    g.p[q] = g.pe[q] = 0;
  }
  for (size_t a = 0; a < sp; ++a) {
    const size_t q = lead + a;
    g.in[q] = x.dims[2 + a];
    g.k[q] = w.dims[2 + a];
    g.s[q] = strides[a];
    g.d[q] = dil[a];
    if (g.s[q] < 1 || g.d[q] < 1 || g.k[q] < 1)
      c.fail("strides, dilations and kernel must be >= 1");
    const int64_t span = (g.k[q] - 1) * g.d[q] + 1;
    int64_t pb = pads[a], pe = pads[a + sp];
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      const int64_t o = (g.in[q] + g.s[q] - 1) / g.s[q];
      const int64_t total = std::max<int64_t>((o - 1) * g.s[q] + span - g.in[q], 0);
      pb = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else if (ap == "VALID") {
      pb = pe = 0;
    }
    if (pb < 0 || pe < 0) c.fail("negative pads");
    const int64_t room = g.in[q] + pb + pe - span;
    if (room < 0) c.fail("the kernel is larger than the padded input");
    g.p[q] = pb;
    g.pe[q] = pe;
    g.out[q] = room / g.s[q] + 1;
    g.out_dims.push_back(g.out[q]);
  }
  return g;
}

/// The output positions o in [0, out) whose tap at offset `off` (= k * dilation) reads inside the
/// input: 0 <= o * s - p + off < in.
void tap_range(int64_t out, int64_t in, int64_t s, int64_t p, int64_t off, int64_t& lo,
               int64_t& hi) {
  lo = std::max<int64_t>(0, -floor_div(off - p, s));  // ceil((p - off) / s)
  hi = std::min<int64_t>(out, floor_div(in - 1 + p - off, s) + 1);
  if (hi < lo) hi = lo;
}

template <class T>
void conv_grad_typed(OpCall& c, const ConvGeom& g, const View& dy, const View& x, const View& w) {
  const T *pg = dy.as<T>(), *px = x.as<T>(), *pw = w.as<T>();
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
  const int64_t kn = g.k[0] * g.k[1] * g.k[2];
  const int64_t work = g.N * g.M * g.cg * out_plane * kn;
  // Output positions that tap (kd, kh, kw) reads inside the input, per spatial dim.
  struct Range {
    int64_t lo, hi;
  };
  std::vector<Range> rng[3];
  for (int q = 0; q < 3; ++q)
    for (int64_t k = 0; k < g.k[q]; ++k) {
      Range r{};
      tap_range(g.out[q], g.in[q], g.s[q], g.p[q], k * g.d[q], r.lo, r.hi);
      rng[q].push_back(r);
    }
  // Calls f(out_offset, in_offset, count, in_step) for every run of output positions along the
  // last dim that tap (a, b, e) maps inside the input.
  auto for_tap = [&](int64_t a, int64_t b, int64_t e, auto&& f) {
    const Range ra = rng[0][static_cast<size_t>(a)], rb = rng[1][static_cast<size_t>(b)],
                re = rng[2][static_cast<size_t>(e)];
    if (re.hi <= re.lo) return;
    for (int64_t o0 = ra.lo; o0 < ra.hi; ++o0)
      for (int64_t o1 = rb.lo; o1 < rb.hi; ++o1) {
        const int64_t i0 = o0 * g.s[0] - g.p[0] + a * g.d[0],
                      i1 = o1 * g.s[1] - g.p[1] + b * g.d[1],
                      i2 = re.lo * g.s[2] - g.p[2] + e * g.d[2];
        f((o0 * g.out[1] + o1) * g.out[2] + re.lo, (i0 * g.in[1] + i1) * g.in[2] + i2,
          re.hi - re.lo, g.s[2]);
      }
  };
  if (c.n_outputs() > 0) {
    View dx = c.out(0, x.dtype, x.dims);
    T* pdx = dx.as<T>();
#pragma omp parallel for schedule(static) if (work >= (1 << 16))
    for (int64_t nc = 0; nc < g.N * g.C; ++nc) {
      const int64_t n = nc / g.C, ci = nc % g.C, grp = ci / g.cg, cl = ci % g.cg;
      T* plane = pdx + nc * in_plane;
      std::fill(plane, plane + in_plane, T(0));
      for (int64_t m = grp * g.mg; m < (grp + 1) * g.mg; ++m) {
        const T* gy = pg + (n * g.M + m) * out_plane;
        const T* wk = pw + (m * g.cg + cl) * kn;
        for (int64_t a = 0; a < g.k[0]; ++a)
          for (int64_t b = 0; b < g.k[1]; ++b)
            for (int64_t e = 0; e < g.k[2]; ++e) {
              const T wv = wk[(a * g.k[1] + b) * g.k[2] + e];
              for_tap(a, b, e, [&](int64_t oo, int64_t io, int64_t cnt, int64_t st) {
                for (int64_t j = 0; j < cnt; ++j) plane[io + j * st] += wv * gy[oo + j];
              });
            }
      }
    }
  }
  if (c.n_outputs() > 1) {
    View dw = c.out(1, w.dtype, w.dims);
    T* pdw = dw.as<T>();
#pragma omp parallel for schedule(static) if (work >= (1 << 16))
    for (int64_t m = 0; m < g.M; ++m) {
      const int64_t grp = m / g.mg;
      for (int64_t cl = 0; cl < g.cg; ++cl)
        for (int64_t a = 0; a < g.k[0]; ++a)
          for (int64_t b = 0; b < g.k[1]; ++b)
            for (int64_t e = 0; e < g.k[2]; ++e) {
              double acc = 0;
              for (int64_t n = 0; n < g.N; ++n) {
                const T* gy = pg + (n * g.M + m) * out_plane;
                const T* xp = px + (n * g.C + grp * g.cg + cl) * in_plane;
                for_tap(a, b, e, [&](int64_t oo, int64_t io, int64_t cnt, int64_t st) {
                  for (int64_t j = 0; j < cnt; ++j)
                    acc += static_cast<double>(gy[oo + j]) * xp[io + j * st];
                });
              }
              pdw[((m * g.cg + cl) * g.k[0] + a) * g.k[1] * g.k[2] + b * g.k[2] + e] =
                  static_cast<T>(acc);
            }
    }
  }
  if (c.n_outputs() > 2) {
    View db = c.out(2, dy.dtype, {g.M});
    for (int64_t m = 0; m < g.M; ++m) {
      double acc = 0;
      for (int64_t n = 0; n < g.N; ++n) {
        const T* gy = pg + (n * g.M + m) * out_plane;
        for (int64_t j = 0; j < out_plane; ++j) acc += gy[j];
      }
      db.as<T>()[m] = static_cast<T>(acc);
    }
  }
}

/// dX of a float32 3x3, stride-1 convolution by Winograd (cpu_winograd.cpp): the correlation of dY
/// with the filters turned half a turn and their two channel axes swapped, padded 2 - p on each
/// side, is the input gradient. False (nothing written) where the Winograd kernel does not take
/// the geometry.
bool conv_grad_x_winograd(OpCall& c, const ConvGeom& g, const View& dy, const View& x,
                          const View& w) {
  if (g.sp != 2 || g.group != 1 || c.n_outputs() < 1) return false;
  for (size_t q = 1; q < 3; ++q)
    if (g.k[q] != 3 || g.s[q] != 1 || g.d[q] != 1 || g.p[q] > 2 || g.pe[q] > 2) return false;
  ConvShape s;
  s.x = {g.N, g.M, g.out[1], g.out[2]};
  s.w = {g.C, g.M, 3, 3};
  s.y = {g.N, g.C, g.in[1], g.in[2]};
  s.strides = {1, 1};
  s.dilations = {1, 1};
  s.pads = {2 - g.p[1], 2 - g.p[2], 2 - g.pe[1], 2 - g.pe[2]};
  if (!winograd_applies(s)) return false;
  thread_local std::vector<float> turned;
  turned.resize(static_cast<size_t>(g.C * g.M * 9));
  const float* wf = w.as<float>();
  for (int64_t m = 0; m < g.M; ++m)
    for (int64_t ch = 0; ch < g.C; ++ch)
      for (int64_t t = 0; t < 9; ++t)
        turned[static_cast<size_t>((ch * g.M + m) * 9 + t)] = wf[(m * g.C + ch) * 9 + (8 - t)];
  View dx = c.out(0, x.dtype, x.dims);
  return conv_forward_winograd(c.ctx(), s, dy.as<float>(), turned.data(), nullptr, nullptr,
                               dx.as<float>());
}

/// The f32 gradients by oneDNN's backward convolution primitives (plain layouts, so no reorders):
/// dX by backward data (unless `have_x`: Winograd wrote it), dW and dB by backward weights.
/// Returns false when oneDNN rejects the geometry, and the direct loops run instead.
bool conv_grad_dnnl(OpCall& c, const ConvGeom& g, const View& dy, const View& x, const View& w,
                    bool have_x) {
  using dnnl::memory;
  using tag = memory::format_tag;
  const size_t lead = 3 - g.sp;
  memory::dims strides, dil, pl, pr, src{g.N, g.C}, dst{g.N, g.M}, wei;
  if (g.group > 1)
    wei = {g.group, g.mg, g.cg};
  else
    wei = {g.M, g.cg};
  for (size_t q = lead; q < 3; ++q) {
    strides.push_back(g.s[q]);
    dil.push_back(g.d[q] - 1);  // oneDNN counts the gaps
    pl.push_back(g.p[q]);
    pr.push_back(g.pe[q]);
    src.push_back(g.in[q]);
    dst.push_back(g.out[q]);
    wei.push_back(g.k[q]);
  }
  const tag act = g.sp == 1 ? tag::ncw : g.sp == 2 ? tag::nchw : tag::ncdhw;
  const tag wt = g.group > 1 ? (g.sp == 1   ? tag::goiw
                                : g.sp == 2 ? tag::goihw
                                            : tag::goidhw)
                             : (g.sp == 1   ? tag::oiw
                                : g.sp == 2 ? tag::oihw
                                            : tag::oidhw);
  const auto f32 = memory::data_type::f32;
  const memory::desc src_md(src, f32, act), dst_md(dst, f32, act), wei_md(wei, f32, wt),
      bia_md({g.M}, f32, tag::x);
  const dnnl::engine& eng = c.ctx()->engine;
  dnnl::stream& st = c.stream()->dnnl_stream;
  const bool want_x = !have_x && c.n_outputs() > 0, want_w = c.n_outputs() > 1,
             want_b = c.n_outputs() > 2;
  try {
    const dnnl::convolution_forward::primitive_desc fwd(
        {dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src_md, wei_md,
         bia_md, dst_md, strides, dil, pl, pr},
        eng);
    std::optional<dnnl::convolution_backward_data::primitive_desc> bd;
    std::optional<dnnl::convolution_backward_weights::primitive_desc> bw;
    if (want_x)
      bd.emplace(dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src_md,
                                                       wei_md, dst_md, strides, dil, pl, pr),
                 eng, fwd);
    if (want_w) {
      if (want_b)
        bw.emplace(
            dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src_md,
                                                     wei_md, bia_md, dst_md, strides, dil, pl, pr),
            eng, fwd);
      else
        bw.emplace(
            dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src_md,
                                                     wei_md, dst_md, strides, dil, pl, pr),
            eng, fwd);
    }
    memory dy_m(dst_md, eng, dy.data), x_m(src_md, eng, x.data), w_m(wei_md, eng, w.data);
    if (bd) {
      View dx = c.out(0, x.dtype, x.dims);
      dnnl::convolution_backward_data(*bd).execute(
          st, {{DNNL_ARG_DIFF_DST, dy_m},
               {DNNL_ARG_WEIGHTS, w_m},
               {DNNL_ARG_DIFF_SRC, memory(src_md, eng, dx.data)}});
    }
    if (bw) {
      View dw = c.out(1, w.dtype, w.dims);
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, x_m},
                                           {DNNL_ARG_DIFF_DST, dy_m},
                                           {DNNL_ARG_DIFF_WEIGHTS, memory(wei_md, eng, dw.data)}};
      if (want_b) {
        View db = c.out(2, dy.dtype, {g.M});
        args.emplace(DNNL_ARG_DIFF_BIAS, memory(bia_md, eng, db.data));
      }
      dnnl::convolution_backward_weights(*bw).execute(st, args);
    } else if (want_b) {
      return false;  // dB without dW: not a primitive; the loops do it
    }
    st.wait();
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

void conv_grad(OpCall& c) {
  const View &dy = c.need(0), &x = c.need(1), &w = c.need(2);
  if (dy.dtype != x.dtype || w.dtype != x.dtype) c.fail("dY, X and W differ in dtype");
  const ConvGeom g = conv_geom(c, x, w);
  if (dy.dims != g.out_dims)
    c.fail("dY dims " + dims_str(dy.dims) + " differ from the convolution's output " +
           dims_str(g.out_dims));
  if (x.dtype == HP_F32) {
    const bool have_x = conv_grad_x_winograd(c, g, dy, x, w);
    if (conv_grad_dnnl(c, g, dy, x, w, have_x)) return;
  }
  dispatch_float(x.dtype, [&](auto tag) { conv_grad_typed<decltype(tag)>(c, g, dy, x, w); });
}

void pool_grad(OpCall& c, bool max) {
  const View &dy = c.need(0), &x = c.need(1);
  if (dy.dtype != x.dtype) c.fail("dY and X differ in dtype");
  if (x.dims.size() < 3) c.fail("pooling needs an N x C x spatial input, got " + dims_str(x.dims));
  // AveragePool has dilations from opset 19; a gradient node carries them only if its forward did.
  const Window w = window_of(c, x, true);
  Dims out{x.dims[0], x.dims[1]};
  out.insert(out.end(), w.out.begin(), w.out.end());
  if (dy.dims != out)
    c.fail("dY dims " + dims_str(dy.dims) + " differ from the pool's output " + dims_str(out));
  const bool include_pad = c.i("count_include_pad", 0) != 0;
  View dx = c.out(0, x.dtype, x.dims);
  const Dims in_sp(x.dims.begin() + 2, x.dims.end());
  const int64_t planes = x.dims[0] * x.dims[1], in_plane = numel(in_sp), out_plane = numel(w.out);
  dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *px = x.as<T>(), *pg = dy.as<T>();
    T* pdx = dx.as<T>();
#pragma omp parallel for schedule(static) if (planes * out_plane * numel(w.kernel) >= (1 << 16))
    for (int64_t p = 0; p < planes; ++p) {
      const T* xp = px + p * in_plane;
      const T* gp = pg + p * out_plane;
      T* dp = pdx + p * in_plane;
      std::fill(dp, dp + in_plane, T(0));
      for_each_window(w, in_sp, [&](int64_t q, const std::vector<int64_t>& offs, int64_t padded) {
        if (offs.empty()) return;
        if (max) {  // the forward's choice: the first strictly greatest
          T m = -std::numeric_limits<T>::infinity();
          int64_t at = offs[0];
          for (int64_t o : offs)
            if (xp[o] > m) {
              m = xp[o];
              at = o;
            }
          dp[at] += gp[q];
        } else {
          const double n =
              include_pad ? static_cast<double>(padded) : static_cast<double>(offs.size());
          const T share = static_cast<T>(gp[q] / n);
          for (int64_t o : offs) dp[o] += share;
        }
      });
    }
  });
}

bool floats_same(const std::vector<int32_t>& d) {
  if (d.size() < 2 || !is_float(d[0])) return false;
  for (int32_t t : d)
    if (t != d[0]) return false;
  return true;
}

}  // namespace

void register_grad_conv_ops(OpTable& t) {
  t["hp.train.ConvGrad"] = {conv_grad, floats_same};
  t["hp.train.MaxPoolGrad"] = {[](OpCall& c) { pool_grad(c, true); }, floats_same};
  t["hp.train.AveragePoolGrad"] = {[](OpCall& c) { pool_grad(c, false); }, floats_same};
}

}  // namespace hp_cpu
