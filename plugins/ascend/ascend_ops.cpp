// Generic op execution of the ascend backend (ABI 1.2 supports_op / run_op), built on the plugin's
// own ACLNN gemm and elementwise kernels: MatMul (2-D, or batched with equal batch shapes, or a 2-D
// weight shared by a batched input), Add/Sub/Mul/Div with same-shape operands or a trailing-dim
// broadcast (bias), and the unary activations ACLNN provides. Everything else answers
// "unsupported", so the host runs it on the cpu backend and copies tensors across. Only float32.
#include <cstring>
#include <string>
#include <vector>

#include "ascend_internal.h"

using hp_common::make_status;

namespace hp_ascend {
namespace {

struct UnaryOp {
  const char* onnx;
  int32_t op;
};
const UnaryOp kUnary[] = {{"Relu", HP_OP_RELU}, {"Sigmoid", HP_OP_SIGMOID}, {"Tanh", HP_OP_TANH},
                          {"Exp", HP_OP_EXP},   {"Neg", HP_OP_NEG},         {"Sqrt", HP_OP_SQRT}};
const UnaryOp kBinary[] = {
    {"Add", HP_OP_ADD}, {"Sub", HP_OP_SUB}, {"Mul", HP_OP_MUL}, {"Div", HP_OP_DIV}};

int32_t find(const UnaryOp* table, size_t n, const char* name) {
  for (size_t i = 0; i < n; ++i)
    if (std::strcmp(table[i].onnx, name) == 0) return table[i].op;
  return 0;
}

int64_t numel(const hp_tensor_desc& t) {
  int64_t n = 1;
  for (int k = 0; k < t.rank; ++k) n *= t.dims[k];
  return n;
}

hp_status* out_like(const hp_op_desc& d, const int64_t* dims, int32_t rank, hp_tensor_desc* out) {
  if (!d.alloc_output(d.alloc_user, 0, HP_F32, rank, dims, out))
    return make_status(HP_NO_MEMORY, "ascend: %s: the host could not allocate the output",
                       d.op_type);
  return nullptr;
}

hp_status* run_matmul(hp_ctx* ctx, hp_stream* s, const hp_op_desc& d) {
  const hp_tensor_desc &a = d.inputs[0], &b = d.inputs[1];
  if (a.rank < 2 || b.rank < 2)
    return make_status(HP_UNSUPPORTED, "ascend: MatMul: 1-D operands are not supported");
  const int64_t m = a.dims[a.rank - 2], k = a.dims[a.rank - 1], n = b.dims[b.rank - 1];
  if (b.dims[b.rank - 2] != k) return make_status(HP_INVALID, "ascend: MatMul: inner dims differ");
  int64_t batch_a = 1, batch_b = 1;
  for (int i = 0; i < a.rank - 2; ++i) batch_a *= a.dims[i];
  for (int i = 0; i < b.rank - 2; ++i) batch_b *= b.dims[i];
  const bool shared_b = b.rank == 2;
  if (!shared_b &&
      (a.rank != b.rank ||
       std::memcmp(a.dims, b.dims, sizeof(int64_t) * static_cast<size_t>(a.rank - 2)) != 0))
    return make_status(HP_UNSUPPORTED, "ascend: MatMul: broadcast batch dims are not supported");
  std::vector<int64_t> od(a.dims, a.dims + a.rank);
  od.back() = n;
  hp_tensor_desc y;
  if (hp_status* st = out_like(d, od.data(), a.rank, &y)) return st;
  hp_gemm_desc g;
  std::memset(&g, 0, sizeof g);
  g.struct_size = sizeof g;
  g.m = shared_b ? batch_a * m : m;
  g.n = n;
  g.k = k;
  g.lda = k;
  g.ldb = n;
  g.ldc = n;
  g.batch = shared_b ? 1 : batch_a;
  g.stride_a = m * k;
  g.stride_b = shared_b ? 0 : k * n;
  g.stride_c = m * n;
  g.alpha = 1;
  g.type_a = g.type_b = g.type_c = g.type_compute = HP_F32;
  g.a = a.data;
  g.b = b.data;
  g.c = y.data;
  (void)batch_b;
  if (g.m == 0 || n == 0 || g.batch == 0) return nullptr;
  return gemm(ctx, s, &g);
}

hp_status* run_elementwise(hp_ctx* ctx, hp_stream* s, const hp_op_desc& d, int32_t op,
                           bool binary) {
  const hp_tensor_desc& x = d.inputs[0];
  hp_elementwise_desc e;
  std::memset(&e, 0, sizeof e);
  e.struct_size = sizeof e;
  e.op = op;
  e.dtype = HP_F32;
  e.n = numel(x);
  e.x = x.data;
  if (binary) {
    const hp_tensor_desc& y = d.inputs[1];
    // y must equal x's shape or x's trailing dims (a bias), so the result has x's shape.
    if (y.rank > x.rank || std::memcmp(y.dims, x.dims + (x.rank - y.rank),
                                       sizeof(int64_t) * static_cast<size_t>(y.rank)) != 0)
      return make_status(HP_UNSUPPORTED,
                         "ascend: %s: only same-shape or trailing broadcasts are supported",
                         d.op_type);
    e.y = y.data;
    e.y_len = numel(y);
    if (e.y_len == 0) e.y_len = e.n;
  }
  hp_tensor_desc out;
  if (hp_status* st = out_like(d, x.dims, x.rank, &out)) return st;
  if (e.n == 0) return nullptr;
  e.out = out.data;
  return elementwise(ctx, s, &e);
}

}  // namespace

int32_t supports_onnx_op(hp_ctx* ctx, int32_t dev, const char* op_type, const char* domain, int64_t,
                         const int32_t* dtypes, int64_t n) {
  if (!ctx || dev < 0 || dev >= ctx->device_count || !op_type || (domain && *domain)) return 0;
  int32_t op = find(kUnary, sizeof kUnary / sizeof kUnary[0], op_type);
  const bool binary = !op && (op = find(kBinary, sizeof kBinary / sizeof kBinary[0], op_type)) != 0;
  const bool matmul = std::strcmp(op_type, "MatMul") == 0;
  if (!op && !matmul) return 0;
  if (op && !supports_op(ctx, op)) return 0;
  if (matmul && !supports_op(ctx, HP_OP_GEMM)) return 0;
  if (!dtypes) return 1;
  if (n != ((binary || matmul) ? 2 : 1)) return 0;
  for (int64_t i = 0; i < n; ++i)
    if (dtypes[i] != HP_F32) return 0;
  return 1;
}

hp_status* run_onnx_op(hp_ctx* ctx, hp_stream* s, const hp_op_desc* in) {
  if (!ctx || !s || !in || !in->op_type || !in->alloc_output)
    return make_status(HP_INVALID, "ascend: run_op: null argument");
  hp_op_desc d = hp_common::copy_in(in);
  const int32_t* none = nullptr;
  if (!supports_onnx_op(ctx, s->dev, d.op_type, d.domain, d.opset, none, 0))
    return make_status(HP_UNSUPPORTED, "ascend: op %s is not supported", d.op_type);
  if (std::strcmp(d.op_type, "MatMul") == 0)
    return d.n_inputs == 2 ? run_matmul(ctx, s, d)
                           : make_status(HP_INVALID, "ascend: MatMul needs 2 inputs");
  int32_t op = find(kUnary, sizeof kUnary / sizeof kUnary[0], d.op_type);
  if (op)
    return d.n_inputs >= 1 ? run_elementwise(ctx, s, d, op, false)
                           : make_status(HP_INVALID, "ascend: missing input");
  op = find(kBinary, sizeof kBinary / sizeof kBinary[0], d.op_type);
  return d.n_inputs == 2 ? run_elementwise(ctx, s, d, op, true)
                         : make_status(HP_INVALID, "ascend: missing input");
}

}  // namespace hp_ascend
