/*
 * A minimal hp backend written in plain C, compiled several times with different FAKE_* switches to
 * exercise the loader's checks (tests/unit/plugin). Being C, it also proves hp_plugin.h is a C header.
 *
 *   FAKE_OLD_MINOR      ABI 1.0 table: struct_size stops before the 1.1 members, whose slots hold a
 *                       function that aborts, so a host that ignores struct_size crashes the test
 *   FAKE_MAJOR2_SYMBOL  exports only hp_backend_entry_v2 (a plugin built for a future ABI)
 *   FAKE_MAJOR2_TABLE   exports hp_backend_entry_v1 but its table says major 2
 *   FAKE_NULL_MEMBER    a mandatory member (gemm) is NULL
 *   FAKE_UNAVAILABLE    open fails with HP_UNAVAILABLE, the way a missing vendor runtime does
 *   FAKE_NO_DEVICES     opens fine, reports zero devices
 *   FAKE_NEEDS_VENDOR   calls a function of libhpfakevendor.so, which is not on the loader path
 *   FAKE_CRASH          its entry point dies with SIGSEGV: a broken plugin that takes down whatever
 *                       process loads it (built into a directory of its own, plugins-broken/)
 *   FAKE_HANG           its entry point never returns (plugins-hang/): a plugin whose driver
 *                       initialisation waits forever
 *   (none)              a well-formed 1.1 backend with one host-memory device
 *
 * Kernels are not implemented (HP_UNSUPPORTED); memory is malloc, streams are synchronous.
 */
#ifdef FAKE_HANG
#define _POSIX_C_SOURCE 200809L /* pause() */
#include <unistd.h>
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp/plugin/hp_plugin.h"

#define EXPORT __attribute__((visibility("default")))

#ifndef FAKE_NAME
#define FAKE_NAME "fake"
#endif

struct hp_status {
  hp_code code;
  char message[256];
};
struct hp_ctx {
  int unused;
};
struct hp_stream {
  int unused;
};
struct hp_event {
  int recorded;
};

static hp_status* make_status(hp_code code, const char* message) {
  hp_status* s = (hp_status*)calloc(1, sizeof *s);
  if (!s) return NULL;
  s->code = code;
  snprintf(s->message, sizeof s->message, "%s: %s", FAKE_NAME, message);
  return s;
}

static hp_code f_status_code(const hp_status* s) { return s->code; }
static const char* f_status_message(const hp_status* s) { return s->message; }
static void f_status_free(hp_status* s) { free(s); }

#ifdef FAKE_NEEDS_VENDOR
int hpfakevendor_answer(void);
#endif

static hp_status* f_open(const char* const* kv, size_t n_kv, hp_ctx** out) {
  (void)kv;
  (void)n_kv;
#ifdef FAKE_UNAVAILABLE
  (void)out;
  return make_status(HP_UNAVAILABLE, "fake runtime not found (tried libfake.so: no such file); install it");
#else
#ifdef FAKE_NEEDS_VENDOR
  if (hpfakevendor_answer() != 42) return make_status(HP_INTERNAL, "vendor library misbehaves");
#endif
  *out = (hp_ctx*)calloc(1, sizeof(hp_ctx));
  return *out ? NULL : make_status(HP_NO_MEMORY, "open: out of memory");
#endif
}

static void f_close(hp_ctx* ctx) { free(ctx); }

static hp_status* f_device_count(hp_ctx* ctx, int32_t* out) {
  (void)ctx;
#ifdef FAKE_NO_DEVICES
  *out = 0;
#else
  *out = 1;
#endif
  return NULL;
}

static hp_status* f_device_info(hp_ctx* ctx, int32_t dev, hp_device_info* out) {
  (void)ctx;
  if (dev != 0) return make_status(HP_INVALID, "device_info: no such device");
  hp_device_info d;
  memset(&d, 0, sizeof d);
  snprintf(d.name, sizeof d.name, "%s device", FAKE_NAME);
  snprintf(d.arch, sizeof d.arch, "host");
  d.kind = HP_DEVICE_CPU;
  d.mem_total = 1u << 30;
  d.mem_free = 1u << 29;
  d.compute_units = 1;
  d.peak_flops[HP_F32] = 1e9;
  d.flops_prov[HP_F32] = HP_PROV_MEASURED;
  d.mem_Bps = 1e10;
  d.mem_prov = HP_PROV_TABLE;
  d.caps = HP_CAP_HOST_VISIBLE;
  snprintf(d.note, sizeof d.note, "fake");
  /* Fill only what the caller's struct_size covers. */
  size_t caller = out->struct_size;
  memcpy(out, &d, caller < sizeof d ? caller : sizeof d);
  out->struct_size = caller;
  return NULL;
}

static int32_t f_supports(hp_ctx* ctx, int32_t dev, int32_t op, int32_t dtype) {
  (void)ctx;
  (void)dev;
  (void)op;
  (void)dtype;
  return 0;
}

static hp_status* f_alloc(hp_ctx* ctx, int32_t dev, size_t bytes, int32_t kind, void** out) {
  (void)ctx;
  (void)dev;
  (void)kind;
  *out = malloc(bytes ? bytes : 1);
  return *out ? NULL : make_status(HP_NO_MEMORY, "alloc failed");
}
static hp_status* f_free(hp_ctx* ctx, int32_t dev, void* p, int32_t kind) {
  (void)ctx;
  (void)dev;
  (void)kind;
  free(p);
  return NULL;
}
static hp_status* f_stream_create(hp_ctx* ctx, int32_t dev, hp_stream** out) {
  (void)ctx;
  (void)dev;
  *out = (hp_stream*)calloc(1, sizeof(hp_stream));
  return NULL;
}
static hp_status* f_stream_sync(hp_ctx* ctx, hp_stream* s) {
  (void)ctx;
  (void)s;
  return NULL;
}
static hp_status* f_stream_destroy(hp_ctx* ctx, hp_stream* s) {
  (void)ctx;
  free(s);
  return NULL;
}
static hp_status* f_event_create(hp_ctx* ctx, int32_t dev, hp_event** out) {
  (void)ctx;
  (void)dev;
  *out = (hp_event*)calloc(1, sizeof(hp_event));
  return NULL;
}
static hp_status* f_event_record(hp_ctx* ctx, hp_event* e, hp_stream* s) {
  (void)ctx;
  (void)s;
  e->recorded = 1;
  return NULL;
}
static hp_status* f_stream_wait_event(hp_ctx* ctx, hp_stream* s, hp_event* e) {
  (void)ctx;
  (void)s;
  (void)e;
  return NULL;
}
static hp_status* f_event_sync(hp_ctx* ctx, hp_event* e) {
  (void)ctx;
  (void)e;
  return NULL;
}
static hp_status* f_event_destroy(hp_ctx* ctx, hp_event* e) {
  (void)ctx;
  free(e);
  return NULL;
}
static hp_status* f_copy(hp_ctx* ctx, hp_stream* s, void* dst, const void* src, size_t bytes, int32_t dir) {
  (void)ctx;
  (void)s;
  (void)dir;
  memmove(dst, src, bytes);
  return NULL;
}
__attribute__((unused)) static hp_status* f_gemm(hp_ctx* ctx, hp_stream* s, const hp_gemm_desc* d) {
  (void)ctx;
  (void)s;
  (void)d;
  return make_status(HP_UNSUPPORTED, "gemm is not implemented");
}
static hp_status* f_elementwise(hp_ctx* ctx, hp_stream* s, const hp_elementwise_desc* d) {
  (void)ctx;
  (void)s;
  (void)d;
  return make_status(HP_UNSUPPORTED, "elementwise is not implemented");
}
__attribute__((unused)) static hp_status* f_event_query(hp_ctx* ctx, hp_event* e, int32_t* done) {
  (void)ctx;
  *done = e->recorded;
  return NULL;
}
__attribute__((unused)) static hp_status* f_mem_info(hp_ctx* ctx, int32_t dev, uint64_t* free_bytes, uint64_t* total) {
  (void)ctx;
  (void)dev;
  *free_bytes = 1u << 29;
  *total = 1u << 30;
  return NULL;
}

#ifdef FAKE_OLD_MINOR
/* Sits in the slots past struct_size: calling it means the host ignored struct_size. */
static hp_status* poison_event_query(hp_ctx* ctx, hp_event* e, int32_t* done) {
  (void)ctx;
  (void)e;
  (void)done;
  fprintf(stderr, "fake: host called a member beyond struct_size\n");
  abort();
}
static hp_status* poison_mem_info(hp_ctx* ctx, int32_t dev, uint64_t* f, uint64_t* t) {
  (void)ctx;
  (void)dev;
  (void)f;
  (void)t;
  fprintf(stderr, "fake: host called a member beyond struct_size\n");
  abort();
}
#endif

static const hp_backend_v1 table = {
#ifdef FAKE_OLD_MINOR
    HP_BACKEND_V1_0_SIZE, 1, 0,
#elif defined(FAKE_MAJOR2_TABLE)
    sizeof(hp_backend_v1), 2, 0,
#else
    sizeof(hp_backend_v1), HP_ABI_MAJOR, HP_ABI_MINOR,
#endif
    FAKE_NAME, "9.9.9",
    f_status_code, f_status_message, f_status_free,
    f_open, f_close, f_device_count, f_device_info, f_supports,
    f_alloc, f_free,
    f_stream_create, f_stream_sync, f_stream_destroy,
    f_event_create, f_event_record, f_stream_wait_event, f_event_sync, f_event_destroy,
    f_copy,
#ifdef FAKE_NULL_MEMBER
    NULL,
#else
    f_gemm,
#endif
    f_elementwise,
    NULL, NULL, NULL,
#ifdef FAKE_OLD_MINOR
    poison_event_query, poison_mem_info,
#else
    f_event_query, f_mem_info,
#endif
    NULL, NULL, /* 1.2 supports_op / run_op: optional, absent */
    NULL,       /* 1.3 mem_stats: optional, absent */
};

#ifdef FAKE_MAJOR2_SYMBOL
EXPORT const hp_backend_v1* hp_backend_entry_v2(uint16_t host_minor) {
  (void)host_minor;
  return &table;
}
#else
EXPORT const hp_backend_v1* hp_backend_entry_v1(uint16_t host_minor) {
  (void)host_minor;
#ifdef FAKE_CRASH
  raise(SIGSEGV);
#endif
#ifdef FAKE_HANG
  for (;;) pause();
#endif
  return &table;
}
#endif

EXPORT int32_t hp_backend_probe(void) { return 5; }
