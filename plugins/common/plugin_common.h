// Helpers shared by the hp backend plugins (header-only, compiled into each plugin separately; the
// version script keeps every symbol local). They implement the plugin side of the ABI conventions:
// status objects with printf-style messages, struct_size-aware copying of out-structs, fixed-size
// string fields, and the catch-all that keeps C++ exceptions from crossing the C boundary.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "hp/plugin/hp_plugin.h"

/// The plugin's status object: a code and an owned message.
struct hp_status {
  hp_code code;
  std::string message;
};

namespace hp_common {

/// A status with a formatted message (lower-case, names the backend and the call by convention).
__attribute__((format(printf, 2, 3))) inline hp_status* make_status(hp_code code, const char* fmt,
                                                                    ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return new (std::nothrow) hp_status{code, buf};
}

inline hp_code status_code(const hp_status* s) { return s ? s->code : HP_OK; }
inline const char* status_message(const hp_status* s) { return s ? s->message.c_str() : ""; }
inline void status_free(hp_status* s) { delete s; }

/// Copies `full` into the caller's struct, honouring the caller's struct_size (which is kept).
template <class T>
void copy_out(T* out, const T& full) {
  std::size_t n = out->struct_size < sizeof(T) ? out->struct_size : sizeof(T);
  std::size_t caller_size = out->struct_size;
  std::memcpy(out, &full, n);
  out->struct_size = caller_size;
}

/// Reads the caller's struct into a full-size local, zero-filling members the caller does not know.
template <class T>
T copy_in(const T* in) {
  T full;
  std::memset(&full, 0, sizeof full);
  std::size_t n = in->struct_size < sizeof(T) ? in->struct_size : sizeof(T);
  std::memcpy(&full, in, n);
  return full;
}

/// strncpy that always terminates.
inline void set_str(char* dst, std::size_t cap, const std::string& s) {
  std::size_t n = s.size() < cap - 1 ? s.size() : cap - 1;
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

inline bool is_binary(int32_t op) { return op >= HP_OP_ADD && op <= HP_OP_MIN; }
inline bool is_unary(int32_t op) { return op >= HP_OP_RELU && op <= HP_OP_SCALE; }

/// Validates the shape fields of a gemm descriptor; nullptr when fine.
inline hp_status* check_gemm(const char* backend, const hp_gemm_desc& d) {
  if (!d.a || !d.b || !d.c) return make_status(HP_INVALID, "%s: gemm: null operand", backend);
  if (d.m < 1 || d.n < 1 || d.k < 1 || d.batch < 1)
    return make_status(HP_INVALID, "%s: gemm: bad size m=%lld n=%lld k=%lld batch=%lld", backend,
                       (long long)d.m, (long long)d.n, (long long)d.k, (long long)d.batch);
  int64_t a_cols = d.trans_a ? d.m : d.k, b_cols = d.trans_b ? d.k : d.n;
  if (d.lda < a_cols || d.ldb < b_cols || d.ldc < d.n)
    return make_status(HP_INVALID,
                       "%s: gemm: leading dimension too small (lda=%lld ldb=%lld ldc=%lld)",
                       backend, (long long)d.lda, (long long)d.ldb, (long long)d.ldc);
  if (d.batch > 1 && d.stride_c == 0)
    return make_status(HP_INVALID, "%s: gemm: batched output needs stride_c > 0", backend);
  if (d.type_a != HP_F32 || d.type_b != HP_F32 || d.type_c != HP_F32)
    return make_status(HP_UNSUPPORTED, "%s: gemm: only f32 operands are implemented", backend);
  return nullptr;
}

/// Validates an elementwise descriptor; nullptr when fine.
inline hp_status* check_elementwise(const char* backend, const hp_elementwise_desc& d) {
  if (!is_binary(d.op) && !is_unary(d.op))
    return make_status(HP_UNSUPPORTED, "%s: elementwise: unknown op %d", backend, d.op);
  if (d.dtype != HP_F32)
    return make_status(HP_UNSUPPORTED, "%s: elementwise: only f32 is implemented", backend);
  if (d.n < 0 || (d.n > 0 && (!d.x || !d.out)) || (is_binary(d.op) && d.n > 0 && !d.y))
    return make_status(HP_INVALID, "%s: elementwise: null operand or negative size", backend);
  if (is_binary(d.op) && d.y_len != 0 && (d.y_len < 0 || d.n % d.y_len != 0))
    return make_status(HP_INVALID, "%s: elementwise: y_len %lld does not divide n %lld", backend,
                       (long long)d.y_len, (long long)d.n);
  return nullptr;
}

}  // namespace hp_common

/// Runs `body` (returning hp_status*), turning any C++ exception into an HP_INTERNAL status.
#define HP_PLUGIN_GUARD(backend, body)                                              \
  try {                                                                             \
    body                                                                            \
  } catch (const std::bad_alloc&) {                                                 \
    return hp_common::make_status(HP_NO_MEMORY, "%s: out of host memory", backend); \
  } catch (const std::exception& e) {                                               \
    return hp_common::make_status(HP_INTERNAL, "%s: %s", backend, e.what());        \
  } catch (...) {                                                                   \
    return hp_common::make_status(HP_INTERNAL, "%s: unknown exception", backend);   \
  }
