// The cpu backend: hp's reference implementation of the plugin ABI and the fallback for every op an
// accelerator backend does not support. It is always built and is what the conformance suite
// compares other backends against, so it favours obvious correctness: GEMM goes through oneDNN's
// matmul (with a plain loop as a safety net), elementwise ops are simple loops the compiler
// vectorises.
//
// Execution model: synchronous. Every queued call has completed when it returns, so streams are in
// order trivially, an event is complete as soon as it is recorded, and stream_wait_event has
// nothing to wait for. "Device" memory is ordinary host memory (HP_CAP_HOST_VISIBLE), so all four
// copy directions are memcpy.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

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
  return dev == 0 ? nullptr
                  : make_status(HP_INVALID, "cpu: %s: no device %d (the cpu backend has one)", call,
                                dev);
}

/// Parses the N of "key=N" (decimal, optionally with a binary suffix K/M/G meaning KiB/MiB/GiB).
bool parse_count(const char* text, unsigned long long* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(text, &end, 10);
  if (end == text || errno || text[0] == '-') return false;
  unsigned long long scale = 1;
  if (*end == 'K')
    scale = 1ull << 10, ++end;
  else if (*end == 'M')
    scale = 1ull << 20, ++end;
  else if (*end == 'G')
    scale = 1ull << 30, ++end;
  if (*end || n > ~0ull / scale) return false;
  *out = n * scale;
  return true;
}

/// Open options:
///  - "threads=N" sets the OpenMP (and so oneDNN) thread count of the process, which keeps
///    `hp launch --threads N` from oversubscribing cores; without it OpenMP's default (the cores in
///    the affinity mask) applies.
///  - "device_budget=BYTES" (suffix K, M or G allowed) makes device memory an arena of that size:
///    allocations past it fail with HP_NO_MEMORY, so an offload schedule planned for a smaller
///    device is really exercised on this one (docs/offload.md, "Offload at run time"). 0 or absent:
///    no budget.
///  - "packed_weights_limit=BYTES" (suffix K, M or G allowed; default 4G) bounds the constant
///    weights kept in the kernels' layouts (PackedWeights, cpu_internal.h); past it weights are
///    used as given.
///  - "compute=bf16" runs float32 MatMul, Gemm and Conv in bfloat16 with float32 accumulation and
///    outputs (cpu_gemm.cpp, cpu_conv.cpp), on CPUs with AVX512-BF16 or AMX only (refused
///    elsewhere: oneDNN would emulate it slower than float32). "compute=f32" (the default) keeps
///    float32.
/// Other keys belong to other backends (every plugin sees every option) and are ignored.
hp_status* cpu_open(const char* const* kv, size_t n_kv, hp_ctx** out) {
  HP_PLUGIN_GUARD(kCpu, {
    if (!out) return make_status(HP_INVALID, "cpu: open: null output");
    unsigned long long budget = 0;
    unsigned long long pack_limit = hp_cpu::PackedWeights::kPackedWeightsLimit;
    bool bf16 = false;
    for (size_t i = 0; kv && i < n_kv; ++i) {
      if (!kv[i]) continue;
      if (std::strncmp(kv[i], "packed_weights_limit=", 21) == 0) {
        if (!parse_count(kv[i] + 21, &pack_limit))
          return make_status(HP_INVALID,
                             "cpu: open: bad option '%s' (want packed_weights_limit=BYTES)", kv[i]);
        continue;
      }
      if (std::strncmp(kv[i], "compute=", 8) == 0) {
        const std::string v = kv[i] + 8;
        if (v != "bf16" && v != "f32")
          return make_status(HP_INVALID, "cpu: open: bad option '%s' (want compute=f32 or bf16)",
                             kv[i]);
        bf16 = v == "bf16";
        const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
        if (bf16 && isa != dnnl::cpu_isa::avx512_core_bf16 && isa != dnnl::cpu_isa::avx512_core_amx)
          return make_status(HP_UNSUPPORTED,
                             "cpu: compute=bf16 needs a CPU with AVX512-BF16 or AMX, which this "
                             "one lacks");
        continue;
      }
      if (std::strncmp(kv[i], "device_budget=", 14) == 0) {
        if (!parse_count(kv[i] + 14, &budget))
          return make_status(HP_INVALID, "cpu: open: bad option '%s' (want device_budget=BYTES)",
                             kv[i]);
        continue;
      }
      if (std::strncmp(kv[i], "threads=", 8) != 0) continue;
      char* end = nullptr;
      long n = std::strtol(kv[i] + 8, &end, 10);
      if (!end || *end || n < 1 || n > 4096)
        return make_status(HP_INVALID, "cpu: open: bad option '%s' (want threads=N, N >= 1)",
                           kv[i]);
#if HP_CPU_HAS_OPENMP
      omp_set_num_threads(static_cast<int>(n));
#endif
    }
    *out = new hp_ctx();
    (*out)->arena.limit = budget;
    (*out)->bf16 = bf16;
    (*out)->packed.limit = static_cast<std::size_t>(pack_limit);
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

// Every allocation carries a 64-byte header (its size and kind) in front of the pointer handed out,
// so free_mem knows how many device bytes to give back without a lookup table; 64 keeps the
// pointer's alignment. Only HP_MEM_DEVICE counts against the arena: pinned host memory is the host
// pool that offloaded tensors live in.
constexpr size_t kHeader = 64;
struct AllocHeader {
  uint64_t bytes;
  int32_t kind;
};

hp_status* cpu_alloc(hp_ctx* ctx, int32_t dev, size_t bytes, int32_t kind, void** out) {
  if (hp_status* st = check_dev(dev, "alloc")) return st;
  if (!out) return make_status(HP_INVALID, "cpu: alloc: null output");
  if (kind != HP_MEM_DEVICE && kind != HP_MEM_PINNED_HOST)
    return make_status(HP_INVALID, "cpu: alloc: unknown memory kind %d", kind);
  *out = nullptr;
  // 64-byte alignment suits AVX-512 loads and cache lines; aligned_alloc wants a multiple of it.
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  CpuArena* a = ctx && kind == HP_MEM_DEVICE ? &ctx->arena : nullptr;
  if (a) {
    // Reserve first (compare-exchange), so concurrent allocations cannot both slip under the limit.
    uint64_t used = a->in_use.load();
    do {
      if (a->limit > 0 && used + rounded > a->limit) {
        a->refused.fetch_add(1);
        return make_status(HP_NO_MEMORY,
                           "cpu: alloc: device budget of %llu bytes exceeded: %zu bytes requested "
                           "with %llu in use",
                           static_cast<unsigned long long>(a->limit), bytes,
                           static_cast<unsigned long long>(used));
      }
    } while (!a->in_use.compare_exchange_weak(used, used + rounded));
  }
  auto* base = static_cast<unsigned char*>(std::aligned_alloc(64, rounded + kHeader));
  if (!base) {
    if (a) a->in_use.fetch_sub(rounded);
    return make_status(HP_NO_MEMORY, "cpu: alloc: cannot allocate %zu bytes", bytes);
  }
  auto* h = reinterpret_cast<AllocHeader*>(base);
  h->bytes = rounded;
  h->kind = kind;
  if (a) {
    a->allocs.fetch_add(1);
    const uint64_t now = a->in_use.load();
    uint64_t p = a->peak.load();
    while (now > p && !a->peak.compare_exchange_weak(p, now)) {
    }
  }
  *out = base + kHeader;
  return nullptr;
}

hp_status* cpu_free(hp_ctx* ctx, int32_t dev, void* p, int32_t) {
  if (hp_status* st = check_dev(dev, "free_mem")) return st;
  if (!p) return nullptr;
  auto* base = static_cast<unsigned char*>(p) - kHeader;
  const auto* h = reinterpret_cast<const AllocHeader*>(base);
  if (ctx && h->kind == HP_MEM_DEVICE) ctx->arena.in_use.fetch_sub(h->bytes);
  std::free(base);
  return nullptr;
}

hp_status* cpu_mem_stats(hp_ctx* ctx, int32_t dev, int32_t reset_peak, hp_mem_stats* out) {
  if (hp_status* st = check_dev(dev, "mem_stats")) return st;
  if (!ctx || !out || out->struct_size < offsetof(hp_mem_stats, in_use) + sizeof(uint64_t))
    return make_status(HP_INVALID, "cpu: mem_stats: null or too small output");
  const CpuArena& a = ctx->arena;
  const hp_mem_stats m = {sizeof(hp_mem_stats), a.in_use.load(), a.peak.load(), a.limit,
                          a.allocs.load(),      a.refused.load()};
  std::memcpy(reinterpret_cast<unsigned char*>(out) + sizeof(size_t),
              reinterpret_cast<const unsigned char*>(&m) + sizeof(size_t),
              std::min(out->struct_size, sizeof m) - sizeof(size_t));
  if (reset_peak) ctx->arena.peak.store(ctx->arena.in_use.load());
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

hp_status* cpu_copy_async(hp_ctx*, hp_stream* s, void* dst, const void* src, size_t bytes,
                          int32_t dir) {
  if (!s) return make_status(HP_INVALID, "cpu: copy_async: null stream");
  if (dir < HP_H2D || dir > HP_H2H)
    return make_status(HP_INVALID, "cpu: copy_async: bad direction %d", dir);
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
    sizeof(hp_backend_v1),
    HP_ABI_MAJOR,
    HP_ABI_MINOR,
    "cpu",
    "0.1.0",
    hp_common::status_code,
    hp_common::status_message,
    hp_common::status_free,
    cpu_open,
    cpu_close,
    cpu_device_count,
    hp_cpu::device_info,
    cpu_supports,
    cpu_alloc,
    cpu_free,
    cpu_stream_create,
    cpu_stream_sync,
    cpu_stream_destroy,
    cpu_event_create,
    cpu_event_record,
    cpu_stream_wait_event,
    cpu_event_sync,
    cpu_event_destroy,
    cpu_copy_async,
    hp_cpu::gemm,
    hp_cpu::elementwise,
    nullptr,
    nullptr,
    nullptr,  // no whole-graph execution
    cpu_event_query,
    cpu_mem_info,
    hp_cpu::supports_op,
    hp_cpu::run_op,
    cpu_mem_stats,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const hp_backend_v1* hp_backend_entry_v1(
    uint16_t) {
  return &kTable;
}

/// Always usable; the lowest score, so accelerators are preferred.
extern "C" __attribute__((visibility("default"))) int32_t hp_backend_probe(void) { return 1; }
