// Private declarations of the ascend backend.
#pragma once

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "acl_api.h"
#include "plugin_common.h"

constexpr const char* kAscend = "ascend";

// Runtime entry points resolved with dlsym. Required ones missing make open fail with HP_VERSION;
// optional ones missing only narrow what the backend supports.
// clang-format cannot lay out X-macro lists stably.
// clang-format off
#define HP_ACL_REQUIRED(X)                                                                   \
  X(aclInit) X(aclrtSetDevice) X(aclrtGetDeviceCount) X(aclrtGetMemInfo) X(aclrtGetSocName)  \
  X(aclrtMalloc) X(aclrtFree) X(aclrtMallocHost) X(aclrtFreeHost) X(aclrtMemcpy)             \
  X(aclrtMemcpyAsync) X(aclrtCreateStream) X(aclrtDestroyStream) X(aclrtSynchronizeStream)   \
  X(aclrtCreateEvent) X(aclrtDestroyEvent) X(aclrtRecordEvent) X(aclrtStreamWaitEvent)       \
  X(aclrtSynchronizeEvent)
// clang-format on
#define HP_ACL_OPTIONAL(X) \
  X(aclGetRecentErrMsg) X(aclrtQueryEventStatus) X(aclrtResetDevice) X(aclrtSynchronizeDevice)
#define HP_NNOPBASE_REQUIRED(X) \
  X(aclCreateTensor) X(aclDestroyTensor) X(aclCreateScalar) X(aclDestroyScalar)
#define HP_OPAPI_REQUIRED(X) X(aclnnMatmulGetWorkspaceSize) X(aclnnMatmul)

namespace hp_ascend {

/// Every resolved function pointer, named like the CANN function.
struct AclApi {
#define HP_ACL_MEMBER(fn) decltype(&::fn) fn = nullptr;
  HP_ACL_REQUIRED(HP_ACL_MEMBER)
  HP_ACL_OPTIONAL(HP_ACL_MEMBER)
  HP_NNOPBASE_REQUIRED(HP_ACL_MEMBER)
  HP_OPAPI_REQUIRED(HP_ACL_MEMBER)
  HP_ACL_MEMBER(aclnnBaddbmmGetWorkspaceSize)
  HP_ACL_MEMBER(aclnnBaddbmm)
#define HP_ACL_OP_MEMBERS(Op) HP_ACL_MEMBER(aclnn##Op##GetWorkspaceSize) HP_ACL_MEMBER(aclnn##Op)
  HP_ACLNN_BINARY_ALPHA(HP_ACL_OP_MEMBERS)
  HP_ACLNN_BINARY(HP_ACL_OP_MEMBERS)
  HP_ACLNN_UNARY(HP_ACL_OP_MEMBERS)
  HP_ACL_OP_MEMBERS(Muls)
#undef HP_ACL_OP_MEMBERS
#undef HP_ACL_MEMBER
  std::vector<std::string> libraries;  ///< paths/sonames actually loaded, for messages
};

/// Loads libascendcl/libnnopbase/libopapi (env overrides first) and resolves the API, once per
/// process; a failure is not cached, so a later open retries (tests change the environment).
hp_status* load_api(const AclApi** out);

/// True when libascendcl.so can be dlopen'ed from the usual places (for hp_backend_probe).
bool runtime_present();

/// "aclrtMalloc failed (error 100000: <recent error message>)" for messages.
std::string acl_error_text(const AclApi& api, const char* call, int err);

/// Per-device facts from the SoC table (ascend_soc.cpp), by aclrtGetSocName.
void fill_soc_figures(const std::string& soc, hp_device_info& d);

}  // namespace hp_ascend

namespace hp_ascend {
/// Device-memory accounting of one device (ABI 1.3 mem_stats): what alloc(HP_MEM_DEVICE) handed
/// out. aclrtFree takes no size, so live allocations are remembered by address.
struct DeviceMemory {
  std::unordered_map<void*, uint64_t> live;
  uint64_t in_use = 0, peak = 0, allocs = 0, refused = 0;
};
}  // namespace hp_ascend

struct hp_ctx {
  const hp_ascend::AclApi* api = nullptr;
  int32_t device_count = 0;
  std::mutex mem_mu;
  std::vector<hp_ascend::DeviceMemory> mem;  ///< per device
};

/// An ACL stream plus the aclnn workspace used by kernels queued on it (grow-only; growing waits
/// for the stream so the old buffer is no longer in use).
struct hp_stream {
  int32_t dev = 0;
  aclrtStream stream = nullptr;
  void* workspace = nullptr;
  uint64_t workspace_bytes = 0;
};

struct hp_event {
  int32_t dev = 0;
  aclrtEvent event = nullptr;
};

namespace hp_ascend {

/// Makes `dev` current on the calling thread (ACL's device context is per thread).
hp_status* use_device(const hp_ctx* ctx, int32_t dev);
hp_status* gemm(hp_ctx* ctx, hp_stream* s, const hp_gemm_desc* desc);
hp_status* elementwise(hp_ctx* ctx, hp_stream* s, const hp_elementwise_desc* desc);
int32_t supports_op(const hp_ctx* ctx, int32_t op);
/// ABI 1.2 (ascend_ops.cpp): ONNX MatMul, Add/Sub/Mul/Div and unary activations on the kernels
/// above.
int32_t supports_onnx_op(hp_ctx* ctx, int32_t dev, const char* op_type, const char* domain,
                         int64_t opset, const int32_t* dtypes, int64_t n);
hp_status* run_onnx_op(hp_ctx* ctx, hp_stream* s, const hp_op_desc* desc);

}  // namespace hp_ascend
