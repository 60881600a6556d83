// A thread's scratch buffer (cpu_conv.cpp, cpu_winograd.cpp): 64-byte aligned, grown on demand,
// kept for the thread's life.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace hp_cpu {

class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { std::free(p_); }

  /// At least `bytes`; null when the allocation fails (the buffer is then empty, and a later call
  /// tries again). For use inside an OpenMP region, which an exception must not leave.
  void* try_get(std::size_t bytes) {
    if (bytes > n_) {
      std::free(p_);
      const std::size_t want = (bytes + 63) / 64 * 64;
      p_ = std::aligned_alloc(64, want);
      n_ = p_ ? want : 0;
    }
    return p_;
  }
  /// The same, or std::bad_alloc (which the plugin's op entry reports as HP_NO_MEMORY).
  void* get(std::size_t bytes) {
    void* p = try_get(bytes);
    if (!p) throw std::bad_alloc();
    return p;
  }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace hp_cpu
