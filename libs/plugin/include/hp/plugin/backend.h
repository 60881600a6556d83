// hp::plugin::Backend: the host-side view of one opened plugin. It wraps the C table of
// hp_plugin.h: every call turns an hp_status* into an hp::Error (freeing the status through the
// table), and every member added after ABI 1.0 is gated on the table's struct_size, so an older
// plugin simply reports "unsupported" for what it does not have.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hp/core/dtype.h"
#include "hp/core/expected.h"
#include "hp/plugin/hp_plugin.h"

namespace hp::plugin {

/// One figure with where it came from.
struct Figure {
  double value = 0;
  hp_prov prov = HP_PROV_UNKNOWN;
};

/// hp_device_info in C++ terms.
struct DeviceInfo {
  int index = 0;
  std::string name, arch, bus_id, note;
  hp_device_kind kind = HP_DEVICE_CPU;
  int numa_node = -1;
  std::uint64_t mem_total = 0, mem_free = 0;
  int compute_units = 0;
  double clock_hz = 0;
  std::array<Figure, HP_DTYPE_COUNT> peak_flops{};  ///< indexed by hp_dtype
  Figure mem_bw, h2d_bw, d2h_bw, peer_bw;           ///< bytes/s
  std::uint64_t caps = 0;
};

/// hp_mem_stats in C++ terms (1.3).
struct MemStats {
  std::uint64_t in_use = 0, peak = 0;
  std::uint64_t limit = 0;  ///< enforced device budget; 0 = none
  std::uint64_t allocs = 0, refused = 0;
};

/// The core DType of an hp_dtype (the same numbering, HP_F32 .. HP_U64); nullopt outside it.
std::optional<DType> to_dtype(int hp_dtype);
/// The hp_dtype of a DType; -1 for the types the plugin ABI has no code for (i16, u16, u32, u64,
/// c64, c128, tf32).
int to_hp_dtype(DType t);
const char* dtype_name(
    int dtype);  ///< hp::dtype_name of the hp_dtype ("f32", "bf16", ...), "?" outside
const char* prov_name(hp_prov p);         ///< "measured", "table", "unknown"
const char* kind_name(hp_device_kind k);  ///< "cpu", "gpu", "npu"
const char* code_name(hp_code c);         ///< "unavailable", "version", ...

/// Maps a plugin status code onto the host's error codes.
Errc errc_for(hp_code c);

class Backend {
 public:
  /// Takes an opened context; `table` and the library stay valid for the life of the process.
  Backend(const hp_backend_v1* table, hp_ctx* ctx, std::string path);
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const hp_backend_v1* table() const { return table_; }
  hp_ctx* ctx() const { return ctx_; }
  std::string name() const { return table_->name ? table_->name : "?"; }
  const std::string& path() const { return path_; }
  /// True when the table has the 1.1 member `event_query` / `mem_info`.
  bool has_event_query() const;
  bool has_mem_info() const;
  /// True when the table has the 1.2 members supports_op and run_op (both set).
  bool has_run_op() const;

  Expected<int> device_count() const;
  Expected<DeviceInfo> device_info(int dev) const;
  bool supports(int dev, int op, int dtype) const;

  Expected<void*> alloc(int dev, std::size_t bytes, int kind = HP_MEM_DEVICE) const;
  Status free_mem(int dev, void* p, int kind = HP_MEM_DEVICE) const;
  Expected<hp_stream*> stream_create(int dev) const;
  Status stream_sync(hp_stream* s) const;
  Status stream_destroy(hp_stream* s) const;
  Expected<hp_event*> event_create(int dev) const;
  Status event_record(hp_event* e, hp_stream* s) const;
  Status stream_wait_event(hp_stream* s, hp_event* e) const;
  Status event_sync(hp_event* e) const;
  Status event_destroy(hp_event* e) const;
  /// 1.1: whether `e` has completed; "unsupported" error on a 1.0 plugin.
  Expected<bool> event_query(hp_event* e) const;
  Status copy_async(hp_stream* s, void* dst, const void* src, std::size_t bytes,
                    hp_copy_dir dir) const;
  Status gemm(hp_stream* s, const hp_gemm_desc& d) const;
  Status elementwise(hp_stream* s, const hp_elementwise_desc& d) const;
  /// 1.2: whether ONNX op `op_type` runs on `dev` with these input dtypes; false on an older
  /// plugin.
  bool supports_op(int dev, const char* op_type, const char* domain, std::int64_t opset,
                   const std::vector<std::int32_t>& input_dtypes) const;
  /// 1.2: whether the op type is implemented at all (for some dtypes); false on an older plugin.
  bool supports_op_type(int dev, const char* op_type, const char* domain, std::int64_t opset) const;
  /// 1.2: runs one ONNX node; not_implemented on an older plugin.
  Status run_op(hp_stream* s, const hp_op_desc& d) const;
  /// True when the table has the 1.3 member mem_stats (set).
  bool has_mem_stats() const;
  /// 1.3: device-memory accounting (in use, peak, enforced budget); not_implemented on an older
  /// plugin. With `reset_peak` the peak restarts from what is in use after this read.
  Expected<MemStats> mem_stats(int dev, bool reset_peak = false) const;

  /// Converts (and frees) a status returned by this plugin; NULL gives success.
  Status take(hp_status* st, const char* call) const;

 private:
  const hp_backend_v1* table_;
  hp_ctx* ctx_;
  std::string path_;
};

/// Converts and frees `st` using `table`'s status functions (for use before a Backend exists).
Status take_status(const hp_backend_v1* table, hp_status* st, const std::string& context);

}  // namespace hp::plugin
