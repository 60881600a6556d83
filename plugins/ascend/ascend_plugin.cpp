// The ascend backend: hp's plugin ABI on CANN's AscendCL runtime and ACLNN operators, all resolved
// at open() through dlopen (acl_loader.cpp), so the plugin loads anywhere and explains itself when
// CANN is absent. This file holds the table and the runtime side (devices, memory and its
// accounting, streams, events, copies); kernels are in ascend_kernels.cpp.
//
// ACL keeps the current device per thread (aclrtSetDevice), while hp calls name the device
// explicitly (or through a stream or event), so every entry point first makes the right device
// current; a thread-local remembers it to avoid redundant calls.
#include "ascend_internal.h"

#include <algorithm>
#include <cstddef>

using hp_ascend::acl_error_text;
using hp_common::make_status;

namespace hp_ascend {

hp_status* use_device(const hp_ctx* ctx, int32_t dev) {
  static thread_local int32_t current = -1;
  if (dev < 0 || dev >= ctx->device_count)
    return make_status(HP_INVALID, "ascend: no device %d", dev);
  if (current == dev) return nullptr;
  aclError err = ctx->api->aclrtSetDevice(dev);
  if (err != ACL_SUCCESS)
    return make_status(HP_DEVICE_LOST, "ascend: %s",
                       acl_error_text(*ctx->api, "aclrtSetDevice", err).c_str());
  current = dev;
  return nullptr;
}

}  // namespace hp_ascend

namespace {

using hp_ascend::DeviceMemory;
using hp_ascend::use_device;

hp_status* acl_fail(const hp_ctx* ctx, const char* call, aclError err, hp_code code = HP_INTERNAL) {
  return make_status(code, "ascend: %s", acl_error_text(*ctx->api, call, err).c_str());
}

hp_status* asc_open(const char* const*, size_t, hp_ctx** out) {
  HP_PLUGIN_GUARD(kAscend, {
    const hp_ascend::AclApi* api = nullptr;
    if (hp_status* st = hp_ascend::load_api(&api)) return st;
    uint32_t count = 0;
    aclError err = api->aclrtGetDeviceCount(&count);
    if (err != ACL_SUCCESS)
      return make_status(HP_UNAVAILABLE, "ascend: no usable device (%s)",
                         acl_error_text(*api, "aclrtGetDeviceCount", err).c_str());
    auto* ctx = new hp_ctx();
    ctx->api = api;
    ctx->device_count = int32_t(count);
    ctx->mem.resize(count);
    *out = ctx;
    return nullptr;
  })
}

void asc_close(hp_ctx* ctx) {
  if (!ctx) return;
  if (ctx->api->aclrtSynchronizeDevice)
    for (int32_t d = 0; d < ctx->device_count; ++d)
      if (use_device(ctx, d) == nullptr) ctx->api->aclrtSynchronizeDevice();
  delete ctx;
}

hp_status* asc_device_count(hp_ctx* ctx, int32_t* out) {
  *out = ctx->device_count;
  return nullptr;
}

hp_status* asc_device_info(hp_ctx* ctx, int32_t dev, hp_device_info* out) {
  if (hp_status* st = use_device(ctx, dev)) return st;
  hp_device_info d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  const char* soc = ctx->api->aclrtGetSocName();
  std::string soc_name = soc ? soc : "ascend";
  hp_common::set_str(d.name, sizeof d.name, soc_name);
  hp_common::set_str(d.arch, sizeof d.arch, soc_name);
  d.kind = HP_DEVICE_NPU;
  d.numa_node = -1;
  size_t free_b = 0, total_b = 0;
  aclError err = ctx->api->aclrtGetMemInfo(ACL_HBM_MEM, &free_b, &total_b);
  if (err != ACL_SUCCESS) return acl_fail(ctx, "aclrtGetMemInfo", err);
  d.mem_total = total_b;
  d.mem_free = free_b;
  d.caps = HP_CAP_ASYNC | HP_CAP_EVENTS | HP_CAP_PINNED_HOST | HP_CAP_P2P;
  hp_ascend::fill_soc_figures(soc_name, d);
  hp_common::copy_out(out, d);
  return nullptr;
}

int32_t asc_supports(hp_ctx* ctx, int32_t dev, int32_t op, int32_t dtype) {
  if (dev < 0 || dev >= ctx->device_count || dtype != HP_F32) return 0;
  return hp_ascend::supports_op(ctx, op);
}

hp_status* asc_alloc(hp_ctx* ctx, int32_t dev, size_t bytes, int32_t kind, void** out) {
  if (hp_status* st = use_device(ctx, dev)) return st;
  if (kind == HP_MEM_PINNED_HOST) {
    aclError err = ctx->api->aclrtMallocHost(out, bytes ? bytes : 1);
    return err == ACL_SUCCESS ? nullptr : acl_fail(ctx, "aclrtMallocHost", err, HP_NO_MEMORY);
  }
  const uint64_t size = bytes ? bytes : 1;
  aclError err = ctx->api->aclrtMalloc(out, size, ACL_MEM_MALLOC_HUGE_FIRST);
  std::lock_guard<std::mutex> lock(ctx->mem_mu);
  DeviceMemory& m = ctx->mem[size_t(dev)];
  if (err != ACL_SUCCESS) {
    ++m.refused;  // the device's own limit: the runtime is out of memory
    return acl_fail(ctx, "aclrtMalloc", err, HP_NO_MEMORY);
  }
  m.live[*out] = size;
  m.in_use += size;
  m.peak = std::max(m.peak, m.in_use);
  ++m.allocs;
  return nullptr;
}

hp_status* asc_free(hp_ctx* ctx, int32_t dev, void* p, int32_t kind) {
  if (!p) return nullptr;
  if (hp_status* st = use_device(ctx, dev)) return st;
  aclError err = kind == HP_MEM_PINNED_HOST ? ctx->api->aclrtFreeHost(p) : ctx->api->aclrtFree(p);
  if (err != ACL_SUCCESS) return acl_fail(ctx, "aclrtFree", err);
  if (kind != HP_MEM_PINNED_HOST) {
    std::lock_guard<std::mutex> lock(ctx->mem_mu);
    DeviceMemory& m = ctx->mem[size_t(dev)];
    if (auto it = m.live.find(p); it != m.live.end()) {
      m.in_use -= it->second;
      m.live.erase(it);
    }
  }
  return nullptr;
}

hp_status* asc_mem_stats(hp_ctx* ctx, int32_t dev, int32_t reset_peak, hp_mem_stats* out) {
  if (dev < 0 || dev >= ctx->device_count)
    return make_status(HP_INVALID, "ascend: no device %d", dev);
  if (!out || out->struct_size < offsetof(hp_mem_stats, in_use) + sizeof(uint64_t))
    return make_status(HP_INVALID, "ascend: mem_stats: null or too small output");
  std::lock_guard<std::mutex> lock(ctx->mem_mu);
  DeviceMemory& m = ctx->mem[size_t(dev)];
  // No budget of hp's own: the device's memory is the limit (0 = none enforced by the plugin).
  const hp_mem_stats s = {sizeof(hp_mem_stats), m.in_use, m.peak, 0, m.allocs, m.refused};
  hp_common::copy_out(out, s);
  if (reset_peak) m.peak = m.in_use;
  return nullptr;
}

hp_status* asc_stream_create(hp_ctx* ctx, int32_t dev, hp_stream** out) {
  if (hp_status* st = use_device(ctx, dev)) return st;
  auto* s = new hp_stream();
  s->dev = dev;
  aclError err = ctx->api->aclrtCreateStream(&s->stream);
  if (err != ACL_SUCCESS) {
    delete s;
    return acl_fail(ctx, "aclrtCreateStream", err);
  }
  *out = s;
  return nullptr;
}

hp_status* asc_stream_sync(hp_ctx* ctx, hp_stream* s) {
  if (hp_status* st = use_device(ctx, s->dev)) return st;
  aclError err = ctx->api->aclrtSynchronizeStream(s->stream);
  return err == ACL_SUCCESS ? nullptr : acl_fail(ctx, "aclrtSynchronizeStream", err);
}

hp_status* asc_stream_destroy(hp_ctx* ctx, hp_stream* s) {
  if (!s) return nullptr;
  hp_status* st = asc_stream_sync(ctx, s);
  if (s->workspace) ctx->api->aclrtFree(s->workspace);
  ctx->api->aclrtDestroyStream(s->stream);
  delete s;
  return st;
}

hp_status* asc_event_create(hp_ctx* ctx, int32_t dev, hp_event** out) {
  if (hp_status* st = use_device(ctx, dev)) return st;
  auto* e = new hp_event();
  e->dev = dev;
  aclError err = ctx->api->aclrtCreateEvent(&e->event);
  if (err != ACL_SUCCESS) {
    delete e;
    return acl_fail(ctx, "aclrtCreateEvent", err);
  }
  *out = e;
  return nullptr;
}

hp_status* asc_event_record(hp_ctx* ctx, hp_event* e, hp_stream* s) {
  if (hp_status* st = use_device(ctx, s->dev)) return st;
  aclError err = ctx->api->aclrtRecordEvent(e->event, s->stream);
  return err == ACL_SUCCESS ? nullptr : acl_fail(ctx, "aclrtRecordEvent", err);
}

hp_status* asc_stream_wait_event(hp_ctx* ctx, hp_stream* s, hp_event* e) {
  if (hp_status* st = use_device(ctx, s->dev)) return st;
  aclError err = ctx->api->aclrtStreamWaitEvent(s->stream, e->event);
  return err == ACL_SUCCESS ? nullptr : acl_fail(ctx, "aclrtStreamWaitEvent", err);
}

hp_status* asc_event_sync(hp_ctx* ctx, hp_event* e) {
  if (hp_status* st = use_device(ctx, e->dev)) return st;
  aclError err = ctx->api->aclrtSynchronizeEvent(e->event);
  return err == ACL_SUCCESS ? nullptr : acl_fail(ctx, "aclrtSynchronizeEvent", err);
}

hp_status* asc_event_query(hp_ctx* ctx, hp_event* e, int32_t* done) {
  if (!ctx->api->aclrtQueryEventStatus)
    return make_status(HP_UNSUPPORTED, "ascend: libascendcl.so lacks aclrtQueryEventStatus");
  if (hp_status* st = use_device(ctx, e->dev)) return st;
  aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
  aclError err = ctx->api->aclrtQueryEventStatus(e->event, &status);
  if (err != ACL_SUCCESS) return acl_fail(ctx, "aclrtQueryEventStatus", err);
  *done = status == ACL_EVENT_RECORDED_STATUS_COMPLETE;
  return nullptr;
}

hp_status* asc_event_destroy(hp_ctx* ctx, hp_event* e) {
  if (!e) return nullptr;
  aclError err = ctx->api->aclrtDestroyEvent(e->event);
  delete e;
  return err == ACL_SUCCESS ? nullptr : acl_fail(ctx, "aclrtDestroyEvent", err);
}

hp_status* asc_copy_async(hp_ctx* ctx, hp_stream* s, void* dst, const void* src, size_t bytes,
                          int32_t dir) {
  static const aclrtMemcpyKind kinds[] = {ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST,
                                          ACL_MEMCPY_DEVICE_TO_DEVICE, ACL_MEMCPY_HOST_TO_HOST};
  if (dir < HP_H2D || dir > HP_H2H)
    return make_status(HP_INVALID, "ascend: copy_async: bad direction %d", dir);
  if (bytes == 0) return nullptr;
  if (hp_status* st = use_device(ctx, s->dev)) return st;
  // destMax: hp does not track the destination's capacity, so it is the copy size.
  aclError err = ctx->api->aclrtMemcpyAsync(dst, bytes, src, bytes, kinds[dir], s->stream);
  return err == ACL_SUCCESS ? nullptr : acl_fail(ctx, "aclrtMemcpyAsync", err);
}

hp_status* asc_mem_info(hp_ctx* ctx, int32_t dev, uint64_t* free_bytes, uint64_t* total_bytes) {
  if (hp_status* st = use_device(ctx, dev)) return st;
  size_t f = 0, t = 0;
  aclError err = ctx->api->aclrtGetMemInfo(ACL_HBM_MEM, &f, &t);
  if (err != ACL_SUCCESS) return acl_fail(ctx, "aclrtGetMemInfo", err);
  *free_bytes = f;
  *total_bytes = t;
  return nullptr;
}

const hp_backend_v1 kTable = {
    sizeof(hp_backend_v1),
    HP_ABI_MAJOR,
    HP_ABI_MINOR,
    "ascend",
    "0.1.0",
    hp_common::status_code,
    hp_common::status_message,
    hp_common::status_free,
    asc_open,
    asc_close,
    asc_device_count,
    asc_device_info,
    asc_supports,
    asc_alloc,
    asc_free,
    asc_stream_create,
    asc_stream_sync,
    asc_stream_destroy,
    asc_event_create,
    asc_event_record,
    asc_stream_wait_event,
    asc_event_sync,
    asc_event_destroy,
    asc_copy_async,
    hp_ascend::gemm,
    hp_ascend::elementwise,
    nullptr,
    nullptr,
    nullptr,
    asc_event_query,
    asc_mem_info,
    hp_ascend::supports_onnx_op,
    hp_ascend::run_onnx_op,
    asc_mem_stats,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const hp_backend_v1* hp_backend_entry_v1(
    uint16_t) {
  return &kTable;
}

/// Cheap: is libascendcl loadable at all? No aclInit, no device initialisation.
extern "C" __attribute__((visibility("default"))) int32_t hp_backend_probe(void) {
  return hp_ascend::runtime_present() ? 10 : 0;
}
