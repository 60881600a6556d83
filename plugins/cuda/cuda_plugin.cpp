// The cuda backend: hp's plugin ABI on cudart (linked statically) and cuBLAS (dlopen'ed), with its
// own elementwise kernels (cuda_kernels.cu). It has no DT_NEEDED entry on NVIDIA libraries: the
// static cudart dlopens the driver (libcuda.so.1) itself, so on a machine without a driver or GPU
// the plugin still loads and open() reports HP_UNAVAILABLE with the reason, which `hp devices`
// shows.
//
// open() checks, in order: the driver library (its dlerror text if missing; HP_CUDA_DRIVER_LIB
// overrides the soname, which tests use to simulate a driverless machine), cudaGetDeviceCount (the
// cudart error string: no device, driver too old, ...), then cuBLAS (the sonames tried). cudart
// keeps the current device per thread, so every call that names a device or stream sets it first.
#include <dlfcn.h>

#include <cstdlib>

#include "cuda_internal.h"

using hp_common::make_status;
using hp_cuda::cuda_error_text;

namespace {

hp_status* fail(const char* call, cudaError_t err, hp_code code = HP_INTERNAL) {
  return make_status(code, "cuda: %s", cuda_error_text(call, err).c_str());
}

hp_status* set_device(const hp_ctx* ctx, int32_t dev) {
  if (dev < 0 || dev >= ctx->device_count)
    return make_status(HP_INVALID, "cuda: no device %d", dev);
  cudaError_t err = cudaSetDevice(dev);
  return err == cudaSuccess ? nullptr : fail("cudaSetDevice", err, HP_DEVICE_LOST);
}

/// The driver's library ($HP_CUDA_DRIVER_LIB or libcuda.so.1), opened only to tell "no driver" from
/// other failures with its dlerror text; it stays loaded and the static cudart then uses it.
hp_status* check_driver() {
  const char* env = std::getenv("HP_CUDA_DRIVER_LIB");
  const char* lib = env && *env ? env : "libcuda.so.1";
  dlerror();
  if (dlopen(lib, RTLD_NOW | RTLD_LOCAL)) return nullptr;
  const char* err = dlerror();
  return make_status(HP_UNAVAILABLE,
                     "cuda: NVIDIA driver not found (%s: %s); install the NVIDIA driver, or this "
                     "machine has no NVIDIA GPU",
                     lib, err ? err : "dlopen failed");
}

hp_status* cu_open(const char* const*, size_t, hp_ctx** out) {
  HP_PLUGIN_GUARD(kCuda, {
    if (hp_status* st = check_driver()) return st;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess)
      return make_status(HP_UNAVAILABLE, "cuda: no usable device (%s)",
                         cuda_error_text("cudaGetDeviceCount", err).c_str());
    const hp_cuda::Blas* blas = nullptr;
    if (hp_status* st = hp_cuda::load_blas(&blas)) return st;
    auto* ctx = new hp_ctx();
    ctx->blas = blas;
    ctx->device_count = count;
    ctx->handles.assign(std::size_t(count), nullptr);
    *out = ctx;
    return nullptr;
  })
}

void cu_close(hp_ctx* ctx) {
  if (!ctx) return;
  for (std::size_t d = 0; d < ctx->handles.size(); ++d)
    if (ctx->handles[d] && cudaSetDevice(int(d)) == cudaSuccess)
      ctx->blas->destroy(ctx->handles[d]);
  delete ctx;
}

hp_status* cu_device_count(hp_ctx* ctx, int32_t* out) {
  *out = ctx->device_count;
  return nullptr;
}

hp_status* cu_device_info(hp_ctx* ctx, int32_t dev, hp_device_info* out) {
  if (hp_status* st = set_device(ctx, dev)) return st;
  cudaDeviceProp prop;
  cudaError_t err = cudaGetDeviceProperties(&prop, dev);
  if (err != cudaSuccess) return fail("cudaGetDeviceProperties", err);
  hp_device_info d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  hp_common::set_str(d.name, sizeof d.name, prop.name);
  hp_common::set_str(d.arch, sizeof d.arch,
                     "sm_" + std::to_string(prop.major) + std::to_string(prop.minor));
  char bus[32];
  std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.0", prop.pciDomainID, prop.pciBusID,
                prop.pciDeviceID);
  hp_common::set_str(d.bus_id, sizeof d.bus_id, bus);
  d.kind = HP_DEVICE_GPU;
  d.numa_node = -1;
  size_t free_b = 0, total_b = 0;
  if ((err = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) return fail("cudaMemGetInfo", err);
  d.mem_total = total_b;
  d.mem_free = free_b;
  d.compute_units = prop.multiProcessorCount;
  d.caps = HP_CAP_ASYNC | HP_CAP_EVENTS | HP_CAP_PINNED_HOST | HP_CAP_P2P;
  hp_cuda::fill_figures(dev, prop, d);
  hp_common::copy_out(out, d);
  return nullptr;
}

int32_t cu_supports(hp_ctx* ctx, int32_t dev, int32_t op, int32_t dtype) {
  if (dev < 0 || dev >= ctx->device_count || dtype != HP_F32) return 0;
  return op == HP_OP_GEMM || hp_common::is_binary(op) || hp_common::is_unary(op);
}

hp_status* cu_alloc(hp_ctx* ctx, int32_t dev, size_t bytes, int32_t kind, void** out) {
  if (hp_status* st = set_device(ctx, dev)) return st;
  cudaError_t err = kind == HP_MEM_PINNED_HOST ? cudaMallocHost(out, bytes ? bytes : 1)
                                               : cudaMalloc(out, bytes ? bytes : 1);
  return err == cudaSuccess ? nullptr
                            : fail(kind == HP_MEM_PINNED_HOST ? "cudaMallocHost" : "cudaMalloc",
                                   err, HP_NO_MEMORY);
}

hp_status* cu_free(hp_ctx* ctx, int32_t dev, void* p, int32_t kind) {
  if (!p) return nullptr;
  if (hp_status* st = set_device(ctx, dev)) return st;
  cudaError_t err = kind == HP_MEM_PINNED_HOST ? cudaFreeHost(p) : cudaFree(p);
  return err == cudaSuccess ? nullptr : fail("cudaFree", err);
}

hp_status* cu_stream_create(hp_ctx* ctx, int32_t dev, hp_stream** out) {
  if (hp_status* st = set_device(ctx, dev)) return st;
  auto* s = new hp_stream();
  s->dev = dev;
  cudaError_t err = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    delete s;
    return fail("cudaStreamCreate", err);
  }
  *out = s;
  return nullptr;
}

hp_status* cu_stream_sync(hp_ctx* ctx, hp_stream* s) {
  if (hp_status* st = set_device(ctx, s->dev)) return st;
  cudaError_t err = cudaStreamSynchronize(s->stream);
  return err == cudaSuccess ? nullptr : fail("cudaStreamSynchronize", err);
}

hp_status* cu_stream_destroy(hp_ctx* ctx, hp_stream* s) {
  if (!s) return nullptr;
  hp_status* st = cu_stream_sync(ctx, s);
  cudaStreamDestroy(s->stream);
  delete s;
  return st;
}

hp_status* cu_event_create(hp_ctx* ctx, int32_t dev, hp_event** out) {
  if (hp_status* st = set_device(ctx, dev)) return st;
  auto* e = new hp_event();
  e->dev = dev;
  cudaError_t err = cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    delete e;
    return fail("cudaEventCreate", err);
  }
  *out = e;
  return nullptr;
}

hp_status* cu_event_record(hp_ctx* ctx, hp_event* e, hp_stream* s) {
  if (hp_status* st = set_device(ctx, s->dev)) return st;
  cudaError_t err = cudaEventRecord(e->event, s->stream);
  return err == cudaSuccess ? nullptr : fail("cudaEventRecord", err);
}

hp_status* cu_stream_wait_event(hp_ctx* ctx, hp_stream* s, hp_event* e) {
  if (hp_status* st = set_device(ctx, s->dev)) return st;
  cudaError_t err = cudaStreamWaitEvent(s->stream, e->event, 0);
  return err == cudaSuccess ? nullptr : fail("cudaStreamWaitEvent", err);
}

hp_status* cu_event_sync(hp_ctx*, hp_event* e) {
  cudaError_t err = cudaEventSynchronize(e->event);
  return err == cudaSuccess ? nullptr : fail("cudaEventSynchronize", err);
}

hp_status* cu_event_query(hp_ctx*, hp_event* e, int32_t* done) {
  cudaError_t err = cudaEventQuery(e->event);
  if (err == cudaErrorNotReady) {
    *done = 0;
    return nullptr;
  }
  *done = 1;
  return err == cudaSuccess ? nullptr : fail("cudaEventQuery", err);
}

hp_status* cu_event_destroy(hp_ctx*, hp_event* e) {
  if (!e) return nullptr;
  cudaError_t err = cudaEventDestroy(e->event);
  delete e;
  return err == cudaSuccess ? nullptr : fail("cudaEventDestroy", err);
}

hp_status* cu_copy_async(hp_ctx* ctx, hp_stream* s, void* dst, const void* src, size_t bytes,
                         int32_t dir) {
  static const cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                         cudaMemcpyDeviceToDevice, cudaMemcpyHostToHost};
  if (dir < HP_H2D || dir > HP_H2H)
    return make_status(HP_INVALID, "cuda: copy_async: bad direction %d", dir);
  if (bytes == 0) return nullptr;
  if (hp_status* st = set_device(ctx, s->dev)) return st;
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kinds[dir], s->stream);
  return err == cudaSuccess ? nullptr : fail("cudaMemcpyAsync", err);
}

hp_status* cu_elementwise(hp_ctx* ctx, hp_stream* s, const hp_elementwise_desc* in) {
  hp_elementwise_desc d = hp_common::copy_in(in);
  if (hp_status* st = hp_common::check_elementwise(kCuda, d)) return st;
  if (hp_status* st = set_device(ctx, s->dev)) return st;
  cudaError_t err = hp_cuda::launch_elementwise(d, s->stream);
  return err == cudaSuccess ? nullptr : fail("elementwise kernel launch", err);
}

hp_status* cu_mem_info(hp_ctx* ctx, int32_t dev, uint64_t* free_bytes, uint64_t* total_bytes) {
  if (hp_status* st = set_device(ctx, dev)) return st;
  size_t f = 0, t = 0;
  cudaError_t err = cudaMemGetInfo(&f, &t);
  if (err != cudaSuccess) return fail("cudaMemGetInfo", err);
  *free_bytes = f;
  *total_bytes = t;
  return nullptr;
}

const hp_backend_v1 kTable = {
    sizeof(hp_backend_v1),
    HP_ABI_MAJOR,
    HP_ABI_MINOR,
    "cuda",
    "0.1.0",
    hp_common::status_code,
    hp_common::status_message,
    hp_common::status_free,
    cu_open,
    cu_close,
    cu_device_count,
    cu_device_info,
    cu_supports,
    cu_alloc,
    cu_free,
    cu_stream_create,
    cu_stream_sync,
    cu_stream_destroy,
    cu_event_create,
    cu_event_record,
    cu_stream_wait_event,
    cu_event_sync,
    cu_event_destroy,
    cu_copy_async,
    hp_cuda::gemm,
    cu_elementwise,
    nullptr,
    nullptr,
    nullptr,
    cu_event_query,
    cu_mem_info,
    nullptr,
    nullptr,  // no generic op execution yet (1.2): the executor falls back to cpu
    nullptr,  // no device-memory accounting yet (1.3 mem_stats)
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const hp_backend_v1* hp_backend_entry_v1(
    uint16_t) {
  return &kTable;
}

/// Cheap: is the driver library present? (No CUDA context is created.)
extern "C" __attribute__((visibility("default"))) int32_t hp_backend_probe(void) {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  return h ? 20 : 0;
}
