// Gradient ops of the "hp.train" domain that scatter back what an indexing op read: SliceGrad,
// GatherGrad (embeddings: repeated ids add up) and GatherElementsGrad (also TopK's values). Each
// thread writes its own destination rows, so repeated indices need no atomics (docs/training.md).
#include <algorithm>
#include <string>
#include <vector>

#include "cpu_grad.h"

namespace hp_cpu {
namespace {

using namespace grad;

// ---- SliceGrad
// -----------------------------------------------------------------------------------

void slice_grad(OpCall& c) {
  const View& dy = c.need(0);
  const Dims s = shape_arg(c, 1);
  const int64_t r = static_cast<int64_t>(s.size());
  const std::vector<int64_t> starts = c.need(2).ints(), ends = c.need(3).ints();
  std::vector<int64_t> axes, steps;
  if (c.in(4).present()) axes = c.in(4).ints();
  if (c.in(5).present()) steps = c.in(5).ints();
  if (axes.empty())
    for (size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<int64_t>(k));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    c.fail("starts, ends, axes and steps differ in length");
  // As Slice (cpu_ops_shape.cpp): the read region's start, step and length per dim.
  Dims count = s, first(s.size(), 0), step(s.size(), 1);
  std::vector<bool> seen(s.size(), false);
  for (size_t k = 0; k < starts.size(); ++k) {
    const size_t a = static_cast<size_t>(c.axis(axes[k], r));
    if (seen[a]) c.fail("axis " + std::to_string(axes[k]) + " repeats");
    seen[a] = true;
    const int64_t dim = s[a], st = steps[k];
    if (st == 0) c.fail("slice step 0");
    int64_t b = starts[k], e = ends[k];
    if (b < 0) b += dim;
    if (e < 0) e += dim;
    if (dim == 0) {
      count[a] = 0;
    } else if (st > 0) {
      b = std::clamp<int64_t>(b, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      count[a] = e > b ? (e - b + st - 1) / st : 0;
    } else {
      b = std::clamp<int64_t>(b, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      count[a] = b > e ? (b - e + (-st) - 1) / (-st) : 0;
    }
    first[a] = b;
    step[a] = st;
  }
  if (dy.dims != count)
    c.fail("dY dims " + dims_str(dy.dims) + " differ from the slice's " + dims_str(count) +
           " of shape " + dims_str(s));
  View y = c.out(0, dy.dtype, s);
  dispatch_float(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    zero<T>(y);
    if (dy.numel() == 0) return;
    const T* px = dy.as<T>();
    T* py = y.as<T>();
    if (r == 0) {
      py[0] = px[0];
      return;
    }
    const Dims yst = strides_of(s);
    Dims ost(s.size());
    int64_t base = 0;
    for (size_t d = 0; d < s.size(); ++d) {
      base += first[d] * yst[d];
      ost[d] = yst[d] * step[d];
    }
    const int64_t len = count.back(), rows = dy.numel() / len, inner = ost.back();
    split_range(rows, dy.numel(), [&](int64_t lo, int64_t hi, int) {
      for (int64_t q = lo; q < hi; ++q) {
        int64_t rest = q, off = base;
        for (size_t d = s.size() - 1; d-- > 0;) {
          off += rest % count[d] * ost[d];
          rest /= count[d];
        }
        const T* src = px + q * len;
        for (int64_t i = 0; i < len; ++i) py[off + i * inner] = src[i];
      }
    });
  });
}

// ---- GatherGrad, GatherElementsGrad
// ---------------------------------------------------------------

/// The indices normalised into [0, len) (negative ones count from the end, as Gather).
std::vector<int64_t> checked_indices(const OpCall& c, const View& idx, int64_t len) {
  std::vector<int64_t> k = idx.ints();
  for (int64_t& v : k) {
    if (v < -len || v >= len)
      c.fail("index " + std::to_string(v) + " is outside [-" + std::to_string(len) + ", " +
             std::to_string(len) + ")");
    if (v < 0) v += len;
  }
  return k;
}

void gather_grad(OpCall& c) {
  const View &dy = c.need(0), &idx = c.need(2);
  const Dims s = shape_arg(c, 1);
  if (s.empty()) c.fail("the shape must have rank >= 1");
  const int64_t axis = c.axis(c.i("axis", 0), static_cast<int64_t>(s.size()));
  Dims want(s.begin(), s.begin() + axis);
  want.insert(want.end(), idx.dims.begin(), idx.dims.end());
  want.insert(want.end(), s.begin() + axis + 1, s.end());
  if (dy.dims != want)
    c.fail("dY dims " + dims_str(dy.dims) + " must be " + dims_str(want) + " for shape " +
           dims_str(s) + " and indices " + dims_str(idx.dims));
  int64_t outer, len, inner;
  split_at(s, axis, outer, len, inner);
  const std::vector<int64_t> k = checked_indices(c, idx, len);
  const int64_t ni = static_cast<int64_t>(k.size());
  View y = c.out(0, dy.dtype, s);
  dispatch_float(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    zero<T>(y);
    if (dy.numel() == 0) return;
    const T* px = dy.as<T>();
    T* py = y.as<T>();
    // Each thread owns a range of destination rows (outer x len) and adds the dY rows that land
    // there, so repeated indices need no atomics; scanning all indices per thread is cheap.
    split_range(outer * len, dy.numel(), [&](int64_t lo, int64_t hi, int) {
      for (int64_t o = lo / len; o <= (hi - 1) / len; ++o)
        for (int64_t j = 0; j < ni; ++j) {
          const int64_t row = o * len + k[static_cast<size_t>(j)];
          if (row < lo || row >= hi) continue;
          T* dst = py + row * inner;
          const T* src = px + (o * ni + j) * inner;
#pragma omp simd
          for (int64_t i = 0; i < inner; ++i) dst[i] += src[i];
        }
    });
  });
}

void gather_elements_grad(OpCall& c) {
  const View &dy = c.need(0), &idx = c.need(2);
  const Dims s = shape_arg(c, 1);
  const size_t r = s.size();
  if (r == 0) c.fail("the shape must have rank >= 1");
  const int64_t axis = c.axis(c.i("axis", 0), static_cast<int64_t>(r));
  if (dy.dims != idx.dims || idx.dims.size() != r)
    c.fail("dY " + dims_str(dy.dims) + " and indices " + dims_str(idx.dims) +
           " must have one shape of the rank of " + dims_str(s));
  for (size_t d = 0; d < r; ++d)
    if (static_cast<int64_t>(d) != axis && idx.dims[d] > s[d])
      c.fail("indices " + dims_str(idx.dims) + " exceed shape " + dims_str(s));
  const std::vector<int64_t> k = checked_indices(c, idx, s[static_cast<size_t>(axis)]);
  View y = c.out(0, dy.dtype, s);
  dispatch_float(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    zero<T>(y);
    if (dy.numel() == 0) return;
    const T* px = dy.as<T>();
    T* py = y.as<T>();
    const Dims yst = strides_of(s);
    Dims at(r, 0);    // odometer over dY / indices
    int64_t off = 0;  // y offset of `at` without the axis term
    const int64_t n = dy.numel();
    for (int64_t e = 0; e < n; ++e) {
      py[off + k[static_cast<size_t>(e)] * yst[static_cast<size_t>(axis)]] += px[e];
      for (size_t d = r; d-- > 0;) {
        const int64_t step = static_cast<int64_t>(d) == axis ? 0 : yst[d];
        if (++at[d] < idx.dims[d]) {
          off += step;
          break;
        }
        off -= (at[d] - 1) * step;
        at[d] = 0;
      }
    }
  });
}

// ---- SoftmaxGrad, LogSoftmaxGrad
// ------------------------------------------------------------------

}  // namespace

void register_grad_index_ops(OpTable& t) {
  t["hp.train.SliceGrad"] = {slice_grad, types("fiiioo")};
  t["hp.train.GatherGrad"] = {gather_grad, types("fii")};
  t["hp.train.GatherElementsGrad"] = {gather_elements_grad, types("fii")};
}

}  // namespace hp_cpu
