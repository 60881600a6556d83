// GEMM on the cpu backend through oneDNN's matmul primitive.
//
// hp's gemm is row-major with optional transposes, leading dimensions and batch strides; oneDNN
// describes all of that with strided memory descriptors, so no data is repacked: A is {batch, m, k}
// with strides {stride_a, lda, 1}, or {stride_a, 1, lda} when stored transposed, likewise B, and C
// is {batch, m, n} with strides {stride_c, ldc, 1}. A batch stride of 0 becomes a batch dimension
// of 1, which oneDNN broadcasts. alpha is an output scale and beta a sum post-op, both fixed at
// creation.
//
// Creating a primitive JIT-compiles a kernel (milliseconds), so primitives are cached by everything
// that defines them (GemmKey) and shared by every caller of the backend; the cache lock is held
// only for the lookup. Sharing needs care: with oneDNN's default library-managed scratchpad (and
// Debian's build without DNNL_ENABLE_CONCURRENT_EXEC) the scratchpad is common to all primitives
// and a primitive must run on the thread that created it. `hp verify --simulate` runs every rank on
// its own thread over one backend, so two ranks executed the same matmul at once and overwrote each
// other's partial sums (wrong outputs on some runs only). So primitives are created with a
// user-managed scratchpad and each execution passes a buffer of the executing thread's own. oneDNN
// reports unsupported descriptors with exceptions: we catch them and fall back to a plain triple
// loop, which is slow but makes the backend total over valid descriptors.
//
// With the plugin opened "compute=bf16" (cpu_plugin.cpp), float32 A and B are converted to
// bfloat16 by reorders on each call and multiplied by oneDNN's bfloat16 kernels (AVX512-BF16 or
// AMX) with float32 accumulation and C: 1.8x the float32 speed on a 512 x 512 x 2048 product here,
// conversions included.
//
// A weight the executor names constant (GemmEpilogue::weight_id) is handed to the primitive in the
// layout and type it picks for it ("any"), reordered once and kept (PackedWeights), where that
// differs from B as given. In bfloat16 that is always (the conversion then runs once, not on every
// call: the GPT-style benchmark model's 8-token run 6.8 -> 6.2 ms, its 512-token run 77 -> 74 ms);
// oneDNN 2.6's float32 brgemm takes plain weights at every size measured, so float32 weights are
// read in place and never duplicated.
//
// gemm_fused adds a per-column bias and an activation (ReLU, exact GELU) in the same primitive, as
// oneDNN's bias argument and eltwise post-op: a linear layer's MatMul + Add (+ Gelu) in one pass
// over C instead of three (the executor rewrites those chains, libs/exec/src/exec_fuse.cpp).
#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <vector>

#include "cpu_internal.h"
#include "cpu_kernels.h"

namespace hp_cpu {
namespace {

using dnnl::memory;
using Dims = memory::dims;

GemmKey key_of(const hp_gemm_desc& d, bool bias, GemmAct act, bool bf16, bool packed,
               bool residual) {
  return GemmKey{d.trans_a != 0,
                 d.trans_b != 0,
                 d.m,
                 d.n,
                 d.k,
                 d.lda,
                 d.ldb,
                 d.ldc,
                 d.batch,
                 d.stride_a,
                 d.stride_b,
                 d.stride_c,
                 d.alpha,
                 d.beta,
                 bias,
                 static_cast<int>(act),
                 bf16,
                 packed,
                 residual};
}

/// The bias as oneDNN's matmul takes it: one row of n values broadcast over batch and rows.
memory::desc bias_desc(const hp_gemm_desc& d) {
  return memory::desc(Dims{1, 1, d.n}, memory::data_type::f32, Dims{d.n, d.n, 1});
}

/// Strided descriptor of an operand of `rows` x `cols` (as used), stored transposed or not.
memory::desc operand_desc(int64_t batch, int64_t stride, int64_t rows, int64_t cols, int64_t ld,
                          bool trans, memory::data_type dt = memory::data_type::f32) {
  int64_t b = stride == 0 ? 1 : batch;
  int64_t bs = stride == 0 ? rows * cols : stride;
  Dims strides = trans ? Dims{bs, 1, ld} : Dims{bs, ld, 1};
  return memory::desc(Dims{b, rows, cols}, dt, strides);
}

memory::desc a_desc(const hp_gemm_desc& d, memory::data_type dt = memory::data_type::f32) {
  return operand_desc(d.batch, d.stride_a, d.m, d.k, d.lda, d.trans_a, dt);
}
memory::desc b_desc(const hp_gemm_desc& d, memory::data_type dt = memory::data_type::f32) {
  return operand_desc(d.batch, d.stride_b, d.k, d.n, d.ldb, d.trans_b, dt);
}
memory::desc c_desc(const hp_gemm_desc& d) {
  return operand_desc(d.batch, d.stride_c, d.m, d.n, d.ldc, false);
}

}  // namespace

CachedGemm GemmCache::get(const dnnl::engine& eng, const hp_gemm_desc& d, bool bias, GemmAct act,
                          bool bf16, bool packed_b, bool residual) {
  GemmKey key = key_of(d, bias, act, bf16, packed_b, residual);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
  }
  // oneDNN's global primitive cache is shared by every context of the process (the ranks of a
  // simulated run are threads); building primitives one at a time keeps its insertions and lookups
  // apart. ThreadSanitizer reported them racing inside libdnnl (tests/stress, packaging/
  // run-tests.sh), and a primitive is built once per shape, so the lock costs nothing at run time.
  static std::mutex build_mu;
  std::lock_guard<std::mutex> build(build_mu);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (d.alpha != 1.0) attr.set_output_scales(0, {float(d.alpha)});
  dnnl::post_ops ops;
  if (d.beta != 0.0) ops.append_sum(float(d.beta));
  if (act == GemmAct::relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (act == GemmAct::gelu_erf)
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
  CachedGemm built;
  // A constant B of a single product (batch 1: a linear layer's, the batch folded into M) is
  // described in 2-D: there oneDNN's "any" picks a blocked weight layout (BA16a64b-like), whose
  // reads ran 1.15x (512 rows of A) to 2x (8 rows) faster than the plain layout's, while for the
  // 3-D descriptors it keeps the plain one.
  const bool flat = packed_b && d.batch == 1;
  const auto f32 = memory::data_type::f32;
  auto two_d = [](int64_t rows, int64_t cols, int64_t ld, bool trans, memory::data_type dt) {
    return memory::desc(Dims{rows, cols}, dt, trans ? Dims{1, ld} : Dims{ld, 1});
  };
  built.a_md = flat ? two_d(d.m, d.k, d.lda, d.trans_a, f32) : a_desc(d);
  built.b_md = flat ? two_d(d.k, d.n, d.ldb, d.trans_b, f32) : b_desc(d);
  built.c_md = flat ? two_d(d.m, d.n, d.ldc, false, f32) : c_desc(d);
  built.bias_md = flat ? memory::desc(Dims{1, d.n}, f32, Dims{d.n, 1}) : bias_desc(d);
  if (residual) {  // read as C is laid out
    built.residual_post_op = ops.len();
    ops.append_binary(dnnl::algorithm::binary_add, built.c_md);
  }
  attr.set_post_ops(ops);
  // bfloat16: A and B in bfloat16 with their float32 strides (a converting reorder each), C and
  // the accumulation float32.
  const memory::data_type in = bf16 ? memory::data_type::bf16 : f32;
  const memory::desc a = flat ? two_d(d.m, d.k, d.lda, d.trans_a, in) : a_desc(d, in);
  // A constant B: the kernel's own layout ("any"), packed once (PackedWeights).
  const memory::desc b = !packed_b ? b_desc(d, in)
                         : flat    ? memory::desc(Dims{d.k, d.n}, in, memory::format_tag::any)
                                   : memory::desc(Dims{1, d.k, d.n}, in, memory::format_tag::any);
  dnnl::matmul::desc md = bias ? dnnl::matmul::desc(a, b, built.bias_md, built.c_md)
                               : dnnl::matmul::desc(a, b, built.c_md);
  dnnl::matmul::primitive_desc pd(md, attr, eng);
  built.prim = std::make_shared<dnnl::matmul>(pd);
  built.scratchpad = pd.scratchpad_desc();
  // A packed copy only where it differs from B as given (float32 weights the kernel takes in their
  // plain layout are read in place, not duplicated).
  if (packed_b && !(pd.weights_desc() == built.b_md)) {
    built.b_packed = pd.weights_desc();
    built.b_pack = std::make_shared<dnnl::reorder>(dnnl::reorder::primitive_desc(
        eng, built.b_md, eng, built.b_packed, dnnl::primitive_attr()));
  }
  if (bf16) {
    built.a16 = a;
    built.b16 = b;
    built.a_cvt = std::make_shared<dnnl::reorder>(
        dnnl::reorder::primitive_desc(eng, built.a_md, eng, a, dnnl::primitive_attr()));
    if (!packed_b)
      built.b_cvt = std::make_shared<dnnl::reorder>(
          dnnl::reorder::primitive_desc(eng, built.b_md, eng, b, dnnl::primitive_attr()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Two threads may have built the same primitive; keep the first so callers share one.
  auto [it, inserted] = cache_.emplace(key, std::move(built));
  return it->second;
}

std::size_t GemmCache::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.size();
}

void reference_gemm(const hp_gemm_desc& d) {
  const float* A = static_cast<const float*>(d.a);
  const float* B = static_cast<const float*>(d.b);
  float* C = static_cast<float*>(d.c);
  for (int64_t b = 0; b < d.batch; ++b) {
    const float* a = A + b * d.stride_a;
    const float* bm = B + b * d.stride_b;
    float* c = C + b * d.stride_c;
    for (int64_t i = 0; i < d.m; ++i) {
      for (int64_t j = 0; j < d.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < d.k; ++p) {
          float av = d.trans_a ? a[p * d.lda + i] : a[i * d.lda + p];
          float bv = d.trans_b ? bm[j * d.ldb + p] : bm[p * d.ldb + j];
          acc += double(av) * double(bv);
        }
        float& out = c[i * d.ldc + j];
        out = float(d.alpha * acc + (d.beta == 0.0 ? 0.0 : d.beta * double(out)));
      }
    }
  }
}

namespace {

/// Runs a cached primitive on this thread's scratchpad (see the file comment).
/// false (nothing run) when B should be packed but the packing budget is spent.
bool execute(hp_ctx* ctx, hp_stream* s, const CachedGemm& g, const hp_gemm_desc& d,
             const float* bias, int64_t weight_id, const float* residual = nullptr) {
  thread_local std::vector<unsigned char> scratch, a16, b16;
  if (scratch.size() < g.scratchpad.get_size()) scratch.resize(g.scratchpad.get_size());
  memory a(g.a_md, ctx->engine, const_cast<void*>(d.a));
  memory b(g.b_md, ctx->engine, const_cast<void*>(d.b));
  std::shared_ptr<std::vector<unsigned char>> packed;  // held until the primitive has run
  if (g.b_pack) {
    packed = ctx->packed.get(weight_id, g.b_md, g.b_packed, [&](void* buf) {
      memory to(g.b_packed, ctx->engine, buf);
      g.b_pack->execute(s->dnnl_stream, b, to);
      s->dnnl_stream.wait();
    });
    if (!packed) return false;  // over the packing budget: the caller runs the unpacked product
    b = memory(g.b_packed, ctx->engine, packed->data());
  }
  if (g.a_cvt) {
    if (a16.size() < g.a16.get_size()) a16.resize(g.a16.get_size());
    memory a2(g.a16, ctx->engine, a16.data());
    g.a_cvt->execute(s->dnnl_stream, a, a2);
    a = a2;
  }
  if (g.b_cvt) {
    if (b16.size() < g.b16.get_size()) b16.resize(g.b16.get_size());
    memory b2(g.b16, ctx->engine, b16.data());
    g.b_cvt->execute(s->dnnl_stream, b, b2);
    b = b2;
  }
  memory c(g.c_md, ctx->engine, d.c);
  memory sp(g.scratchpad, ctx->engine, scratch.data());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, sp}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(g.bias_md, ctx->engine, const_cast<float*>(bias)));
  if (g.residual_post_op >= 0)
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(g.residual_post_op) | DNNL_ARG_SRC_1,
                 memory(g.c_md, ctx->engine, const_cast<float*>(residual)));
  g.prim->execute(s->dnnl_stream, args);
  s->dnnl_stream.wait();
  return true;
}

/// The epilogue on C after reference_gemm, for descriptors oneDNN rejects.
void reference_epilogue(const hp_gemm_desc& d, const GemmEpilogue& e) {
  auto* C = static_cast<float*>(d.c);
  for (int64_t q = 0; q < d.batch; ++q)
    for (int64_t i = 0; i < d.m; ++i) {
      float* row = C + q * d.stride_c + i * d.ldc;
      if (e.bias)
        for (int64_t j = 0; j < d.n; ++j) row[j] += e.bias[j];
      if (e.act == GemmAct::relu)
        for (int64_t j = 0; j < d.n; ++j) row[j] = std::max(row[j], 0.0f);
      if (e.act == GemmAct::gelu_erf) gelu_span(row, row, d.n);
      if (e.residual) {
        const float* r = e.residual + q * d.stride_c + i * d.ldc;
        for (int64_t j = 0; j < d.n; ++j) row[j] += r[j];
      }
    }
}

}  // namespace

hp_status* gemm(hp_ctx* ctx, hp_stream* s, const hp_gemm_desc* in) {
  if (!ctx || !s || !in) return hp_common::make_status(HP_INVALID, "cpu: gemm: null argument");
  hp_gemm_desc d = hp_common::copy_in(in);
  if (hp_status* st = hp_common::check_gemm(kCpu, d)) return st;
  CachedGemm g;
  try {
    g = ctx->gemms.get(ctx->engine, d, false, GemmAct::none, ctx->bf16 && d.type_a == HP_F32);
  } catch (const dnnl::error&) {
    reference_gemm(d);  // descriptor oneDNN does not take: slow but correct
    return nullptr;
  }
  HP_PLUGIN_GUARD(kCpu, {
    execute(ctx, s, g, d, nullptr, 0);
    return nullptr;
  })
}

hp_status* gemm_fused(hp_ctx* ctx, hp_stream* s, const hp_gemm_desc& d, const GemmEpilogue& e) {
  if (hp_status* st = hp_common::check_gemm(kCpu, d)) return st;
  if (d.beta != 0.0 || d.type_c != HP_F32)
    return hp_common::make_status(HP_INVALID, "cpu: fused gemm needs float32 and beta 0");
  if (!e.bias && e.act == GemmAct::none && e.weight_id == 0 && !e.residual) return gemm(ctx, s, &d);
  const bool residual = e.residual != nullptr;
  CachedGemm g;
  try {
    // Packing applies to one B shared by every row of A (a weight): batch 1, or a broadcast B.
    const bool pack = e.weight_id != 0 && (d.batch == 1 || d.stride_b == 0);
    g = ctx->gemms.get(ctx->engine, d, e.bias != nullptr, e.act, ctx->bf16, pack, residual);
  } catch (const dnnl::error&) {
    reference_gemm(d);
    reference_epilogue(d, e);
    return nullptr;
  }
  HP_PLUGIN_GUARD(kCpu, {
    if (!execute(ctx, s, g, d, e.bias, e.weight_id, e.residual))
      execute(ctx, s,
              ctx->gemms.get(ctx->engine, d, e.bias != nullptr, e.act, ctx->bf16, false, residual),
              d, e.bias, 0, e.residual);
    return nullptr;
  })
}

}  // namespace hp_cpu
