// Forward convolution (f32) on oneDNN's convolution_forward primitive, and MaxPool/AveragePool on
// its pooling primitive (plain layouts: pooling is a memory-bound pass either way).
//
// The primitive is created with "any" layouts, so oneDNN picks its fastest direct implementation
// (blocked nChw8c/16c activations and weights for the JIT kernels on AVX2/AVX-512). The algorithm
// is direct, not auto: oneDNN's Winograd (F(4x4, 3x3)) changes the rounding by more than the 1e-5
// that outputs are held to against the reference loop; the 3x3 convolutions it would speed up run
// on cpu_winograd.cpp's F(2x2, 3x3) before reaching here. The caller's plain NC(D)HW tensors are
// reordered into those layouts and the result back, each a memory-bound pass that costs little
// beside the convolution. A filter the executor names as constant (hp_weight_b,
// libs/exec/src/exec_fuse.cpp) is reordered once and kept (PackedWeights, as a MatMul's B); any
// other is reordered on every call.
//
// Operands may be stored channels-last (ConvShape::x_nhwc and the others), the layout oneDNN's
// f32 kernels on AVX2/AVX-512 pick for most shapes: then their reorders vanish (reorder_if finds
// the layouts equal), which for a chain of convolutions kept channels-last by the executor
// (libs/exec/src/exec_layout.cpp) is most of the time around a small convolution.
//
// As in cpu_gemm.cpp, primitives (and their reorders) are cached by everything that defines them
// and created with a user-managed scratchpad, and each execution brings buffers of the executing
// thread's own, so ranks simulated as threads over one backend can run the same convolution at
// once. A fused residual (ConvShape::sum) is a sum post-op: z is reordered into the destination
// buffer first and the primitive adds its result to it, before the fused Relu.
#include "cpu_conv.h"

#include <algorithm>
#include <unordered_map>

#include "cpu_internal.h"
#include "cpu_scratch.h"

namespace hp_cpu {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

tag plain_act(size_t sp) { return sp == 1 ? tag::ncw : sp == 2 ? tag::nchw : tag::ncdhw; }
tag plain_wei(size_t sp, bool grouped) {
  if (grouped) return sp == 1 ? tag::goiw : sp == 2 ? tag::goihw : tag::goidhw;
  return sp == 1 ? tag::oiw : sp == 2 ? tag::oihw : tag::oidhw;
}

std::vector<int64_t> key_of(const ConvShape& s) {
  std::vector<int64_t> k{s.group,  s.bias,   s.sum,    s.relu, static_cast<int64_t>(s.x.size()),
                         s.x_nhwc, s.z_nhwc, s.y_nhwc, s.bf16};
  for (const auto* v : {&s.x, &s.w, &s.y, &s.strides, &s.dilations, &s.pads})
    k.insert(k.end(), v->begin(), v->end());
  return k;
}

std::shared_ptr<dnnl::reorder> reorder_if(const dnnl::engine& eng, const memory::desc& from,
                                          const memory::desc& to) {
  if (from == to) return nullptr;
  // A reorder with a scratchpad would share oneDNN's library-managed one between threads (see
  // cpu_gemm.cpp); layout reorders of f32 need none, and one that did falls back to the loop.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::reorder::primitive_desc pd(eng, from, eng, to, attr);
  if (pd.scratchpad_desc().get_size() > 0)
    throw dnnl::error(dnnl_unimplemented, "a layout reorder that needs a scratchpad");
  return std::make_shared<dnnl::reorder>(pd);
}

}  // namespace

CachedConv ConvCache::get(const dnnl::engine& eng, const ConvShape& s) {
  const std::vector<int64_t> key = key_of(s);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
  }
  // One build at a time: oneDNN's global primitive cache raced under ThreadSanitizer when ranks
  // built primitives concurrently (cpu_gemm.cpp).
  static std::mutex build_mu;
  std::lock_guard<std::mutex> build(build_mu);
  const size_t sp = s.x.size() - 2;
  const bool grouped = s.group > 1;
  const auto f32 = memory::data_type::f32;
  memory::dims wd;
  if (grouped)
    wd = {s.group, s.w[0] / s.group, s.w[1]};
  else
    wd = {s.w[0], s.w[1]};
  wd.insert(wd.end(), s.w.begin() + 2, s.w.end());
  memory::dims strides(s.strides), dil, pl(s.pads.begin(), s.pads.begin() + sp),
      pr(s.pads.begin() + sp, s.pads.end());
  for (int64_t d : s.dilations) dil.push_back(d - 1);  // oneDNN counts the gaps
  CachedConv c;
  c.x_plain = memory::desc(s.x, f32, s.x_nhwc ? tag::nhwc : plain_act(sp));
  c.y_plain = memory::desc(s.y, f32, s.y_nhwc ? tag::nhwc : plain_act(sp));
  c.z_plain = memory::desc(s.y, f32, s.z_nhwc ? tag::nhwc : plain_act(sp));
  c.w_plain = memory::desc(wd, f32, plain_wei(sp, grouped));
  // bfloat16 inputs: the reorders into the primitive's layouts convert them as well.
  const auto in = s.bf16 ? memory::data_type::bf16 : f32;
  const memory::desc any_x(s.x, in, tag::any), any_y(s.y, f32, tag::any), any_w(wd, in, tag::any),
      bias_md({s.w[0]}, f32, tag::x);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (s.sum) ops.append_sum(1.0f);
  if (s.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  attr.set_post_ops(ops);
  const auto desc =
      s.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                               dnnl::algorithm::convolution_direct, any_x, any_w,
                                               bias_md, any_y, strides, dil, pl, pr)
             : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                               dnnl::algorithm::convolution_direct, any_x, any_w,
                                               any_y, strides, dil, pl, pr);
  const dnnl::convolution_forward::primitive_desc pd(desc, attr, eng);
  c.prim = std::make_shared<dnnl::convolution_forward>(pd);
  c.x_md = pd.src_desc();
  c.w_md = pd.weights_desc();
  c.y_md = pd.dst_desc();
  c.scratchpad = pd.scratchpad_desc();
  c.x_in = reorder_if(eng, c.x_plain, c.x_md);
  c.w_in = reorder_if(eng, c.w_plain, c.w_md);
  c.y_out = reorder_if(eng, c.y_md, c.y_plain);
  if (s.sum) c.y_in = reorder_if(eng, c.z_plain, c.y_md);
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = cache_.emplace(key, std::move(c));
  return it->second;
}

CachedPool ConvCache::pool(const dnnl::engine& eng, const PoolShape& s) {
  std::vector<int64_t> key{s.alg, static_cast<int64_t>(s.x.size())};
  for (const auto* v : {&s.x, &s.y, &s.kernel, &s.strides, &s.dilations, &s.pad_l, &s.pad_r})
    key.insert(key.end(), v->begin(), v->end());
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pools_.find(key);
    if (it != pools_.end()) return it->second;
  }
  static std::mutex build_mu;  // as in get()
  std::lock_guard<std::mutex> build(build_mu);
  const tag t = plain_act(s.x.size() - 2);
  CachedPool c;
  c.x_md = memory::desc(s.x, memory::data_type::f32, t);
  c.y_md = memory::desc(s.y, memory::data_type::f32, t);
  memory::dims dil;
  for (int64_t d : s.dilations) dil.push_back(d - 1);
  const dnnl::algorithm alg = s.alg == 0   ? dnnl::algorithm::pooling_max
                              : s.alg == 1 ? dnnl::algorithm::pooling_avg_include_padding
                                           : dnnl::algorithm::pooling_avg_exclude_padding;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::pooling_v2_forward::primitive_desc pd(
      {dnnl::prop_kind::forward_inference, alg, c.x_md, c.y_md, s.strides, s.kernel, dil, s.pad_l,
       s.pad_r},
      attr, eng);
  c.prim = std::make_shared<dnnl::pooling_v2_forward>(pd);
  c.scratchpad = pd.scratchpad_desc();
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = pools_.emplace(key, std::move(c));
  return it->second;
}

bool pool_forward_dnnl(hp_ctx* ctx, hp_stream* st, const PoolShape& s, const float* x, float* y) {
  CachedPool c;
  try {
    c = ctx->convs.pool(ctx->engine, s);
  } catch (const dnnl::error&) {
    return false;
  }
  thread_local ScratchBuffer sb;
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(c.x_md, ctx->engine, const_cast<float*>(x))},
      {DNNL_ARG_DST, memory(c.y_md, ctx->engine, y)}};
  if (c.scratchpad.get_size() > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 memory(c.scratchpad, ctx->engine, sb.get(c.scratchpad.get_size())));
  c.prim->execute(st->dnnl_stream, args);
  st->dnnl_stream.wait();
  return true;
}

bool conv_forward_dnnl(hp_ctx* ctx, hp_stream* st, const ConvShape& s, const float* x,
                       const float* w, const float* b, const float* z, float* y,
                       int64_t weight_id) {
  const dnnl::engine& eng = ctx->engine;
  dnnl::stream& ds = st->dnnl_stream;
  CachedConv c;
  try {
    c = ctx->convs.get(eng, s);
  } catch (const dnnl::error&) {
    return false;
  }
  // This thread's buffers for the blocked operands and the scratchpad (see the file comment).
  thread_local ScratchBuffer xb, wb, yb, sb;
  auto in = [&](const std::shared_ptr<dnnl::reorder>& r, const memory::desc& plain,
                const memory::desc& md, const void* p, ScratchBuffer& buf) {
    memory user(plain, eng, const_cast<void*>(p));
    if (!r) return user;
    memory m(md, eng, buf.get(md.get_size()));
    r->execute(ds, user, m);
    return m;
  };
  memory xm = in(c.x_in, c.x_plain, c.x_md, x, xb);
  std::shared_ptr<std::vector<unsigned char>> packed;  // held until the primitive has run
  if (weight_id != 0 && c.w_in) {
    try {
      packed = ctx->packed.get(weight_id, c.w_plain, c.w_md, [&](void* buf) {
        memory user(c.w_plain, eng, const_cast<float*>(w)), to(c.w_md, eng, buf);
        c.w_in->execute(ds, user, to);
        ds.wait();
      });
    } catch (const dnnl::error&) {
      packed = nullptr;  // reordered per call below instead
    }
  }
  memory wm = packed ? memory(c.w_md, eng, packed->data()) : in(c.w_in, c.w_plain, c.w_md, w, wb);
  memory ym = c.y_out ? memory(c.y_md, eng, yb.get(c.y_md.get_size())) : memory(c.y_plain, eng, y);
  if (s.sum) {
    memory zm(c.z_plain, eng, const_cast<float*>(z));
    if (c.y_in)
      c.y_in->execute(ds, zm, ym);
    else if (z != ym.get_data_handle())
      std::copy(z, z + c.z_plain.get_size() / sizeof(float),
                static_cast<float*>(ym.get_data_handle()));
  }
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}};
  if (c.scratchpad.get_size() > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(c.scratchpad, eng, sb.get(c.scratchpad.get_size())));
  if (s.bias)
    args.emplace(DNNL_ARG_BIAS,
                 memory({{s.w[0]}, memory::data_type::f32, tag::x}, eng, const_cast<float*>(b)));
  c.prim->execute(ds, args);
  if (c.y_out) {
    memory user(c.y_plain, eng, y);
    c.y_out->execute(ds, ym, user);
  }
  ds.wait();
  return true;
}

}  // namespace hp_cpu
