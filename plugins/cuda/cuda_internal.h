// Private declarations of the cuda backend.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <vector>

#include "plugin_common.h"

constexpr const char* kCuda = "cuda";

namespace hp_cuda {

/// cuBLAS entry points, resolved with dlsym from libcublas.so.* at open (no DT_NEEDED on cuBLAS).
struct Blas {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;  // optional
  std::string library;
};

/// Loads cuBLAS once per process ($HP_CUBLAS_LIB, then libcublas.so.13/.12/.so).
hp_status* load_blas(const Blas** out);

/// "cudaMalloc: out of memory" style text.
std::string cuda_error_text(const char* call, cudaError_t err);

/// Fills peak figures from the datasheet table or, failing that, an estimate from SM count and
/// clocks.
void fill_figures(int dev, const cudaDeviceProp& prop, hp_device_info& d);

/// Queues a cuBLAS gemm on the stream (cuda_blas.cpp).
hp_status* gemm(hp_ctx* ctx, hp_stream* s, const hp_gemm_desc* desc);

/// Launches an elementwise kernel on `stream` (cuda_kernels.cu).
cudaError_t launch_elementwise(const hp_elementwise_desc& d, cudaStream_t stream);

}  // namespace hp_cuda

struct hp_ctx {
  const hp_cuda::Blas* blas = nullptr;
  int32_t device_count = 0;
  std::mutex mu;                        // guards handles and their stream binding
  std::vector<cublasHandle_t> handles;  // one per device, created on first gemm
};

struct hp_stream {
  int32_t dev = 0;
  cudaStream_t stream = nullptr;
};

struct hp_event {
  int32_t dev = 0;
  cudaEvent_t event = nullptr;
};
