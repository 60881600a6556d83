// Kernels on the ascend backend through ACLNN's two-phase calls:
//   aclnn<Op>GetWorkspaceSize(tensors..., &workspace_bytes, &executor)   builds an executor
//   aclnn<Op>(workspace, workspace_bytes, executor, stream)              launches it on the stream
// Operands are described with aclCreateTensor: view dims, strides (elements), offset and the
// storage extent, which lets hp's row-major gemm with leading dimensions and transposes map onto
// aclnn without copies (a transposed operand is the same storage with swapped strides, as in ggml's
// CANN backend). Tensor and scalar descriptors are host objects and are destroyed right after the
// launch; the executor owns what it needs.
//
// GEMM: alpha == 1 and beta == 0 (the common case) is aclnnMatmul; otherwise aclnnBaddbmm computes
// out = beta * C + alpha * (A @ B). cubeMathType 1 (ALLOW_FP32_DOWN_PRECISION) lets the cube units
// use HF32 for f32 inputs, the usual speed/accuracy trade on 910B; results then differ from the cpu
// reference by ~1e-3 relative, within the conformance tolerance.
//
// Elementwise: x and out are [rows, y_len] and y is [y_len] when y broadcasts (numpy rules), else
// all three are [n]. Add/Sub take alpha = 1; Scale is aclnnMuls with an aclScalar.
#include "ascend_internal.h"

using hp_common::make_status;

namespace hp_ascend {
namespace {

constexpr int8_t kCubeMathType = 1;

/// RAII over aclTensor/aclScalar descriptors.
struct Tensor {
  const AclApi* api;
  aclTensor* t = nullptr;
  Tensor(const AclApi* a, std::vector<int64_t> dims, std::vector<int64_t> strides, const void* data)
      : api(a) {
    int64_t extent = 1;
    for (std::size_t i = 0; i < dims.size(); ++i) extent += (dims[i] - 1) * strides[i];
    int64_t storage[1] = {extent};
    t = api->aclCreateTensor(dims.data(), dims.size(), ACL_FLOAT, strides.data(), 0, ACL_FORMAT_ND,
                             storage, 1, const_cast<void*>(data));
  }
  ~Tensor() {
    if (t) api->aclDestroyTensor(t);
  }
};

struct Scalar {
  const AclApi* api;
  aclScalar* s = nullptr;
  float value;
  Scalar(const AclApi* a, double v) : api(a), value(float(v)) {
    s = api->aclCreateScalar(&value, ACL_FLOAT);
  }
  ~Scalar() {
    if (s) api->aclDestroyScalar(s);
  }
};

/// Makes sure the stream's workspace holds `bytes`; growing waits for queued kernels using the old
/// one.
hp_status* reserve_workspace(hp_ctx* ctx, hp_stream* s, uint64_t bytes) {
  if (bytes <= s->workspace_bytes) return nullptr;
  const AclApi& api = *ctx->api;
  if (s->workspace) {
    aclError err = api.aclrtSynchronizeStream(s->stream);
    if (err != ACL_SUCCESS)
      return make_status(HP_INTERNAL, "ascend: %s",
                         acl_error_text(api, "aclrtSynchronizeStream", err).c_str());
    api.aclrtFree(s->workspace);
    s->workspace = nullptr;
    s->workspace_bytes = 0;
  }
  aclError err = api.aclrtMalloc(&s->workspace, bytes, ACL_MEM_MALLOC_HUGE_FIRST);
  if (err != ACL_SUCCESS)
    return make_status(HP_NO_MEMORY, "ascend: workspace: %s",
                       acl_error_text(api, "aclrtMalloc", err).c_str());
  s->workspace_bytes = bytes;
  return nullptr;
}

using ExecFn = aclnnStatus (*)(void*, uint64_t, aclOpExecutor*, aclrtStream);

/// Second phase shared by every op: workspace, then launch. ws and ex are taken by reference
/// because callers pass them in the same call as the GetWorkspaceSize that sets them (argument
/// order is unspecified).
hp_status* launch(hp_ctx* ctx, hp_stream* s, const char* op, aclnnStatus prep, const uint64_t& ws,
                  aclOpExecutor* const& ex, ExecFn exec) {
  if (prep != 0)
    return make_status(
        HP_INTERNAL, "ascend: %s",
        acl_error_text(*ctx->api, (std::string(op) + "GetWorkspaceSize").c_str(), prep).c_str());
  if (hp_status* st = reserve_workspace(ctx, s, ws)) return st;
  aclnnStatus err = exec(ws ? s->workspace : nullptr, ws, ex, s->stream);
  return err == 0
             ? nullptr
             : make_status(HP_INTERNAL, "ascend: %s", acl_error_text(*ctx->api, op, err).c_str());
}

/// View of a row-major operand of `rows` x `cols` (as used), stored transposed or not, batched.
Tensor operand(const AclApi* api, const hp_gemm_desc& d, const void* p, int64_t stride,
               int64_t rows, int64_t cols, int64_t ld, bool trans, bool three_d) {
  std::vector<int64_t> dims{rows, cols},
      strides = trans ? std::vector<int64_t>{1, ld} : std::vector<int64_t>{ld, 1};
  if (three_d) {
    dims.insert(dims.begin(), stride == 0 ? 1 : d.batch);
    strides.insert(strides.begin(), stride == 0 ? rows * cols : stride);
  }
  return Tensor(api, dims, strides, p);
}

}  // namespace

int32_t supports_op(const hp_ctx* ctx, int32_t op) {
  const AclApi& a = *ctx->api;
  switch (op) {
    case HP_OP_GEMM:
      return 1;
// Each use of a case macro ends with ';' so every case is its own statement (clang-format keeps
// them one per line).
#define HP_CASE(hp_op_id, Op) \
  case hp_op_id: return a.aclnn##Op##GetWorkspaceSize && a.aclnn##Op
      HP_CASE(HP_OP_ADD, Add);
      HP_CASE(HP_OP_SUB, Sub);
      HP_CASE(HP_OP_MUL, Mul);
      HP_CASE(HP_OP_DIV, Div);
      HP_CASE(HP_OP_MAX, Maximum);
      HP_CASE(HP_OP_MIN, Minimum);
      HP_CASE(HP_OP_RELU, Relu);
      HP_CASE(HP_OP_GELU, Gelu);
      HP_CASE(HP_OP_SILU, Silu);
      HP_CASE(HP_OP_SIGMOID, Sigmoid);
      HP_CASE(HP_OP_TANH, Tanh);
      HP_CASE(HP_OP_EXP, Exp);
      HP_CASE(HP_OP_NEG, Neg);
      HP_CASE(HP_OP_SQRT, Sqrt);
      HP_CASE(HP_OP_SCALE, Muls);
#undef HP_CASE
    default: return 0;
  }
}

hp_status* gemm(hp_ctx* ctx, hp_stream* s, const hp_gemm_desc* in) {
  hp_gemm_desc d = hp_common::copy_in(in);
  if (hp_status* st = hp_common::check_gemm(kAscend, d)) return st;
  if (hp_status* st = use_device(ctx, s->dev)) return st;
  const AclApi* api = ctx->api;
  bool plain = d.alpha == 1.0 && d.beta == 0.0;
  if (!plain && !(api->aclnnBaddbmmGetWorkspaceSize && api->aclnnBaddbmm))
    return make_status(HP_UNSUPPORTED,
                       "ascend: gemm with alpha/beta needs aclnnBaddbmm, absent from libopapi.so");
  bool three_d = d.batch > 1 || !plain;
  Tensor a = operand(api, d, d.a, d.stride_a, d.m, d.k, d.lda, d.trans_a, three_d);
  Tensor b = operand(api, d, d.b, d.stride_b, d.k, d.n, d.ldb, d.trans_b, three_d);
  Tensor c = operand(api, d, d.c, d.stride_c, d.m, d.n, d.ldc, false, three_d);
  if (!a.t || !b.t || !c.t) return make_status(HP_INTERNAL, "ascend: gemm: aclCreateTensor failed");
  uint64_t ws = 0;
  aclOpExecutor* ex = nullptr;
  if (plain) {
    aclnnStatus prep = api->aclnnMatmulGetWorkspaceSize(a.t, b.t, c.t, kCubeMathType, &ws, &ex);
    return launch(ctx, s, "aclnnMatmul", prep, ws, ex, api->aclnnMatmul);
  }
  Scalar alpha(api, d.alpha), beta(api, d.beta);
  aclnnStatus prep = api->aclnnBaddbmmGetWorkspaceSize(c.t, a.t, b.t, beta.s, alpha.s, c.t,
                                                       kCubeMathType, &ws, &ex);
  return launch(ctx, s, "aclnnBaddbmm", prep, ws, ex, api->aclnnBaddbmm);
}

hp_status* elementwise(hp_ctx* ctx, hp_stream* s, const hp_elementwise_desc* in) {
  hp_elementwise_desc d = hp_common::copy_in(in);
  if (hp_status* st = hp_common::check_elementwise(kAscend, d)) return st;
  if (d.n == 0) return nullptr;
  if (!supports_op(ctx, d.op))
    return make_status(HP_UNSUPPORTED,
                       "ascend: elementwise op %d: its aclnn operator is absent from libopapi.so",
                       d.op);
  if (hp_status* st = use_device(ctx, s->dev)) return st;
  const AclApi* api = ctx->api;
  int64_t y_len = d.y_len == 0 ? d.n : d.y_len;
  bool bcast = hp_common::is_binary(d.op) && y_len != d.n;
  std::vector<int64_t> xdims =
      bcast ? std::vector<int64_t>{d.n / y_len, y_len} : std::vector<int64_t>{d.n};
  std::vector<int64_t> xstrides = bcast ? std::vector<int64_t>{y_len, 1} : std::vector<int64_t>{1};
  Tensor x(api, xdims, xstrides, d.x), out(api, xdims, xstrides, d.out);
  uint64_t ws = 0;
  aclOpExecutor* ex = nullptr;
  if (hp_common::is_binary(d.op)) {
    Tensor y(api, {y_len}, {1}, d.y);
    Scalar one(api, 1.0);
    switch (d.op) {
#define HP_ALPHA(hp_op_id, Op)                                                                \
  case hp_op_id:                                                                              \
    return launch(ctx, s, "aclnn" #Op,                                                        \
                  api->aclnn##Op##GetWorkspaceSize(x.t, y.t, one.s, out.t, &ws, &ex), ws, ex, \
                  api->aclnn##Op)
#define HP_BIN(hp_op_id, Op)                                                           \
  case hp_op_id:                                                                       \
    return launch(ctx, s, "aclnn" #Op,                                                 \
                  api->aclnn##Op##GetWorkspaceSize(x.t, y.t, out.t, &ws, &ex), ws, ex, \
                  api->aclnn##Op)
      HP_ALPHA(HP_OP_ADD, Add);
      HP_ALPHA(HP_OP_SUB, Sub);
      HP_BIN(HP_OP_MUL, Mul);
      HP_BIN(HP_OP_DIV, Div);
      HP_BIN(HP_OP_MAX, Maximum);
      HP_BIN(HP_OP_MIN, Minimum);
#undef HP_ALPHA
#undef HP_BIN
    }
  }
  if (d.op == HP_OP_SCALE) {
    Scalar k(api, d.scalar);
    return launch(ctx, s, "aclnnMuls", api->aclnnMulsGetWorkspaceSize(x.t, k.s, out.t, &ws, &ex),
                  ws, ex, api->aclnnMuls);
  }
  switch (d.op) {
#define HP_UN(hp_op_id, Op)                                                                        \
  case hp_op_id:                                                                                   \
    return launch(ctx, s, "aclnn" #Op, api->aclnn##Op##GetWorkspaceSize(x.t, out.t, &ws, &ex), ws, \
                  ex, api->aclnn##Op)
    HP_UN(HP_OP_RELU, Relu);
    HP_UN(HP_OP_GELU, Gelu);
    HP_UN(HP_OP_SILU, Silu);
    HP_UN(HP_OP_SIGMOID, Sigmoid);
    HP_UN(HP_OP_TANH, Tanh);
    HP_UN(HP_OP_EXP, Exp);
    HP_UN(HP_OP_NEG, Neg);
    HP_UN(HP_OP_SQRT, Sqrt);
#undef HP_UN
  }
  return make_status(HP_UNSUPPORTED, "ascend: elementwise: unknown op %d", d.op);
}

}  // namespace hp_ascend
