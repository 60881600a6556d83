// Pooling and normalisation ONNX ops on the cpu backend: MaxPool, AveragePool, GlobalAveragePool,
// GlobalMaxPool and BatchNormalization, all on N x C x spatial... tensors of any
// spatial rank.
//
// Window geometry follows the ONNX spec: explicit `pads` (begin values then end values) or auto_pad
// SAME_UPPER / SAME_LOWER (output ceil(in / stride), the odd pad at the end / the beginning) /
// VALID; output floor((in + pads - window) / stride) + 1, or ceil with ceil_mode, where a last
// window that would start in the end padding is dropped (as PyTorch and ONNX Runtime do). A window
// position p reads input index p * stride - pad_begin + k * dilation. AveragePool divides by the
// window positions inside the input, or with count_include_pad by those inside the padded input.
//
// MaxPool's optional Indices output and BatchNormalization's training mode (batch statistics,
// running mean and var outputs) are implemented too.
//
// Float32 MaxPool without Indices and AveragePool run on oneDNN's pooling primitive (cpu_conv.cpp),
// with the end padding set to what the last windows reach (grown for ceil_mode; max ignores padding
// and the excluding average counts only the input, so that changes nothing); AveragePool with
// count_include_pad whose ceil_mode windows reach past the padding keeps the loop, whose divisor
// stops at the padding where oneDNN's would not. Whatever oneDNN rejects runs the loop too.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_internal.h"
#include "cpu_ops.h"
#include "cpu_pool_window.h"

namespace hp_cpu {

Window window_of(OpCall& c, const View& x, bool dilations) {
  const size_t sp = x.dims.size() - 2;
  Window w;
  w.kernel = c.ints("kernel_shape");
  if (w.kernel.size() != sp) c.fail("kernel_shape must have one entry per spatial dim");
  w.strides = c.ints("strides");
  w.dil = dilations ? c.ints("dilations") : Dims{};
  Dims pads = c.ints("pads");
  w.strides.resize(sp, 1);
  w.dil.resize(sp, 1);
  pads.resize(2 * sp, 0);
  const std::string ap = c.s("auto_pad", "NOTSET");
  const bool ceil_mode = c.i("ceil_mode", 0) != 0;
  w.pad_begin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(sp));
  w.pad_end.assign(pads.begin() + static_cast<std::ptrdiff_t>(sp), pads.end());
  w.out.resize(sp);
  // Bounded so that the window arithmetic below cannot overflow (a file may say anything).
  constexpr int64_t kMax = int64_t{1} << 31;
  for (size_t d = 0; d < sp; ++d) {
    if (w.kernel[d] < 1 || w.strides[d] < 1 || w.dil[d] < 1)
      c.fail("kernel, strides and dilations must be >= 1");
    if (w.kernel[d] > kMax || w.strides[d] > kMax || w.dil[d] > kMax || w.pad_begin[d] < 0 ||
        w.pad_end[d] < 0 || w.pad_begin[d] > kMax || w.pad_end[d] > kMax)
      c.fail("kernel, strides, dilations and pads must lie in [0, 2^31]");
    const int64_t in = x.dims[2 + d], span = (w.kernel[d] - 1) * w.dil[d] + 1;
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      const int64_t o = (in + w.strides[d] - 1) / w.strides[d];
      const int64_t total = std::max<int64_t>((o - 1) * w.strides[d] + span - in, 0);
      w.pad_begin[d] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      w.pad_end[d] = total - w.pad_begin[d];
      w.out[d] = o;
      continue;
    }
    if (ap == "VALID") w.pad_begin[d] = w.pad_end[d] = 0;
    const int64_t room = in + w.pad_begin[d] + w.pad_end[d] - span;
    if (room < 0) c.fail("the pooling window is larger than the padded input");
    int64_t o = (ceil_mode ? (room + w.strides[d] - 1) / w.strides[d] : room / w.strides[d]) + 1;
    if (ceil_mode && (o - 1) * w.strides[d] >= in + w.pad_begin[d]) --o;
    w.out[d] = o;
  }
  return w;
}

namespace {

/// The float32 pooling on oneDNN; false when the loop must run (see the file comment).
bool pool_dnnl(OpCall& c, const View& x, View& y, const Window& w, bool max, bool include_pad) {
  const size_t sp = x.dims.size() - 2;
  PoolShape s{x.dims, y.dims,      w.kernel,  w.strides,
              w.dil,  w.pad_begin, w.pad_end, max ? 0 : include_pad ? 1 : 2};
  for (size_t d = 0; d < sp; ++d) {
    const int64_t span = (w.kernel[d] - 1) * w.dil[d] + 1;
    const int64_t need = (w.out[d] - 1) * w.strides[d] + span - x.dims[2 + d] - w.pad_begin[d];
    // The end padding the windows reach: with count_include_pad any more than the given padding
    // would count in oneDNN's divisor and not in ONNX's.
    if (include_pad && need > w.pad_end[d]) return false;
    s.pad_r[d] = need;
  }
  return pool_forward_dnnl(c.ctx(), c.stream(), s, x.as<float>(), y.as<float>());
}

void pool(OpCall& c, bool max) {
  const View& x = c.need(0);
  if (x.dims.size() < 3) c.fail("pooling needs an N x C x spatial input");
  const Window w = window_of(c, x, max || c.opset() >= 19);
  const bool include_pad = c.i("count_include_pad", 0) != 0;
  Dims out{x.dims[0], x.dims[1]};
  out.insert(out.end(), w.out.begin(), w.out.end());
  View y = c.out(0, x.dtype, out);
  const Dims in_sp(x.dims.begin() + 2, x.dims.end());
  const int64_t planes = x.dims[0] * x.dims[1], in_plane = numel(in_sp), out_plane = numel(w.out);
  // MaxPool's optional Indices: the argmax as a flat index into X, row-major (storage_order 0) or
  // with the spatial dims column-major (storage_order 1).
  const bool want_ind = max && c.n_outputs() > 1;
  if (x.dtype == HP_F32 && !want_ind && numel(out) > 0 && pool_dnnl(c, x, y, w, max, include_pad))
    return;
  int64_t* ind = want_ind ? c.out(1, HP_I64, out).as<int64_t>() : nullptr;
  const bool col_major = c.i("storage_order", 0) != 0;
  const Dims row_st = strides_of(in_sp);
  Dims col_st(in_sp.size(), 1);
  for (size_t d = 1; d < in_sp.size(); ++d) col_st[d] = col_st[d - 1] * in_sp[d - 1];
  auto flat_index = [&](int64_t plane, int64_t off) {
    if (!col_major) return plane * in_plane + off;
    int64_t idx = 0;
    for (size_t d = 0; d < in_sp.size(); ++d) idx += (off / row_st[d]) % in_sp[d] * col_st[d];
    return plane * in_plane + idx;
  };
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    T* py = y.as<T>();
#pragma omp parallel for schedule(static) if (planes * out_plane * numel(w.kernel) >= (1 << 16))
    for (int64_t p = 0; p < planes; ++p) {
      const T* xp = px + p * in_plane;
      T* yp = py + p * out_plane;
      for_each_window(w, in_sp, [&](int64_t q, const std::vector<int64_t>& offs, int64_t padded) {
        if (max) {
          T m = std::numeric_limits<T>::lowest();
          if constexpr (std::is_floating_point_v<T>) m = -std::numeric_limits<T>::infinity();
          int64_t at = offs.empty() ? 0 : offs[0];
          for (int64_t o : offs)
            if (xp[o] > m) {
              m = xp[o];
              at = o;
            }
          yp[q] = m;
          if (ind) ind[p * out_plane + q] = flat_index(p, at);
        } else {
          double s = 0;
          for (int64_t o : offs) s += static_cast<double>(xp[o]);
          const double n =
              include_pad ? static_cast<double>(padded) : static_cast<double>(offs.size());
          yp[q] = static_cast<T>(n > 0 ? s / n : 0);
        }
      });
    }
  };
  switch (x.dtype) {
    case HP_F32: run(float{}); break;
    case HP_F64: run(double{}); break;
    case HP_U8: run(uint8_t{}); break;
    case HP_I8: run(int8_t{}); break;
    default:
      throw OpError("pooling of dtype " + std::to_string(x.dtype) + " is not implemented",
                    HP_UNSUPPORTED);
  }
}

void global_pool(OpCall& c, bool max) {
  const View& x = c.need(0);
  if (x.dims.size() < 3) c.fail("global pooling needs an N x C x spatial input");
  Dims out(x.dims.size(), 1);
  out[0] = x.dims[0];
  out[1] = x.dims[1];
  View y = c.out(0, x.dtype, out);
  const int64_t planes = x.dims[0] * x.dims[1], len = x.numel() / std::max<int64_t>(planes, 1);
  dispatch_num(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      const T* px = x.as<T>();
      T* py = y.as<T>();
#pragma omp parallel for schedule(static) if (x.numel() >= (1 << 18))
      for (int64_t p = 0; p < planes; ++p) {
        const T* row = px + p * len;
        if (max) {
          T m = -std::numeric_limits<T>::infinity();
          for (int64_t i = 0; i < len; ++i) m = std::max(m, row[i]);
          py[p] = m;
        } else {
          // Eight sums in double: independent chains the core overlaps, where one chain waited
          // for each add (10x slower on a 32 x 32 plane).
          double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          int64_t i = 0;
          for (; i + 8 <= len; i += 8)
            for (int j = 0; j < 8; ++j) s[j] += static_cast<double>(row[i + j]);
          for (; i < len; ++i) s[0] += static_cast<double>(row[i]);
          const double total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
          py[p] = static_cast<T>(len ? total / static_cast<double>(len) : 0);
        }
      }
    } else {
      throw OpError("global pooling of integer tensors is not implemented", HP_UNSUPPORTED);
    }
  });
}

/// y = (x - mean) / sqrt(var + epsilon) * scale + B, per channel (dim 1). Inference uses the given
/// mean and var; training_mode (opset 14+) uses the batch's own (biased) statistics and also
/// outputs running_mean = mean * momentum + batch_mean * (1 - momentum), running_var likewise.
void batch_norm(OpCall& c) {
  const bool training = c.i("training_mode", 0) != 0;
  const View &x = c.need(0), &scale = c.need(1), &bias = c.need(2), &mean = c.need(3),
             &var = c.need(4);
  if (x.dims.size() < 2) c.fail("BatchNormalization needs an N x C x ... input");
  if (!training && c.n_outputs() > 1 && c.opset() >= 14)
    c.fail("outputs running_mean and running_var exist only in training mode");
  if (!training && c.n_outputs() > 1)
    throw OpError("BatchNormalization's pre-opset-14 training outputs are not implemented",
                  HP_UNSUPPORTED);
  const int64_t C = x.dims[1];
  for (const View* v : {&scale, &bias, &mean, &var})
    if (v->numel() != C)
      c.fail("scale, B, mean and var must have C = " + std::to_string(C) + " elements");
  const double eps = c.f("epsilon", 1e-5), momentum = c.f("momentum", 0.9);
  View y = c.out(0, x.dtype, x.dims);
  const int64_t N = x.dims[0], inner = C ? x.numel() / std::max<int64_t>(N * C, 1) : 0;
  dispatch_num(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      const T* px = x.as<T>();
      std::vector<double> mu(static_cast<size_t>(C)), va(static_cast<size_t>(C));
      for (int64_t ch = 0; ch < C; ++ch) {
        if (!training) {
          mu[static_cast<size_t>(ch)] = static_cast<double>(mean.as<T>()[ch]);
          va[static_cast<size_t>(ch)] = static_cast<double>(var.as<T>()[ch]);
          continue;
        }
        double s = 0, s2 = 0;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < inner; ++i)
            s += static_cast<double>(px[(n * C + ch) * inner + i]);
        const double cnt = static_cast<double>(std::max<int64_t>(N * inner, 1)), m = s / cnt;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < inner; ++i) {
            const double d = static_cast<double>(px[(n * C + ch) * inner + i]) - m;
            s2 += d * d;
          }
        mu[static_cast<size_t>(ch)] = m;
        va[static_cast<size_t>(ch)] = s2 / cnt;
      }
      std::vector<T> a(static_cast<size_t>(C)), b(static_cast<size_t>(C));
      for (int64_t ch = 0; ch < C; ++ch) {
        const size_t k = static_cast<size_t>(ch);
        const double inv = 1.0 / std::sqrt(va[k] + eps);
        a[k] = static_cast<T>(static_cast<double>(scale.as<T>()[ch]) * inv);
        b[k] = static_cast<T>(static_cast<double>(bias.as<T>()[ch]) -
                              mu[k] * static_cast<double>(scale.as<T>()[ch]) * inv);
      }
      T* py = y.as<T>();
      for (int64_t n = 0; n < N; ++n)
        for (int64_t ch = 0; ch < C; ++ch) {
          const T* xi = px + (n * C + ch) * inner;
          T* yi = py + (n * C + ch) * inner;
          const T sa = a[static_cast<size_t>(ch)], sb = b[static_cast<size_t>(ch)];
          for (int64_t i = 0; i < inner; ++i) yi[i] = xi[i] * sa + sb;
        }
      for (int64_t o = 1; o < std::min<int64_t>(c.n_outputs(), 3); ++o) {
        const View& given = o == 1 ? mean : var;
        const std::vector<double>& batch = o == 1 ? mu : va;
        T* r = c.out(o, x.dtype, given.dims).template as<T>();
        for (int64_t ch = 0; ch < C; ++ch)
          r[ch] = static_cast<T>(static_cast<double>(given.as<T>()[ch]) * momentum +
                                 batch[static_cast<size_t>(ch)] * (1 - momentum));
      }
    } else {
      throw OpError("BatchNormalization of integer tensors is not implemented", HP_UNSUPPORTED);
    }
  });
}

/// MaxUnpool: zeros with each input value written at its index, a flat index into the whole
/// unpooled tensor as MaxPool's second output gives it. That tensor's shape is (in - 1) * stride -
/// pad_begin - pad_end + kernel per spatial dim; an output_shape input (which may add the rows and
/// columns pooling dropped) keeps each value at the same coordinates, as the ONNX reference does.
void max_unpool(OpCall& c) {
  const View &x = c.need(0), &ix = c.need(1), &shape = c.in(2);
  if (x.dims.size() < 3 || ix.dims != x.dims) c.fail("X and I must have the same rank >= 3 dims");
  const size_t sp = x.dims.size() - 2;
  const std::vector<int64_t> k = c.ints("kernel_shape");
  std::vector<int64_t> st = c.ints("strides"), pads = c.ints("pads");
  if (k.size() != sp) c.fail("kernel_shape must have one entry per spatial dim");
  if (st.empty()) st.assign(sp, 1);
  if (pads.empty()) pads.assign(2 * sp, 0);
  if (st.size() != sp || pads.size() != 2 * sp) c.fail("strides or pads have the wrong length");
  Dims inferred = {x.dims[0], x.dims[1]};
  for (size_t d = 0; d < sp; ++d)
    inferred.push_back((x.dims[2 + d] - 1) * st[d] - pads[d] - pads[sp + d] + k[d]);
  Dims od = inferred;
  if (shape.present() && shape.numel() > 0) {
    od = shape.ints();
    if (od.size() != x.dims.size()) c.fail("output_shape must have one entry per dim");
  }
  View y = c.out(0, x.dtype, od);
  const int64_t es = dtype_size(x.dtype), total = numel(inferred);
  std::memset(y.data, 0, static_cast<size_t>(numel(od) * es));
  const Dims ist = strides_of(inferred), ost = strides_of(od);
  const std::vector<int64_t> idx = ix.ints();
  for (size_t i = 0; i < idx.size(); ++i) {
    if (idx[i] < 0 || idx[i] >= total)
      c.fail("index " + std::to_string(idx[i]) + " is outside the unpooled tensor's " +
             std::to_string(total) + " elements");
    int64_t at = 0;
    bool inside = true;
    for (size_t d = 0; d < od.size(); ++d) {
      const int64_t coord = idx[i] / ist[d] % inferred[d];
      inside = inside && coord < od[d];
      at += coord * ost[d];
    }
    if (!inside) continue;
    std::memcpy(static_cast<unsigned char*>(y.data) + at * es,
                static_cast<const unsigned char*>(x.data) + static_cast<int64_t>(i) * es,
                static_cast<size_t>(es));
  }
}

bool pool_types(const std::vector<int32_t>& d) {
  return d.size() == 1 && (d[0] == HP_F32 || d[0] == HP_F64 || d[0] == HP_U8 || d[0] == HP_I8);
}

bool float_first(const std::vector<int32_t>& d) {
  return !d.empty() && (d[0] == HP_F32 || d[0] == HP_F64);
}

}  // namespace

void register_pool_ops(OpTable& t) {
  t["MaxPool"] = {[](OpCall& c) { pool(c, true); }, pool_types};
  t["AveragePool"] = {[](OpCall& c) { pool(c, false); }, pool_types};
  t["MaxUnpool"] = {max_unpool, [](const std::vector<int32_t>& d) {
                      return d.size() >= 2 && is_num(d[0]) && d[1] == HP_I64;
                    }};
  t["GlobalMaxPool"] = {[](OpCall& c) { global_pool(c, true); }, float_first};
  t["GlobalAveragePool"] = {[](OpCall& c) { global_pool(c, false); }, float_first};
  t["BatchNormalization"] = {batch_norm, [](const std::vector<int32_t>& d) {
                               if (d.size() != 5) return false;
                               for (int32_t x : d)
                                 if (x != d[0]) return false;
                               return d[0] == HP_F32 || d[0] == HP_F64;
                             }};
}

}  // namespace hp_cpu
