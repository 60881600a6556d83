// Shared by the cpu backend's gradient-op files (cpu_ops_grad.cpp, cpu_ops_grad_index.cpp,
// cpu_ops_grad_conv.cpp): thread splitting, float dispatch, shape inputs and the dtype predicate of
// the hp.train ops' registrations.
#pragma once

#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_bcast.h"
#include "cpu_ops.h"

namespace hp_cpu::grad {

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// Calls f(lo, hi, thread) on `parts` disjoint ranges covering [0, n), one per thread, in parallel
/// when `work` (elements touched) is large enough to pay for the fork.
template <class F>
inline void split_range(int64_t n, int64_t work, F&& f) {
  if (n <= 0) return;
#ifdef _OPENMP
  if (work >= kParallelMin && n > 1 && omp_get_max_threads() > 1) {
#pragma omp parallel
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
      if (lo < hi) f(lo, hi, static_cast<int>(t));
    }
    return;
  }
#endif
  f(int64_t{0}, n, 0);
}

/// A `shape` input: 1-D integers, each >= 0.
inline Dims shape_arg(const OpCall& c, size_t i) {
  const View& v = c.need(i);
  if (v.dims.size() != 1) c.fail("the shape input must be 1-D, got " + dims_str(v.dims));
  if (v.numel() > HP_MAX_RANK) c.fail("the shape input has more dims than the maximum rank");
  Dims s = v.ints();
  for (int64_t d : s)
    if (d < 0) c.fail("negative dim in shape " + dims_str(s));
  return s;
}

template <class F>
inline void dispatch_float(int dtype, F&& f) {
  switch (dtype) {
    case HP_F32: f(float{}); break;
    case HP_F64: f(double{}); break;
    default: throw OpError("unsupported dtype " + std::to_string(dtype), HP_UNSUPPORTED);
  }
}

/// Zeroes an output (split across threads: an embedding's gradient is vocabulary x hidden).
template <class T>
inline void zero(View& v) {
  T* p = v.as<T>();
  split_range(v.numel(), v.numel(), [&](int64_t lo, int64_t hi, int) {
    std::memset(p + lo, 0, static_cast<size_t>(hi - lo) * sizeof(T));
  });
}

/// Outer x axis x inner sizes of `dims` around axis `a`.
inline void split_at(const Dims& dims, int64_t a, int64_t& outer, int64_t& len, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int64_t k = 0; k < a; ++k) outer *= dims[static_cast<size_t>(k)];
  len = dims[static_cast<size_t>(a)];
  for (size_t k = static_cast<size_t>(a) + 1; k < dims.size(); ++k) inner *= dims[k];
}

/// Input kinds per position: 'f' a float of the first input's type, 'i' an integer, 'o' an
/// optional integer.
inline DtypeCheck types(std::string kinds) {
  return [kinds](const std::vector<int32_t>& d) {
    if (d.empty() || !is_float(d[0]) || d.size() > kinds.size()) return false;
    for (size_t k = 0; k < kinds.size(); ++k) {
      const int32_t t = k < d.size() ? d[k] : -1;
      const char want = kinds[k];
      if (want == 'f'   ? t != d[0]
          : want == 'i' ? t != HP_I64 && t != HP_I32
                        : t != -1 && t != HP_I64 && t != HP_I32)
        return false;
    }
    return true;
  };
}

}  // namespace hp_cpu::grad
