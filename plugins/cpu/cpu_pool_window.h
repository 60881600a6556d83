// Pooling window geometry shared by the forward pools (cpu_ops_pool.cpp) and their gradients
// (cpu_ops_grad_conv.cpp), so a gradient walks exactly the windows its forward read. The geometry
// rules are described at the top of cpu_ops_pool.cpp.
#pragma once

#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {

struct Window {
  Dims kernel, strides, dil, pad_begin, pad_end, out;
};

/// The window of a pool over N x C x spatial `x` from the node's attributes (kernel_shape, strides,
/// pads, auto_pad, ceil_mode, and dilations when `dilations`); throws on bad values.
Window window_of(OpCall& c, const View& x, bool dilations);

/// Calls f(q, offs, padded) for each output position q of one N x C plane: offs are the plane
/// offsets of the window positions inside the input, padded the number of window positions inside
/// the padded input (AveragePool's count_include_pad divisor).
template <class F>
void for_each_window(const Window& w, const Dims& in_sp, F&& f) {
  const size_t sp = in_sp.size();
  const Dims in_st = strides_of(in_sp);
  const int64_t n_out = numel(w.out), n_k = numel(w.kernel);
  Dims o(sp, 0);
  std::vector<int64_t> offs;
  offs.reserve(static_cast<size_t>(n_k));
  for (int64_t q = 0; q < n_out; ++q) {
    int64_t rest = q;
    for (size_t d = sp; d-- > 0;) {
      o[d] = rest % w.out[d];
      rest /= w.out[d];
    }
    offs.clear();
    int64_t padded = 1;
    for (size_t d = 0; d < sp; ++d) {
      int64_t cnt = 0;
      for (int64_t k = 0; k < w.kernel[d]; ++k) {
        const int64_t p = o[d] * w.strides[d] - w.pad_begin[d] + k * w.dil[d];
        if (p >= -w.pad_begin[d] && p < in_sp[d] + w.pad_end[d]) ++cnt;
      }
      padded *= cnt;
    }
    for (int64_t kq = 0; kq < n_k; ++kq) {
      int64_t r2 = kq, off = 0;
      bool inside = true;
      for (size_t d = sp; d-- > 0;) {
        const int64_t k = r2 % w.kernel[d];
        r2 /= w.kernel[d];
        const int64_t p = o[d] * w.strides[d] - w.pad_begin[d] + k * w.dil[d];
        if (p < 0 || p >= in_sp[d]) {
          inside = false;
          break;
        }
        off += p * in_st[d];
      }
      if (inside) offs.push_back(off);
    }
    f(q, offs, padded);
  }
}

}  // namespace hp_cpu
