// cuBLAS at run time, and the gemm built on it. The plugin links cudart statically (which itself
// dlopens the driver, libcuda.so.1) and opens cuBLAS with dlopen, so it has no DT_NEEDED entry on
// any NVIDIA library and loads, then explains itself, on machines without them.
//
// hp's gemm is row-major; cuBLAS is column-major. A row-major m x n matrix with row stride ld is
// the column-major n x m matrix with leading dimension ld, i.e. its transpose, so
//     C = op(A) op(B)   (row-major)   <=>   C^T = op(B)^T op(A)^T   (column-major)
// and the call swaps the operands and m/n while keeping each operand's own transpose flag. Batch
// strides map directly, including stride 0 for a broadcast operand.
#include <dlfcn.h>

#include <climits>
#include <cstdlib>

#include "cuda_internal.h"

using hp_common::make_status;

namespace hp_cuda {

std::string cuda_error_text(const char* call, cudaError_t err) {
  return std::string(call) + ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")";
}

hp_status* load_blas(const Blas** out) {
  static std::mutex mu;
  static Blas* loaded = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (loaded) {
    *out = loaded;
    return nullptr;
  }
  std::vector<std::string> names;
  if (const char* env = std::getenv("HP_CUBLAS_LIB"); env && *env) names.push_back(env);
  for (const char* n : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) names.push_back(n);
  std::string tried;
  void* h = nullptr;
  std::string used;
  for (const auto& n : names) {
    dlerror();
    h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) {
      used = n;
      break;
    }
    const char* err = dlerror();
    tried += (tried.empty() ? "" : "; ") + n + ": " + (err ? err : "dlopen failed");
  }
  if (!h)
    return make_status(HP_UNAVAILABLE,
                       "cuda: cuBLAS not found (tried %s); add the CUDA toolkit's lib64 to "
                       "LD_LIBRARY_PATH or set HP_CUBLAS_LIB",
                       tried.c_str());
  auto* b = new Blas();
  b->library = used;
  auto sym = [&](const char* name, auto& fn) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    return fn != nullptr;
  };
  const char* missing = nullptr;
  if (!sym("cublasCreate_v2", b->create))
    missing = "cublasCreate_v2";
  else if (!sym("cublasDestroy_v2", b->destroy))
    missing = "cublasDestroy_v2";
  else if (!sym("cublasSetStream_v2", b->set_stream))
    missing = "cublasSetStream_v2";
  else if (!sym("cublasSgemmStridedBatched", b->sgemm_strided_batched))
    missing = "cublasSgemmStridedBatched";
  sym("cublasGetStatusString", b->status_string);
  if (missing) {
    delete b;
    return make_status(HP_VERSION, "cuda: %s lacks %s; cuBLAS too old", used.c_str(), missing);
  }
  loaded = b;
  *out = loaded;
  return nullptr;
}

namespace {

bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

hp_status* blas_fail(const Blas& b, const char* call, cublasStatus_t st) {
  const char* text = b.status_string ? b.status_string(st) : "cublas error";
  return make_status(HP_INTERNAL, "cuda: %s failed (%d: %s)", call, int(st), text);
}

}  // namespace

hp_status* gemm(hp_ctx* ctx, hp_stream* s, const hp_gemm_desc* in) {
  if (!ctx || !s || !in) return make_status(HP_INVALID, "cuda: gemm: null argument");
  hp_gemm_desc d = hp_common::copy_in(in);
  if (hp_status* st = hp_common::check_gemm(kCuda, d)) return st;
  if (!fits_int(d.m) || !fits_int(d.n) || !fits_int(d.k) || !fits_int(d.lda) || !fits_int(d.ldb) ||
      !fits_int(d.ldc) || !fits_int(d.batch))
    return make_status(HP_UNSUPPORTED, "cuda: gemm: sizes beyond 32 bits are not implemented");
  cudaError_t cerr = cudaSetDevice(s->dev);
  if (cerr != cudaSuccess)
    return make_status(HP_DEVICE_LOST, "cuda: %s", cuda_error_text("cudaSetDevice", cerr).c_str());
  const Blas& b = *ctx->blas;
  std::lock_guard<std::mutex> lock(ctx->mu);
  cublasHandle_t& h = ctx->handles[std::size_t(s->dev)];
  if (!h) {
    if (cublasStatus_t st = b.create(&h); st != CUBLAS_STATUS_SUCCESS)
      return blas_fail(b, "cublasCreate", st);
  }
  if (cublasStatus_t st = b.set_stream(h, s->stream); st != CUBLAS_STATUS_SUCCESS)
    return blas_fail(b, "cublasSetStream", st);
  const float alpha = float(d.alpha), beta = float(d.beta);
  cublasStatus_t st = b.sgemm_strided_batched(
      h, d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(d.n),
      int(d.m), int(d.k), &alpha, static_cast<const float*>(d.b), int(d.ldb), d.stride_b,
      static_cast<const float*>(d.a), int(d.lda), d.stride_a, &beta, static_cast<float*>(d.c),
      int(d.ldc), d.stride_c, int(d.batch));
  return st == CUBLAS_STATUS_SUCCESS ? nullptr : blas_fail(b, "cublasSgemmStridedBatched", st);
}

}  // namespace hp_cuda
