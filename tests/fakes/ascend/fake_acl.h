// Shared internals of the fake CANN runtime (tests/fakes/ascend). Three shared libraries stand in
// for CANN's libascendcl.so, libnnopbase.so and libopapi.so with the same sonames, so the ascend
// plugin loads them exactly as it would load CANN (HP_ASCEND_LIB=<dir>/libascendcl.so). The API
// prototypes come from the plugin's own declarations (plugins/ascend/acl_api.h): defining them here
// makes the compiler check that the fake and the plugin agree on every signature.
//
// The fake models what matters for testing the plugin, on host memory:
//  - "device" memory is host memory, but the runtime tracks which ranges are device allocations and
//    rejects copies whose direction does not match the pointers, and kernels whose tensors are not
//    on the device (the mistakes a plugin makes that a real NPU would punish);
//  - each stream is a worker thread executing its queue in order, asynchronously to the caller,
//  with an
//    optional per-operation delay (HP_FAKE_ACL_DELAY_US) so that missing synchronisation shows up
//    as wrong results; events record completion generations, as CUDA/ACL events do;
//  - aclnn kernels run on the host with the tensor descriptors honoured (view dims, strides,
//  offset,
//    broadcasting), after a two-phase GetWorkspaceSize/launch with a real workspace requirement.
// Knobs: HP_FAKE_ACL_DEVICES (default 1), HP_FAKE_ACL_SOC (default Ascend910B3),
// HP_FAKE_ACL_FAIL_COUNT=1 (aclrtGetDeviceCount fails as without a driver), HP_FAKE_ACL_DELAY_US.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "acl_api.h"

struct aclTensor {
  std::vector<int64_t> dims, strides;
  int64_t offset = 0;
  aclDataType dtype = ACL_FLOAT;
  void* data = nullptr;
  int64_t storage_elems = 0;
};

struct aclScalar {
  double value = 0;
  aclDataType dtype = ACL_FLOAT;
};

struct aclOpExecutor {
  std::function<void()> run;
  uint64_t workspace = 0;
};

namespace fake_acl {

#define FAKE_ACL_EXPORT __attribute__((visibility("default")))

/// Queues `fn` on a stream's worker (libascendcl); false for an unknown stream.
FAKE_ACL_EXPORT bool enqueue(aclrtStream stream, std::function<void()> fn);
/// True when [p, p+bytes) lies inside one device allocation (libascendcl).
FAKE_ACL_EXPORT bool is_device_range(const void* p, uint64_t bytes);
/// Sets what aclGetRecentErrMsg returns (libascendcl).
FAKE_ACL_EXPORT void set_error(const std::string& message);

}  // namespace fake_acl
