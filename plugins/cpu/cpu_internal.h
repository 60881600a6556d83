// Private declarations of the cpu backend, shared by its source files.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include <dnnl.hpp>

#include "cpu_conv.h"
#include "plugin_common.h"

constexpr const char* kCpu = "cpu";

namespace hp_cpu {

/// Everything that makes two matmuls the same oneDNN primitive.
using GemmKey = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, double, double, int, int, bool, bool, bool>;

/// What a fused matmul does to C after the product (cpu_gemm.cpp): add a bias of n values (one per
/// column, broadcast over rows and batch), then an activation, then a residual shaped like C.
enum class GemmAct { none = 0, relu = 1, gelu_erf = 2 };
struct GemmEpilogue {
  const float* bias = nullptr;
  GemmAct act = GemmAct::none;
  /// Nonzero: B is a weight that stays constant, so named by the executor (the node attribute
  /// hp_weight_b, libs/exec/src/exec_fuse.cpp): it is packed into the kernel's layout once
  /// (PackedWeights) instead of on every call.
  int64_t weight_id = 0;
  /// Added last (a oneDNN binary post-op): a tensor laid out as C, read in the product's epilogue
  /// instead of in a pass of its own (a transformer block's residual connection).
  const float* residual = nullptr;
};

/// A cached matmul and the scratchpad it needs per execution (user-managed: see cpu_gemm.cpp).
/// In bfloat16 (`a_cvt` set) A and B are converted first, into buffers of the descs a16 and b16.
/// With `b_pack` set, B is a constant weight in the primitive's own layout `b_packed`, reordered
/// (and converted) once into PackedWeights.
struct CachedGemm {
  std::shared_ptr<dnnl::matmul> prim;
  dnnl::memory::desc scratchpad;
  std::shared_ptr<dnnl::reorder> a_cvt, b_cvt, b_pack;
  dnnl::memory::desc a16, b16, b_packed;
  dnnl::memory::desc a_md, b_md, c_md, bias_md;  ///< the caller's float32 operands as described
  int residual_post_op = -1;  ///< index of the residual's binary post-op, -1 for none
};

/// Constant weights in a kernel's layout, by the executor's weight id and that layout. The copies
/// are kept for the process's life (an executor that has gone leaves its entries; ids are never
/// reused), up to kPackedWeightsLimit bytes: past it a weight is not packed and its product runs
/// on the weight as given (cpu_gemm.cpp), so a model larger than the budget never thrashes.
class PackedWeights {
 public:
  static constexpr std::size_t kPackedWeightsLimit = std::size_t{4} << 30;
  std::size_t limit = kPackedWeightsLimit;  ///< open option packed_weights_limit=BYTES
  /// The packed copy of weight `id`, read as `from` (a square weight is read both as itself and
  /// transposed, which pack into equal layouts), in layout `md`; made by `pack(buffer)` when
  /// missing; null when it would take the copies past the limit.
  template <class Pack>
  std::shared_ptr<std::vector<unsigned char>> get(int64_t id, const dnnl::memory::desc& from,
                                                  const dnnl::memory::desc& md, Pack&& pack) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& e : entries_[id])
        if (e.from == from && e.md == md) return e.buf;
      if (bytes_ + md.get_size() > limit) return nullptr;
      bytes_ += md.get_size();  // reserved now: threads packing at once stay under the limit
    }
    std::shared_ptr<std::vector<unsigned char>> buf;
    try {
      buf = std::make_shared<std::vector<unsigned char>>(md.get_size());
      pack(buf->data());
    } catch (...) {  // nothing kept: give the reservation back
      std::lock_guard<std::mutex> lock(mu_);
      bytes_ -= md.get_size();
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    entries_[id].push_back({from, md, buf});
    return buf;
  }

 private:
  std::mutex mu_;
  std::size_t bytes_ = 0;
  struct Entry {
    dnnl::memory::desc from, md;
    std::shared_ptr<std::vector<unsigned char>> buf;
  };
  std::map<int64_t, std::vector<Entry>> entries_;
};

/// oneDNN matmul primitives by shape; creation is costly (JIT). Execution from several threads at
/// once is safe because each execution brings its own scratchpad (cpu_gemm.cpp).
class GemmCache {
 public:
  CachedGemm get(const dnnl::engine& eng, const hp_gemm_desc& d, bool bias = false,
                 GemmAct act = GemmAct::none, bool bf16 = false, bool packed_b = false,
                 bool residual = false);
  std::size_t size();

 private:
  std::mutex mu_;
  std::map<GemmKey, CachedGemm> cache_;
};

/// oneDNN softmax / log-softmax primitives over rows (cpu_softmax.cpp), by (rows, len, log).
class SoftmaxCache {
 public:
  /// Runs y = softmax(x) along rows of `len` floats; false when oneDNN rejects the shape.
  bool run(const dnnl::engine& eng, dnnl::stream& s, const float* x, float* y, int64_t rows,
           int64_t len, bool log);

 private:
  struct Entry {
    std::shared_ptr<dnnl::primitive> prim;
    dnnl::memory::desc md, scratchpad;
  };
  std::mutex mu_;
  std::map<std::tuple<int64_t, int64_t, bool>, Entry> cache_;
};

}  // namespace hp_cpu

/// Device-memory accounting (ABI 1.3 mem_stats). "Device" memory is host memory here, so without a
/// budget it only counts; with "device_budget=BYTES" it is an arena of that size: an allocation
/// that would take in_use past the limit is refused (HP_NO_MEMORY), as a device of that size would.
struct CpuArena {
  std::atomic<std::uint64_t> in_use{0}, peak{0}, allocs{0}, refused{0};
  std::uint64_t limit = 0;  ///< 0 = no budget; set once at open
};

struct hp_ctx {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  hp_cpu::GemmCache gemms;
  hp_cpu::ConvCache convs;
  hp_cpu::SoftmaxCache softmaxes;
  hp_cpu::PackedWeights packed;
  bool bf16 = false;  ///< "compute=bf16": float32 MatMul/Gemm/Conv in bfloat16 (cpu_plugin.cpp)
  CpuArena arena;
};

/// The cpu backend executes synchronously: each call has finished when it returns, so a stream is
/// only the oneDNN stream that kernels are submitted to, and in-order semantics hold trivially.
struct hp_stream {
  explicit hp_stream(const dnnl::engine& e) : dnnl_stream(e) {}
  dnnl::stream dnnl_stream;
};

/// Events complete when recorded (the work before them has already run).
struct hp_event {
  std::atomic<int> recorded{0};
};

namespace hp_cpu {

hp_status* device_info(hp_ctx* ctx, int32_t dev, hp_device_info* out);
hp_status* gemm(hp_ctx* ctx, hp_stream* s, const hp_gemm_desc* desc);
hp_status* elementwise(hp_ctx* ctx, hp_stream* s, const hp_elementwise_desc* desc);
/// gemm with a bias and activation applied to C in the same oneDNN primitive (post-ops), float32
/// only; beta must be 0.
hp_status* gemm_fused(hp_ctx* ctx, hp_stream* s, const hp_gemm_desc& d, const GemmEpilogue& e);
/// Plain-loop GEMM used when oneDNN rejects a descriptor (e.g. unusual strides).
void reference_gemm(const hp_gemm_desc& d);

}  // namespace hp_cpu
