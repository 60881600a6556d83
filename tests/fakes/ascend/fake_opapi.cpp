// Fake libopapi.so: ACLNN operators computed on the host (see fake_acl.h). Each
// aclnn<Op>GetWorkspaceSize validates the descriptors the way the real operators reject bad input
// (dtype, ranks, broadcastable shapes, data resident on the device), snapshots them into an
// executor and states a workspace size; aclnn<Op> checks the workspace and queues the executor on
// the stream. Indexing honours each tensor's view dims, strides and offset, and broadcasting
// follows numpy rules.
#include <cmath>
#include <cstring>

#include "fake_acl.h"

namespace {

constexpr aclnnStatus kParamInvalid = 161002;  // ACLNN_ERR_PARAM_INVALID
constexpr uint64_t kMatmulWorkspace =
    4096;  // any nonzero size exercises the plugin's workspace path

aclnnStatus invalid(const std::string& message) {
  fake_acl::set_error("fake aclnn: " + message);
  return kParamInvalid;
}

/// Elements spanned by a view (offset included), for the residency check.
int64_t extent(const aclTensor& t) {
  int64_t e = t.offset + 1;
  for (std::size_t i = 0; i < t.dims.size(); ++i) {
    if (t.dims[i] == 0) return 0;
    e += (t.dims[i] - 1) * t.strides[i];
  }
  return e;
}

bool valid(const aclTensor* t, const char* what, std::string* err) {
  if (!t) return *err = std::string(what) + " is null", false;
  if (t->dtype != ACL_FLOAT) return *err = std::string(what) + " is not ACL_FLOAT", false;
  if (!fake_acl::is_device_range(t->data, uint64_t(extent(*t)) * sizeof(float)))
    return *err = std::string(what) + " data is not device memory", false;
  return true;
}

/// Offset of the element of `t` at output index `idx` (rank of the output), with broadcasting.
int64_t offset_of(const aclTensor& t, const std::vector<int64_t>& idx) {
  std::size_t shift = idx.size() - t.dims.size();
  int64_t off = t.offset;
  for (std::size_t j = 0; j < t.dims.size(); ++j)
    if (t.dims[j] != 1) off += idx[j + shift] * t.strides[j];
  return off;
}

bool broadcastable(const aclTensor& in, const aclTensor& out) {
  if (in.dims.size() > out.dims.size()) return false;
  std::size_t shift = out.dims.size() - in.dims.size();
  for (std::size_t j = 0; j < in.dims.size(); ++j)
    if (in.dims[j] != 1 && in.dims[j] != out.dims[j + shift]) return false;
  return true;
}

/// Calls f(idx) for every index of `dims` in row-major order.
template <class F>
void for_each_index(const std::vector<int64_t>& dims, F f) {
  int64_t total = 1;
  for (int64_t d : dims) total *= d;
  std::vector<int64_t> idx(dims.size(), 0);
  for (int64_t n = 0; n < total; ++n) {
    f(idx);
    for (int j = int(dims.size()) - 1; j >= 0; --j) {
      if (++idx[j] < dims[j]) break;
      idx[j] = 0;
    }
  }
}

float* at(const aclTensor& t, int64_t off) { return static_cast<float*>(t.data) + off; }

aclnnStatus make_executor(std::function<void()> run, uint64_t ws, uint64_t* ws_out,
                          aclOpExecutor** ex) {
  if (!ws_out || !ex) return invalid("null workspaceSize or executor output");
  *ws_out = ws;
  *ex = new aclOpExecutor{std::move(run), ws};
  return 0;
}

aclnnStatus execute(void* workspace, uint64_t ws_size, aclOpExecutor* ex, aclrtStream stream) {
  if (!ex) return invalid("null executor");
  if (ws_size < ex->workspace) return invalid("workspace smaller than GetWorkspaceSize said");
  if (ex->workspace > 0 && !fake_acl::is_device_range(workspace, ex->workspace))
    return invalid("workspace is not device memory");
  if (!fake_acl::enqueue(stream, [ex] {
        ex->run();
        delete ex;
      }))
    return invalid("null stream");
  return 0;
}

template <class F>
aclnnStatus prepare_binary(const aclTensor* a, const aclTensor* b, aclTensor* out, F f,
                           uint64_t* ws, aclOpExecutor** ex) {
  std::string err;
  if (!valid(a, "self", &err) || !valid(b, "other", &err) || !valid(out, "out", &err))
    return invalid(err);
  if (!broadcastable(*a, *out) || !broadcastable(*b, *out))
    return invalid("operands do not broadcast to out");
  aclTensor A = *a, B = *b, O = *out;
  return make_executor(
      [=] {
        for_each_index(O.dims, [&](const std::vector<int64_t>& i) {
          *at(O, offset_of(O, i)) = f(*at(A, offset_of(A, i)), *at(B, offset_of(B, i)));
        });
      },
      0, ws, ex);
}

template <class F>
aclnnStatus prepare_unary(const aclTensor* a, aclTensor* out, F f, uint64_t* ws,
                          aclOpExecutor** ex) {
  std::string err;
  if (!valid(a, "self", &err) || !valid(out, "out", &err)) return invalid(err);
  if (a->dims != out->dims) return invalid("self and out shapes differ");
  aclTensor A = *a, O = *out;
  return make_executor(
      [=] {
        for_each_index(O.dims, [&](const std::vector<int64_t>& i) {
          *at(O, offset_of(O, i)) = f(*at(A, offset_of(A, i)));
        });
      },
      0, ws, ex);
}

/// out[b] = alpha * a[b] @ m[b] + beta * self[b] over 2-D or 3-D views (batch 1 broadcasts).
aclnnStatus prepare_matmul(const aclTensor* self, const aclTensor* a, const aclTensor* m,
                           aclTensor* out, double alpha, double beta, uint64_t* ws,
                           aclOpExecutor** ex) {
  std::string err;
  if (!valid(a, "self", &err) || !valid(m, "mat2", &err) || !valid(out, "out", &err) ||
      (self && !valid(self, "bias", &err)))
    return invalid(err);
  std::size_t r = out->dims.size();
  if ((r != 2 && r != 3) || a->dims.size() != r || m->dims.size() != r ||
      (self && self->dims.size() != r))
    return invalid("matmul operands must all be 2-D or all 3-D");
  int64_t M = a->dims[r - 2], K = a->dims[r - 1], N = m->dims[r - 1];
  if (m->dims[r - 2] != K || out->dims[r - 2] != M || out->dims[r - 1] != N)
    return invalid("matmul shapes do not agree");
  int64_t batch = r == 3 ? out->dims[0] : 1;
  if (r == 3 &&
      ((a->dims[0] != 1 && a->dims[0] != batch) || (m->dims[0] != 1 && m->dims[0] != batch)))
    return invalid("matmul batch dims do not broadcast");
  aclTensor A = *a, B = *m, O = *out, S = self ? *self : aclTensor();
  bool has_self = self != nullptr && beta != 0.0;
  return make_executor(
      [=] {
        std::vector<float> result(std::size_t(batch * M * N));
        auto off = [r](const aclTensor& t, int64_t b, int64_t i, int64_t j) {
          int64_t o = t.offset + i * t.strides[r - 2] + j * t.strides[r - 1];
          if (r == 3 && t.dims[0] != 1) o += b * t.strides[0];
          return o;
        };
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double acc = 0;
              for (int64_t p = 0; p < K; ++p)
                acc += double(*at(A, off(A, b, i, p))) * double(*at(B, off(B, b, p, j)));
              double v = alpha * acc + (has_self ? beta * double(*at(S, off(S, b, i, j))) : 0.0);
              result[std::size_t((b * M + i) * N + j)] = float(v);
            }
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j)
              *at(O, off(O, b, i, j)) = result[std::size_t((b * M + i) * N + j)];
      },
      kMatmulWorkspace, ws, ex);
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

extern "C" {

#ifndef FAKE_OPAPI_OLD  // the "old CANN" variant lacks aclnnMatmul, to test the HP_VERSION path
FAKE_ACL_EXPORT aclnnStatus aclnnMatmulGetWorkspaceSize(const aclTensor* self,
                                                        const aclTensor* mat2, aclTensor* out,
                                                        int8_t, uint64_t* ws, aclOpExecutor** ex) {
  return prepare_matmul(nullptr, self, mat2, out, 1.0, 0.0, ws, ex);
}
#endif

FAKE_ACL_EXPORT aclnnStatus aclnnBaddbmmGetWorkspaceSize(
    const aclTensor* self, const aclTensor* batch1, const aclTensor* batch2, const aclScalar* beta,
    const aclScalar* alpha, aclTensor* out, int8_t, uint64_t* ws, aclOpExecutor** ex) {
  if (!beta || !alpha) return invalid("null alpha or beta");
  if (!self || self->dims.size() != 3) return invalid("baddbmm needs 3-D tensors");
  return prepare_matmul(self, batch1, batch2, out, alpha->value, beta->value, ws, ex);
}

#define FAKE_EXEC(Op)                                                                      \
  FAKE_ACL_EXPORT aclnnStatus aclnn##Op(void* workspace, uint64_t size, aclOpExecutor* ex, \
                                        aclrtStream stream) {                              \
    return execute(workspace, size, ex, stream);                                           \
  }
#ifndef FAKE_OPAPI_OLD
FAKE_EXEC(Matmul)
#endif
FAKE_EXEC(Baddbmm)

#define FAKE_BINARY_ALPHA(Op, expr)                                                          \
  FAKE_ACL_EXPORT aclnnStatus aclnn##Op##GetWorkspaceSize(                                   \
      const aclTensor* self, const aclTensor* other, const aclScalar* alpha, aclTensor* out, \
      uint64_t* ws, aclOpExecutor** ex) {                                                    \
    if (!alpha) return invalid("null alpha");                                                \
    float k = float(alpha->value);                                                           \
    return prepare_binary(                                                                   \
        self, other, out, [k](float a, float b) { return expr; }, ws, ex);                   \
  }                                                                                          \
  FAKE_EXEC(Op)
#define FAKE_BINARY(Op, expr)                                                                     \
  FAKE_ACL_EXPORT aclnnStatus aclnn##Op##GetWorkspaceSize(const aclTensor* self,                  \
                                                          const aclTensor* other, aclTensor* out, \
                                                          uint64_t* ws, aclOpExecutor** ex) {     \
    return prepare_binary(                                                                        \
        self, other, out, [](float a, float b) { return expr; }, ws, ex);                         \
  }                                                                                               \
  FAKE_EXEC(Op)
#define FAKE_UNARY(Op, expr)                                                                     \
  FAKE_ACL_EXPORT aclnnStatus aclnn##Op##GetWorkspaceSize(const aclTensor* self, aclTensor* out, \
                                                          uint64_t* ws, aclOpExecutor** ex) {    \
    return prepare_unary(                                                                        \
        self, out, [](float v) { return expr; }, ws, ex);                                        \
  }                                                                                              \
  FAKE_EXEC(Op)

FAKE_BINARY_ALPHA(Add, a + k * b)
FAKE_BINARY_ALPHA(Sub, a - k * b)
FAKE_BINARY(Mul, a* b)
FAKE_BINARY(Div, a / b)
FAKE_BINARY(Maximum, a > b ? a : b)
FAKE_BINARY(Minimum, a < b ? a : b)
FAKE_UNARY(Relu, v > 0.0f ? v : 0.0f)
FAKE_UNARY(Gelu, float(0.5 * v * (1.0 + std::erf(double(v) / std::sqrt(2.0)))))
FAKE_UNARY(Silu, v* sigmoid(v))
FAKE_UNARY(Sigmoid, sigmoid(v))
FAKE_UNARY(Tanh, std::tanh(v))
FAKE_UNARY(Exp, std::exp(v))
FAKE_UNARY(Neg, -v)
FAKE_UNARY(Sqrt, std::sqrt(v))

FAKE_ACL_EXPORT aclnnStatus aclnnMulsGetWorkspaceSize(const aclTensor* self, const aclScalar* other,
                                                      aclTensor* out, uint64_t* ws,
                                                      aclOpExecutor** ex) {
  if (!other) return invalid("null scalar");
  float k = float(other->value);
  return prepare_unary(
      self, out, [k](float v) { return v * k; }, ws, ex);
}
FAKE_EXEC(Muls)

}  // extern "C"
