// Det on the cpu backend (f32, f64): the determinant of each trailing [M, M] matrix, by LU
// decomposition with partial pivoting (the product of the pivots, its sign flipped per row swap),
// accumulated in double.
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

double det_of(std::vector<double>& a, int64_t m) {
  double det = 1;
  for (int64_t k = 0; k < m; ++k) {
    int64_t p = k;
    for (int64_t i = k + 1; i < m; ++i)
      if (std::fabs(a[i * m + k]) > std::fabs(a[p * m + k])) p = i;
    if (a[p * m + k] == 0) return 0;
    if (p != k) {
      for (int64_t j = 0; j < m; ++j) std::swap(a[k * m + j], a[p * m + j]);
      det = -det;
    }
    det *= a[k * m + k];
    for (int64_t i = k + 1; i < m; ++i) {
      const double f = a[i * m + k] / a[k * m + k];
      for (int64_t j = k; j < m; ++j) a[i * m + j] -= f * a[k * m + j];
    }
  }
  return det;
}

void det(OpCall& c) {
  const View& x = c.need(0);
  const size_t r = x.dims.size();
  if (r < 2 || x.dims[r - 1] != x.dims[r - 2])
    c.fail("input must be [..., M, M], got " + dims_str(x.dims));
  const int64_t m = x.dims[r - 1], batch = numel(Dims(x.dims.begin(), x.dims.end() - 2));
  View y = c.out(0, x.dtype, Dims(x.dims.begin(), x.dims.end() - 2));
  dispatch(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      std::vector<double> a(static_cast<size_t>(m * m));
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t i = 0; i < m * m; ++i) a[i] = x.as<T>()[b * m * m + i];
        y.as<T>()[b] = static_cast<T>(det_of(a, m));
      }
    }
  });
}

}  // namespace

void register_linalg_ops(OpTable& t) {
  t["Det"] = {det, [](const std::vector<int32_t>& d) {
                return d.size() == 1 && (d[0] == HP_F32 || d[0] == HP_F64);
              }};
}

}  // namespace hp_cpu
