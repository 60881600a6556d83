// Winograd F(2x2, 3x3) convolution for the cpu backend (cpu_winograd.cpp).
#pragma once

#include "cpu_conv.h"
#include "cpu_internal.h"

namespace hp_cpu {

/// Whether conv_forward_winograd runs `s`: 2-D float32, 3x3, stride 1, no dilation, one group,
/// pads <= 2, input and output channels multiples of 16, an AVX-512 CPU, and HP_CPU_WINOGRAD not
/// "0" (the switch the executor benchmark compares with).
bool winograd_applies(const ConvShape& s);

/// y = act(conv(x, w) + b + z) as cpu_conv.h's conv_forward_dnnl, by Winograd F(2x2, 3x3); false
/// (nothing written) where winograd_applies(s) does not hold.
/// `weight_id` nonzero: w is a constant weight the executor named (node attribute hp_weight_b),
/// whose transform is kept (PackedWeights) instead of made on every call.
bool conv_forward_winograd(hp_ctx* ctx, const ConvShape& s, const float* x, const float* w,
                           const float* b, const float* z, float* y, int64_t weight_id = 0);

}  // namespace hp_cpu
