// Plumbing for the backend conformance suite: which backends to test, device buffers filled and
// read back through the backend's own copies, random data, and the comparison rule.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hp/plugin/registry.h"

namespace conformance {

using hp::plugin::Backend;

/// Discovery once per process: the build tree's plugins, with the ascend plugin pointed at the fake
/// CANN runtime of tests/fakes/ascend (unless HP_CONFORMANCE_REAL_ASCEND=1 on a machine with CANN).
inline const hp::plugin::Registry& registry() {
  static const hp::plugin::Registry reg = [] {
    if (!std::getenv("HP_CONFORMANCE_REAL_ASCEND")) ::setenv("HP_ASCEND_LIB", HP_FAKE_ACL_LIB, 1);
    hp::plugin::SearchOptions o;
    o.use_env = o.use_install_dir = false;
    auto r = hp::plugin::discover(o);
    REQUIRE(r.ok());
    return std::move(r).value();
  }();
  return reg;
}

/// The backend under test, or nullptr after printing why it is skipped.
inline std::shared_ptr<Backend> backend_or_skip(const std::string& name) {
  auto b = registry().find(name);
  if (!b) {
    const auto* rec = registry().record(name);
    WARN(name << " conformance skipped: " << (rec ? rec->reason : std::string("plugin not built")));
  }
  return b;
}

inline void require_ok(const hp::Status& s) {
  INFO((s.ok() ? std::string() : s.error().str()));
  REQUIRE(s.ok());
}

template <class T>
T require_ok(hp::Expected<T> e) {
  INFO((e.ok() ? std::string() : e.error().str()));
  REQUIRE(e.ok());
  return std::move(e).value();
}

/// A device allocation of floats, freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(const Backend& b, std::size_t n, int kind = HP_MEM_DEVICE)
      : b_(b), n_(n), kind_(kind) {
    p_ = require_ok(b.alloc(0, n * sizeof(float), kind));
  }
  ~DeviceBuffer() { (void)b_.free_mem(0, p_, kind_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* get() const { return static_cast<float*>(p_); }
  std::size_t size() const { return n_; }

 private:
  const Backend& b_;
  void* p_ = nullptr;
  std::size_t n_;
  int kind_;
};

/// Owns a stream on device 0.
class Stream {
 public:
  explicit Stream(const Backend& b) : b_(b) { s_ = require_ok(b.stream_create(0)); }
  ~Stream() { (void)b_.stream_destroy(s_); }
  hp_stream* get() const { return s_; }

 private:
  const Backend& b_;
  hp_stream* s_;
};

inline void upload(const Backend& b, hp_stream* s, const DeviceBuffer& dst,
                   const std::vector<float>& src) {
  require_ok(b.copy_async(s, dst.get(), src.data(), src.size() * sizeof(float), HP_H2D));
  require_ok(b.stream_sync(s));
}

inline std::vector<float> download(const Backend& b, hp_stream* s, const DeviceBuffer& src) {
  std::vector<float> out(src.size());
  require_ok(b.copy_async(s, out.data(), src.get(), out.size() * sizeof(float), HP_D2H));
  require_ok(b.stream_sync(s));
  return out;
}

inline std::vector<float> random_floats(std::size_t n, unsigned seed, float lo = -2.0f,
                                        float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// max |got - want| relative to max(1, max |want|): tolerant to accumulation order and to reduced-
/// precision matrix units (HF32 on Ascend, TF32 on NVIDIA).
inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double max_diff = 0, max_ref = 1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - double(want[i])));
    max_ref = std::max(max_ref, std::fabs(double(want[i])));
  }
  return max_diff / max_ref;
}

constexpr double kTolerance = 2e-3;

}  // namespace conformance
