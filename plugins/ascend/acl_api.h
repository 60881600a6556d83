// The subset of CANN's AscendCL (ACL runtime) and ACLNN (operator) C API that the ascend backend
// uses, declared here because hp builds without the CANN headers. Names, parameter order and enum
// values follow the CANN documentation ("AscendCL API reference": acl/acl_rt.h, acl/acl_base.h,
// aclnn/acl_meta.h, aclnnop/aclnn_*.h; CANN 7.x/8.x) and their use in ggml's CANN backend
// (ggml/src/ggml-cann/{ggml-cann.cpp,aclnn_ops.cpp}). The plugin never links these symbols: it
// takes `decltype(&aclInit)` etc. as function-pointer types and resolves them with dlsym at open.
// The fake runtime in tests/fakes/ascend defines the same prototypes, so the compiler checks that
// both agree.
//
// Libraries (CANN layout, $ASCEND_TOOLKIT_HOME/lib64):
//   libascendcl.so  aclInit, aclrt* (devices, memory, streams, events, copies), aclGetRecentErrMsg
//   libnnopbase.so  aclCreateTensor / aclDestroyTensor, aclCreateScalar / aclDestroyScalar
//   libopapi.so     aclnn<Op>GetWorkspaceSize + aclnn<Op> (two-phase: size the workspace and build
//   an
//                   executor, then launch the executor on a stream with the workspace)
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

typedef int aclError;         // ACL_SUCCESS = 0
typedef int32_t aclnnStatus;  // 0 = success
typedef void* aclrtStream;
typedef void* aclrtEvent;
typedef struct aclTensor aclTensor;
typedef struct aclScalar aclScalar;
typedef struct aclOpExecutor aclOpExecutor;

enum { ACL_SUCCESS = 0, ACL_ERROR_INVALID_PARAM = 100000, ACL_ERROR_REPEAT_INITIALIZE = 100002 };

typedef enum aclrtMemMallocPolicy {
  ACL_MEM_MALLOC_HUGE_FIRST = 0,
  ACL_MEM_MALLOC_HUGE_ONLY = 1,
  ACL_MEM_MALLOC_NORMAL_ONLY = 2
} aclrtMemMallocPolicy;

typedef enum aclrtMemcpyKind {
  ACL_MEMCPY_HOST_TO_HOST = 0,
  ACL_MEMCPY_HOST_TO_DEVICE = 1,
  ACL_MEMCPY_DEVICE_TO_HOST = 2,
  ACL_MEMCPY_DEVICE_TO_DEVICE = 3
} aclrtMemcpyKind;

typedef enum aclrtMemAttr { ACL_DDR_MEM = 0, ACL_HBM_MEM = 1 } aclrtMemAttr;

typedef enum aclrtEventRecordedStatus {
  ACL_EVENT_RECORDED_STATUS_NOT_READY = 0,
  ACL_EVENT_RECORDED_STATUS_COMPLETE = 1
} aclrtEventRecordedStatus;

typedef enum aclDataType {
  ACL_FLOAT = 0,
  ACL_FLOAT16 = 1,
  ACL_INT8 = 2,
  ACL_INT32 = 3,
  ACL_BF16 = 27
} aclDataType;
typedef enum aclFormat { ACL_FORMAT_ND = 2 } aclFormat;

// ---- libascendcl.so ----
aclError aclInit(const char* configPath);
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtGetDeviceCount(uint32_t* count);
aclError aclrtSynchronizeDevice(void);
aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free, size_t* total);
const char* aclrtGetSocName(void);
const char* aclGetRecentErrMsg(void);
aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void* devPtr);
aclError aclrtMallocHost(void** hostPtr, size_t size);
aclError aclrtFreeHost(void* hostPtr);
aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count,
                     aclrtMemcpyKind kind);
aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src, size_t count,
                          aclrtMemcpyKind kind, aclrtStream stream);
aclError aclrtCreateStream(aclrtStream* stream);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtSynchronizeStream(aclrtStream stream);
aclError aclrtCreateEvent(aclrtEvent* event);
aclError aclrtDestroyEvent(aclrtEvent event);
aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);
aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);
aclError aclrtSynchronizeEvent(aclrtEvent event);
aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus* status);

// ---- libnnopbase.so ----
aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum, aclDataType dataType,
                           const int64_t* stride, int64_t offset, aclFormat format,
                           const int64_t* storageDims, uint64_t storageDimsNum, void* tensorData);
aclnnStatus aclDestroyTensor(const aclTensor* tensor);
aclScalar* aclCreateScalar(void* value, aclDataType dataType);
aclnnStatus aclDestroyScalar(const aclScalar* scalar);

// ---- libopapi.so ----
// cubeMathType: 0 KEEP_DTYPE, 1 ALLOW_FP32_DOWN_PRECISION, 2 USE_FP16, 3 USE_HF32.
aclnnStatus aclnnMatmulGetWorkspaceSize(const aclTensor* self, const aclTensor* mat2,
                                        aclTensor* out, int8_t cubeMathType,
                                        uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnMatmul(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                        aclrtStream stream);
// out = beta * self + alpha * (batch1 @ batch2), all 3-D.
aclnnStatus aclnnBaddbmmGetWorkspaceSize(const aclTensor* self, const aclTensor* batch1,
                                         const aclTensor* batch2, const aclScalar* beta,
                                         const aclScalar* alpha, aclTensor* out,
                                         int8_t cubeMathType, uint64_t* workspaceSize,
                                         aclOpExecutor** executor);
aclnnStatus aclnnBaddbmm(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                         aclrtStream stream);

// Binary ops with broadcasting; Add/Sub compute self (+/-) alpha * other.
#define HP_ACLNN_BINARY_ALPHA(X) X(Add) X(Sub)
#define HP_ACLNN_BINARY(X) X(Mul) X(Div) X(Maximum) X(Minimum)
#define HP_ACLNN_UNARY(X) X(Relu) X(Gelu) X(Silu) X(Sigmoid) X(Tanh) X(Exp) X(Neg) X(Sqrt)

#define HP_ACLNN_DECLARE_EXEC(Op)                                                         \
  aclnnStatus aclnn##Op(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, \
                        aclrtStream stream);
#define HP_ACLNN_DECLARE_BINARY_ALPHA(Op)                                                     \
  aclnnStatus aclnn##Op##GetWorkspaceSize(const aclTensor* self, const aclTensor* other,      \
                                          const aclScalar* alpha, aclTensor* out,             \
                                          uint64_t* workspaceSize, aclOpExecutor** executor); \
  HP_ACLNN_DECLARE_EXEC(Op)
#define HP_ACLNN_DECLARE_BINARY(Op)                                                      \
  aclnnStatus aclnn##Op##GetWorkspaceSize(const aclTensor* self, const aclTensor* other, \
                                          aclTensor* out, uint64_t* workspaceSize,       \
                                          aclOpExecutor** executor);                     \
  HP_ACLNN_DECLARE_EXEC(Op)
#define HP_ACLNN_DECLARE_UNARY(Op)                                                            \
  aclnnStatus aclnn##Op##GetWorkspaceSize(const aclTensor* self, aclTensor* out,              \
                                          uint64_t* workspaceSize, aclOpExecutor** executor); \
  HP_ACLNN_DECLARE_EXEC(Op)

HP_ACLNN_BINARY_ALPHA(HP_ACLNN_DECLARE_BINARY_ALPHA)
HP_ACLNN_BINARY(HP_ACLNN_DECLARE_BINARY)
HP_ACLNN_UNARY(HP_ACLNN_DECLARE_UNARY)

// out = self * other (a scalar).
aclnnStatus aclnnMulsGetWorkspaceSize(const aclTensor* self, const aclScalar* other, aclTensor* out,
                                      uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnMuls(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                      aclrtStream stream);

}  // extern "C"
