// The cpu backend: hp's reference implementation of the plugin ABI and the fallback for every op an
// accelerator backend does not support. It is always built and is what the conformance suite compares
// other backends against, so it favours obvious correctness: GEMM goes through oneDNN's matmul (with a
// plain loop as a safety net), elementwise ops are simple loops the compiler vectorises.
//
// Execution model: synchronous. Every queued call has completed when it returns, so streams are in
// order trivially, an event is complete as soon as it is recorded, and stream_wait_event has nothing to
// wait for. "Device" memory is ordinary host memory (HP_CAP_HOST_VISIBLE), so all four copy directions
// are memcpy.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "cpu_internal.h"
#include "cpu_ops.h"

#if defined(_OPENMP)
#include <omp.h>
#define HP_CPU_HAS_OPENMP 1
#else
#define HP_CPU_HAS_OPENMP 0
#endif

using hp_common::make_status;

namespace {

hp_status* check_dev(int32_t dev, const char* call) {
  return dev == 0 ? nullptr : make_status(HP_INVALID, "cpu: %s: no device %d (the cpu backend has one)", call, dev);
}

/// Open options: "threads=N" sets the OpenMP (and so oneDNN) thread count of the process, which keeps
/// `hp launch --threads N` from oversubscribing cores; without it OpenMP's default (the cores in the
/// affinity mask) applies.
hp_status* cpu_open(const char* const* kv, size_t n_kv, hp_ctx** out) {
  HP_PLUGIN_GUARD(kCpu, {
    if (!out) return make_status(HP_INVALID, "cpu: open: null output");
    for (size_t i = 0; kv && i < n_kv; ++i) {
      if (!kv[i] || std::strncmp(kv[i], "threads=", 8) != 0) continue;
      char* end = nullptr;
      long n = std::strtol(kv[i] + 8, &end, 10);
      if (!end || *end || n < 1 || n > 4096)
        return make_status(HP_INVALID, "cpu: open: bad option '%s' (want threads=N, N >= 1)", kv[i]);
#if HP_CPU_HAS_OPENMP
      omp_set_num_threads(static_cast<int>(n));
#endif
    }
    *out = new hp_ctx();
    return nullptr;
  })
}

void cpu_close(hp_ctx* ctx) { delete ctx; }

hp_status* cpu_device_count(hp_ctx*, int32_t* out) {
  if (!out) return make_status(HP_INVALID, "cpu: device_count: null output");
  *out = 1;
  return nullptr;
}

int32_t cpu_supports(hp_ctx*, int32_t dev, int32_t op, int32_t dtype) {
  if (dev != 0 || dtype != HP_F32) return 0;
  return op == HP_OP_GEMM || hp_common::is_binary(op) || hp_common::is_unary(op);
}

hp_status* cpu_alloc(hp_ctx*, int32_t dev, size_t bytes, int32_t kind, void** out) {
  if (hp_status* st = check_dev(dev, "alloc")) return st;
  if (!out) return make_status(HP_INVALID, "cpu: alloc: null output");
  if (kind != HP_MEM_DEVICE && kind != HP_MEM_PINNED_HOST)
    return make_status(HP_INVALID, "cpu: alloc: unknown memory kind %d", kind);
  // 64-byte alignment suits AVX-512 loads and cache lines; aligned_alloc wants a multiple of it.
  size_t rounded = (bytes + 63) / 64 * 64;
  *out = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!*out) return make_status(HP_NO_MEMORY, "cpu: alloc: cannot allocate %zu bytes", bytes);
  return nullptr;
}

hp_status* cpu_free(hp_ctx*, int32_t dev, void* p, int32_t) {
  if (hp_status* st = check_dev(dev, "free_mem")) return st;
  std::free(p);
  return nullptr;
}

hp_status* cpu_stream_create(hp_ctx* ctx, int32_t dev, hp_stream** out) {
  if (hp_status* st = check_dev(dev, "stream_create")) return st;
  if (!out) return make_status(HP_INVALID, "cpu: stream_create: null output");
  HP_PLUGIN_GUARD(kCpu, {
    *out = new hp_stream(ctx->engine);
    return nullptr;
  })
}

hp_status* cpu_stream_sync(hp_ctx*, hp_stream* s) {
  if (!s) return make_status(HP_INVALID, "cpu: stream_sync: null stream");
  HP_PLUGIN_GUARD(kCpu, {
    s->dnnl_stream.wait();
    return nullptr;
  })
}

hp_status* cpu_stream_destroy(hp_ctx*, hp_stream* s) {
  delete s;
  return nullptr;
}

hp_status* cpu_event_create(hp_ctx*, int32_t dev, hp_event** out) {
  if (hp_status* st = check_dev(dev, "event_create")) return st;
  if (!out) return make_status(HP_INVALID, "cpu: event_create: null output");
  *out = new (std::nothrow) hp_event();
  return *out ? nullptr : make_status(HP_NO_MEMORY, "cpu: event_create: out of memory");
}

hp_status* cpu_event_record(hp_ctx*, hp_event* e, hp_stream* s) {
  if (!e || !s) return make_status(HP_INVALID, "cpu: event_record: null event or stream");
  e->recorded.store(1);
  return nullptr;
}

hp_status* cpu_stream_wait_event(hp_ctx*, hp_stream* s, hp_event* e) {
  if (!e || !s) return make_status(HP_INVALID, "cpu: stream_wait_event: null event or stream");
  return nullptr;
}

hp_status* cpu_event_sync(hp_ctx*, hp_event* e) {
  return e ? nullptr : make_status(HP_INVALID, "cpu: event_sync: null event");
}

hp_status* cpu_event_query(hp_ctx*, hp_event* e, int32_t* done) {
  if (!e || !done) return make_status(HP_INVALID, "cpu: event_query: null argument");
  // An event never recorded counts as complete, as in CUDA.
  *done = 1;
  return nullptr;
}

hp_status* cpu_event_destroy(hp_ctx*, hp_event* e) {
  delete e;
  return nullptr;
}

hp_status* cpu_copy_async(hp_ctx*, hp_stream* s, void* dst, const void* src, size_t bytes, int32_t dir) {
  if (!s) return make_status(HP_INVALID, "cpu: copy_async: null stream");
  if (dir < HP_H2D || dir > HP_H2H) return make_status(HP_INVALID, "cpu: copy_async: bad direction %d", dir);
  if (bytes == 0) return nullptr;
  if (!dst || !src) return make_status(HP_INVALID, "cpu: copy_async: null pointer");
  std::memmove(dst, src, bytes);
  return nullptr;
}

hp_status* cpu_mem_info(hp_ctx* ctx, int32_t dev, uint64_t* free_bytes, uint64_t* total_bytes) {
  hp_device_info d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  if (hp_status* st = hp_cpu::device_info(ctx, dev, &d)) return st;
  if (free_bytes) *free_bytes = d.mem_free;
  if (total_bytes) *total_bytes = d.mem_total;
  return nullptr;
}

const hp_backend_v1 kTable = {
    sizeof(hp_backend_v1), HP_ABI_MAJOR, HP_ABI_MINOR, "cpu", "0.1.0",
    hp_common::status_code, hp_common::status_message, hp_common::status_free,
    cpu_open, cpu_close, cpu_device_count, hp_cpu::device_info, cpu_supports,
    cpu_alloc, cpu_free,
    cpu_stream_create, cpu_stream_sync, cpu_stream_destroy,
    cpu_event_create, cpu_event_record, cpu_stream_wait_event, cpu_event_sync, cpu_event_destroy,
    cpu_copy_async, hp_cpu::gemm, hp_cpu::elementwise,
    nullptr, nullptr, nullptr,  // no whole-graph execution
    cpu_event_query, cpu_mem_info,
    hp_cpu::supports_op, hp_cpu::run_op,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const hp_backend_v1* hp_backend_entry_v1(uint16_t) {
  return &kTable;
}

/// Always usable; the lowest score, so accelerators are preferred.
extern "C" __attribute__((visibility("default"))) int32_t hp_backend_probe(void) { return 1; }
