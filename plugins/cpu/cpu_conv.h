// Forward convolution (f32) on oneDNN's convolution_forward primitive, cached by geometry
// (cpu_conv.cpp); the Conv kernel of cpu_ops_nn.cpp calls it and keeps its direct loop for f64 and
// for what oneDNN rejects.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <dnnl.hpp>

#include "plugin_common.h"

namespace hp_cpu {

/// A convolution's geometry in ONNX terms, already resolved (auto_pad applied, defaults filled).
struct ConvShape {
  std::vector<int64_t> x, w, y;  ///< N x C x spatial, M x C/group x kernel, N x M x spatial
  std::vector<int64_t> strides, dilations, pads;  ///< ONNX: dilation 1 = dense, pads begins+ends
  int64_t group = 1;
  bool bias = false;
  bool sum = false;   ///< y = conv + z before the activation (a fused residual Add)
  bool relu = false;  ///< a fused Relu
  /// Operands stored channels-last (N x H x W x C; dims above are N x C x H x W regardless).
  bool x_nhwc = false, z_nhwc = false, y_nhwc = false;
  bool bf16 = false;  ///< X and W in bfloat16, accumulation and Y float32 ("compute=bf16")
};

/// A cached primitive with the layouts it chose (blocked where faster) and the reorders between
/// them and the plain NC(D)HW buffers of the caller; null reorders mean the layout is the plain
/// one.
struct CachedConv {
  std::shared_ptr<dnnl::convolution_forward> prim;
  dnnl::memory::desc x_plain, w_plain, y_plain, z_plain, x_md, w_md, y_md, scratchpad;
  std::shared_ptr<dnnl::reorder> x_in, w_in, y_in, y_out;
};

/// A pooling's geometry, resolved: plain N x C x spatial in and out, oneDNN's padding (the end
/// padding grown to cover ceil_mode's last windows).
struct PoolShape {
  std::vector<int64_t> x, y, kernel, strides, dilations, pad_l, pad_r;
  int alg = 0;  ///< 0 max, 1 average including the padding, 2 average excluding it
};

/// A cached pooling primitive on plain layouts and the scratchpad it needs.
struct CachedPool {
  std::shared_ptr<dnnl::pooling_v2_forward> prim;
  dnnl::memory::desc x_md, y_md, scratchpad;
};

/// oneDNN convolutions (and poolings) by geometry. Creation JIT-compiles (milliseconds); executions
/// from several threads at once are safe because each brings its own scratchpad and buffers
/// (cpu_gemm.cpp).
class ConvCache {
 public:
  /// The primitive for `s`; throws dnnl::error when oneDNN rejects the geometry.
  CachedConv get(const dnnl::engine& eng, const ConvShape& s);
  /// The pooling primitive for `s`; throws dnnl::error when oneDNN rejects it.
  CachedPool pool(const dnnl::engine& eng, const PoolShape& s);

 private:
  std::mutex mu_;
  std::map<std::vector<int64_t>, CachedConv> cache_;
  std::map<std::vector<int64_t>, CachedPool> pools_;
};

/// Runs the convolution y = act(conv(x, w) + b + z) on oneDNN; false when oneDNN rejects the
/// geometry (nothing written then). z may be null unless s.sum; b null unless s.bias.
/// `weight_id` nonzero: w is a constant filter the executor named, reordered once and kept.
bool conv_forward_dnnl(hp_ctx* ctx, hp_stream* st, const ConvShape& s, const float* x,
                       const float* w, const float* b, const float* z, float* y,
                       int64_t weight_id = 0);

/// Runs the pooling on oneDNN; false when oneDNN rejects it (nothing written then).
bool pool_forward_dnnl(hp_ctx* ctx, hp_stream* st, const PoolShape& s, const float* x, float* y);

}  // namespace hp_cpu
