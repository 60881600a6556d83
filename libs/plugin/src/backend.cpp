// Host-side wrapper of one plugin table. The only subtle part is version gating: a member appended
// in a later minor exists only when the table's struct_size covers it, and the structs we pass in
// carry our own struct_size so the plugin fills only what both sides know.
#include "hp/plugin/backend.h"

#include <fmt/core.h>

#include <cstring>

namespace hp::plugin {

// hp_dtype is core's DType numbering for the first ten values (hp/core/dtype.h), so both ways are a
// cast.
static_assert(static_cast<int>(DType::f32) == HP_F32 && static_cast<int>(DType::f16) == HP_F16 &&
                  static_cast<int>(DType::bf16) == HP_BF16 &&
                  static_cast<int>(DType::f64) == HP_F64 && static_cast<int>(DType::i8) == HP_I8 &&
                  static_cast<int>(DType::i32) == HP_I32 &&
                  static_cast<int>(DType::i64) == HP_I64 && static_cast<int>(DType::f8) == HP_F8 &&
                  static_cast<int>(DType::boolean) == HP_BOOL &&
                  static_cast<int>(DType::u8) == HP_U8 && static_cast<int>(DType::i16) == HP_I16 &&
                  static_cast<int>(DType::u16) == HP_U16 &&
                  static_cast<int>(DType::u32) == HP_U32 && static_cast<int>(DType::u64) == HP_U64,
              "hp_dtype and hp::DType must number the ABI's types alike");

std::optional<DType> to_dtype(int hp_dtype) {
  if (hp_dtype < HP_F32 || hp_dtype > HP_U64) return std::nullopt;
  return static_cast<DType>(hp_dtype);
}

int to_hp_dtype(DType t) {
  const int v = static_cast<int>(t);
  return v >= HP_F32 && v <= HP_U64 ? v : -1;
}

const char* dtype_name(int dtype) {
  const auto t = to_dtype(dtype);
  return t ? hp::dtype_name(*t) : "?";
}

const char* prov_name(hp_prov p) {
  switch (p) {
    case HP_PROV_MEASURED: return "measured";
    case HP_PROV_TABLE: return "table";
    default: return "unknown";
  }
}

const char* kind_name(hp_device_kind k) {
  switch (k) {
    case HP_DEVICE_GPU: return "gpu";
    case HP_DEVICE_NPU: return "npu";
    default: return "cpu";
  }
}

const char* code_name(hp_code c) {
  switch (c) {
    case HP_OK: return "ok";
    case HP_UNAVAILABLE: return "unavailable";
    case HP_INVALID: return "invalid argument";
    case HP_NO_MEMORY: return "out of memory";
    case HP_UNSUPPORTED: return "unsupported";
    case HP_VERSION: return "version mismatch";
    case HP_DEVICE_LOST: return "device lost";
    case HP_TIMEOUT: return "timeout";
    case HP_INTERNAL: return "internal error";
  }
  return "unknown code";
}

Errc errc_for(hp_code c) {
  switch (c) {
    case HP_UNAVAILABLE:
    case HP_VERSION: return Errc::unavailable;
    case HP_INVALID: return Errc::bad_input;
    case HP_UNSUPPORTED: return Errc::not_implemented;
    case HP_INTERNAL: return Errc::internal;
    default: return Errc::runtime;
  }
}

Status take_status(const hp_backend_v1* table, hp_status* st, const std::string& context) {
  if (st == nullptr) return Status::success();
  hp_code code = table->status_code ? table->status_code(st) : HP_INTERNAL;
  const char* msg = table->status_message ? table->status_message(st) : nullptr;
  Error e(errc_for(code), msg && *msg ? msg : code_name(code), context);
  if (table->status_free) table->status_free(st);
  return e;
}

namespace {

Figure figure(double v, int32_t prov) {
  auto p = static_cast<hp_prov>(prov);
  if (p != HP_PROV_TABLE && p != HP_PROV_MEASURED) p = HP_PROV_UNKNOWN;
  return Figure{v, p};
}

std::string fixed_string(const char* s, std::size_t cap) { return std::string(s, strnlen(s, cap)); }

}  // namespace

Backend::Backend(const hp_backend_v1* table, hp_ctx* ctx, std::string path)
    : table_(table), ctx_(ctx), path_(std::move(path)) {}

// close() releases the context; the library stays mapped (see registry.h).
Backend::~Backend() {
  if (table_->close && ctx_) table_->close(ctx_);
}

bool Backend::has_event_query() const {
  return HP_HAS_MEMBER(table_, hp_backend_v1, event_query) && table_->event_query != nullptr;
}

bool Backend::has_mem_info() const {
  return HP_HAS_MEMBER(table_, hp_backend_v1, mem_info) && table_->mem_info != nullptr;
}

Status Backend::take(hp_status* st, const char* call) const {
  // Every plugin call of the hot path (run_op, alloc, stream_sync) ends here: the context string is
  // built only for an error, success costs a compare.
  if (st == nullptr) return Status::success();
  return take_status(table_, st, fmt::format("{} plugin, {}", name(), call));
}

Expected<int> Backend::device_count() const {
  int32_t n = 0;
  HP_TRY(take(table_->device_count(ctx_, &n), "device_count"));
  return static_cast<int>(n);
}

Expected<DeviceInfo> Backend::device_info(int dev) const {
  hp_device_info raw;
  std::memset(&raw, 0, sizeof raw);
  raw.struct_size = sizeof raw;
  raw.numa_node = -1;
  HP_TRY(take(table_->device_info(ctx_, dev, &raw), "device_info"));
  DeviceInfo d;
  d.index = dev;
  d.name = fixed_string(raw.name, sizeof raw.name);
  d.arch = fixed_string(raw.arch, sizeof raw.arch);
  d.bus_id = fixed_string(raw.bus_id, sizeof raw.bus_id);
  d.note = fixed_string(raw.note, sizeof raw.note);
  d.kind = static_cast<hp_device_kind>(raw.kind);
  d.numa_node = raw.numa_node;
  d.mem_total = raw.mem_total;
  d.mem_free = raw.mem_free;
  d.compute_units = raw.compute_units;
  d.clock_hz = raw.clock_hz;
  for (int i = 0; i < HP_DTYPE_COUNT; ++i)
    d.peak_flops[i] = figure(raw.peak_flops[i], raw.flops_prov[i]);
  d.mem_bw = figure(raw.mem_Bps, raw.mem_prov);
  d.h2d_bw = figure(raw.h2d_Bps, raw.h2d_prov);
  d.d2h_bw = figure(raw.d2h_Bps, raw.d2h_prov);
  d.peer_bw = figure(raw.peer_Bps, raw.peer_prov);
  d.caps = raw.caps;
  return d;
}

bool Backend::supports(int dev, int op, int dtype) const {
  return table_->supports && table_->supports(ctx_, dev, op, dtype) != 0;
}

Expected<void*> Backend::alloc(int dev, std::size_t bytes, int kind) const {
  void* p = nullptr;
  HP_TRY(take(table_->alloc(ctx_, dev, bytes, kind, &p), "alloc"));
  return p;
}

Status Backend::free_mem(int dev, void* p, int kind) const {
  return take(table_->free_mem(ctx_, dev, p, kind), "free_mem");
}

Expected<hp_stream*> Backend::stream_create(int dev) const {
  hp_stream* s = nullptr;
  HP_TRY(take(table_->stream_create(ctx_, dev, &s), "stream_create"));
  return s;
}

Status Backend::stream_sync(hp_stream* s) const {
  return take(table_->stream_sync(ctx_, s), "stream_sync");
}

Status Backend::stream_destroy(hp_stream* s) const {
  return take(table_->stream_destroy(ctx_, s), "stream_destroy");
}

Expected<hp_event*> Backend::event_create(int dev) const {
  hp_event* e = nullptr;
  HP_TRY(take(table_->event_create(ctx_, dev, &e), "event_create"));
  return e;
}

Status Backend::event_record(hp_event* e, hp_stream* s) const {
  return take(table_->event_record(ctx_, e, s), "event_record");
}

Status Backend::stream_wait_event(hp_stream* s, hp_event* e) const {
  return take(table_->stream_wait_event(ctx_, s, e), "stream_wait_event");
}

Status Backend::event_sync(hp_event* e) const {
  return take(table_->event_sync(ctx_, e), "event_sync");
}

Status Backend::event_destroy(hp_event* e) const {
  return take(table_->event_destroy(ctx_, e), "event_destroy");
}

bool Backend::has_run_op() const {
  return HP_HAS_MEMBER(table_, hp_backend_v1, run_op) && table_->supports_op != nullptr &&
         table_->run_op != nullptr;
}

bool Backend::supports_op(int dev, const char* op_type, const char* domain, std::int64_t opset,
                          const std::vector<std::int32_t>& input_dtypes) const {
  if (!has_run_op()) return false;
  return table_->supports_op(ctx_, dev, op_type, domain, opset, input_dtypes.data(),
                             static_cast<std::int64_t>(input_dtypes.size())) != 0;
}

bool Backend::supports_op_type(int dev, const char* op_type, const char* domain,
                               std::int64_t opset) const {
  if (!has_run_op()) return false;
  return table_->supports_op(ctx_, dev, op_type, domain, opset, nullptr, 0) != 0;
}

Status Backend::run_op(hp_stream* s, const hp_op_desc& d) const {
  if (!has_run_op())
    return Error(Errc::not_implemented,
                 fmt::format("{} plugin implements ABI {}.{}, run_op needs 1.2", name(),
                             table_->abi_major, table_->abi_minor));
  return take(table_->run_op(ctx_, s, &d), d.op_type ? d.op_type : "run_op");
}

bool Backend::has_mem_stats() const {
  return HP_HAS_MEMBER(table_, hp_backend_v1, mem_stats) && table_->mem_stats != nullptr;
}

Expected<MemStats> Backend::mem_stats(int dev, bool reset_peak) const {
  if (!has_mem_stats())
    return Error(Errc::not_implemented,
                 fmt::format("{} plugin implements ABI {}.{}, mem_stats needs 1.3", name(),
                             table_->abi_major, table_->abi_minor));
  hp_mem_stats m{};
  m.struct_size = sizeof m;
  HP_TRY(take(table_->mem_stats(ctx_, dev, reset_peak ? 1 : 0, &m), "mem_stats"));
  return MemStats{m.in_use, m.peak, m.limit, m.allocs, m.refused};
}

Expected<bool> Backend::event_query(hp_event* e) const {
  if (!has_event_query())
    return Error(Errc::not_implemented,
                 fmt::format("{} plugin implements ABI {}.{}, event_query needs 1.1", name(),
                             table_->abi_major, table_->abi_minor));
  int32_t done = 0;
  HP_TRY(take(table_->event_query(ctx_, e, &done), "event_query"));
  return done != 0;
}

Status Backend::copy_async(hp_stream* s, void* dst, const void* src, std::size_t bytes,
                           hp_copy_dir dir) const {
  return take(table_->copy_async(ctx_, s, dst, src, bytes, dir), "copy_async");
}

Status Backend::gemm(hp_stream* s, const hp_gemm_desc& d) const {
  hp_gemm_desc copy = d;
  copy.struct_size = sizeof copy;
  return take(table_->gemm(ctx_, s, &copy), "gemm");
}

Status Backend::elementwise(hp_stream* s, const hp_elementwise_desc& d) const {
  hp_elementwise_desc copy = d;
  copy.struct_size = sizeof copy;
  return take(table_->elementwise(ctx_, s, &copy), "elementwise");
}

}  // namespace hp::plugin
