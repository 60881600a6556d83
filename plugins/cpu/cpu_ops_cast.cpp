// Cast and CastLike on the cpu backend: every numeric type, bool (0/1) and the 16-bit floats,
// which go through float (cpu_half.h). Registered outside the float families that op_table()
// widens to f16/bf16 (cpu_ops.cpp), since these convert 16-bit floats themselves.
#include <cstdint>
#include <string>
#include <vector>

#include "cpu_half.h"
#include "cpu_ops.h"

namespace hp_cpu {
namespace {

bool is_half(int32_t t) { return t == HP_F16 || t == HP_BF16; }

/// Writes x converted to y's dtype into y (same element count). Bool targets get 0/1; the 16-bit
/// floats go through float (cpu_half.h).
void convert(const View& x, const View& y) {
  const int64_t n = x.numel();
  auto from_float = [&](auto load) {
    if (y.dtype == HP_F16)
      for (int64_t i = 0; i < n; ++i) y.as<uint16_t>()[i] = float_to_half(load(i));
    else if (y.dtype == HP_BF16)
      for (int64_t i = 0; i < n; ++i) y.as<uint16_t>()[i] = float_to_bf16(load(i));
    else
      dispatch(y.dtype, [&](auto dst) {
        using D = decltype(dst);
        for (int64_t i = 0; i < n; ++i)
          y.as<D>()[i] = y.dtype == HP_BOOL ? D(load(i) != 0.f) : static_cast<D>(load(i));
      });
  };
  if (x.dtype == HP_F16)
    return from_float([&](int64_t i) { return half_to_float(x.as<uint16_t>()[i]); });
  if (x.dtype == HP_BF16)
    return from_float([&](int64_t i) { return bf16_to_float(x.as<uint16_t>()[i]); });
  dispatch(x.dtype, [&](auto src) {
    using S = decltype(src);
    const S* ps = x.as<S>();
    if (is_half(y.dtype)) return from_float([&](int64_t i) { return static_cast<float>(ps[i]); });
    dispatch(y.dtype, [&](auto dst) {
      using D = decltype(dst);
      D* pd = y.as<D>();
      if (y.dtype == HP_BOOL)
        for (int64_t i = 0; i < n; ++i) pd[i] = ps[i] != S(0) ? 1 : 0;
      else
        for (int64_t i = 0; i < n; ++i) pd[i] = static_cast<D>(ps[i]);
    });
  });
}

void cast(OpCall& c) {
  const View& x = c.need(0);
  // ONNX TensorProto types -> hp_dtype (the same codes as hp::DType's ONNX column).
  const int64_t to = c.i("to", 0);
  int dt = -1;
  switch (to) {
    case 1: dt = HP_F32; break;
    case 2: dt = HP_U8; break;
    case 3: dt = HP_I8; break;
    case 4: dt = HP_U16; break;
    case 5: dt = HP_I16; break;
    case 6: dt = HP_I32; break;
    case 7: dt = HP_I64; break;
    case 9: dt = HP_BOOL; break;
    case 10: dt = HP_F16; break;
    case 11: dt = HP_F64; break;
    case 12: dt = HP_U32; break;
    case 13: dt = HP_U64; break;
    case 16: dt = HP_BF16; break;
    default:
      throw OpError("cast to onnx type " + std::to_string(to) + " is not supported",
                    HP_UNSUPPORTED);
  }
  convert(x, c.out(0, dt, x.dims));
}

bool castable(int32_t t) { return is_num(t) || t == HP_BOOL || is_half(t); }

}  // namespace

void register_cast_ops(OpTable& t) {
  t["CastLike"] = {[](OpCall& c) { convert(c.need(0), c.out(0, c.need(1).dtype, c.need(0).dims)); },
                   [](const std::vector<int32_t>& d) {
                     return d.size() == 2 && castable(d[0]) && castable(d[1]);
                   }};
  t["Cast"] = {cast, [](const std::vector<int32_t>& d) { return d.size() == 1 && castable(d[0]); }};
}

}  // namespace hp_cpu
