// Fake libascendcl.so: devices, memory, streams, events and copies (see fake_acl.h).
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "fake_acl.h"

namespace {

std::mutex g_mu;                         // guards allocations and the error message
std::map<uintptr_t, uint64_t> g_device;  // device allocations: start -> size
std::string g_error;
bool g_initialised = false;
thread_local int32_t t_device = -1;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

aclError fail(const std::string& message) {
  fake_acl::set_error("fake acl: " + message);
  return ACL_ERROR_INVALID_PARAM;
}

void delay() {
  if (int us = env_int("HP_FAKE_ACL_DELAY_US", 0); us > 0)
    std::this_thread::sleep_for(std::chrono::microseconds(us));
}

/// An in-order queue executed by its own thread.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool busy = false, stop = false;
  std::thread worker;

  Stream() : worker([this] { loop(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [this] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      auto fn = std::move(queue.front());
      queue.pop_front();
      busy = true;
      lock.unlock();
      delay();
      fn();
      lock.lock();
      busy = false;
      cv.notify_all();
    }
  }
  void sync() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return queue.empty() && !busy; });
  }
};

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;
  void wait_for(uint64_t gen) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= gen; });
  }
};

bool is_device(const void* p) { return fake_acl::is_device_range(p, 1); }

}  // namespace

namespace fake_acl {

bool enqueue(aclrtStream stream, std::function<void()> fn) {
  auto* s = static_cast<Stream*>(stream);
  if (!s) return false;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->queue.push_back(std::move(fn));
  }
  s->cv.notify_all();
  return true;
}

bool is_device_range(const void* p, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = g_device.upper_bound(addr);
  if (it == g_device.begin()) return false;
  --it;
  return addr >= it->first && addr + bytes <= it->first + it->second;
}

void set_error(const std::string& message) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_error = message;
}

}  // namespace fake_acl

extern "C" {

FAKE_ACL_EXPORT aclError aclInit(const char*) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_initialised) return ACL_ERROR_REPEAT_INITIALIZE;
  g_initialised = true;
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtGetDeviceCount(uint32_t* count) {
  if (env_int("HP_FAKE_ACL_FAIL_COUNT", 0)) {
    fake_acl::set_error("fake acl: drvGetDevNum failed, no npu driver loaded");
    return 507033;
  }
  *count = uint32_t(env_int("HP_FAKE_ACL_DEVICES", 1));
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtSetDevice(int32_t id) {
  if (id < 0 || id >= env_int("HP_FAKE_ACL_DEVICES", 1))
    return fail("aclrtSetDevice: no device " + std::to_string(id));
  t_device = id;
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtResetDevice(int32_t) { return ACL_SUCCESS; }
FAKE_ACL_EXPORT aclError aclrtSynchronizeDevice(void) { return ACL_SUCCESS; }

FAKE_ACL_EXPORT aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free_bytes, size_t* total) {
  if (t_device < 0) return fail("aclrtGetMemInfo: no current device (call aclrtSetDevice)");
  if (attr != ACL_HBM_MEM) return fail("aclrtGetMemInfo: fake has only HBM");
  std::lock_guard<std::mutex> lock(g_mu);
  uint64_t used = 0;
  for (const auto& [p, n] : g_device) used += n;
  *total = size_t(64) << 30;
  *free_bytes = *total - used;
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT const char* aclrtGetSocName(void) {
  const char* soc = std::getenv("HP_FAKE_ACL_SOC");
  return soc && *soc ? soc : "Ascend910B3";
}

FAKE_ACL_EXPORT const char* aclGetRecentErrMsg(void) {
  static thread_local std::string copy;
  std::lock_guard<std::mutex> lock(g_mu);
  copy = g_error;
  return copy.c_str();
}

FAKE_ACL_EXPORT aclError aclrtMalloc(void** p, size_t size, aclrtMemMallocPolicy) {
  if (t_device < 0) return fail("aclrtMalloc: no current device");
  if (size == 0) return fail("aclrtMalloc: size 0");
  if (const int limit = env_int("HP_FAKE_ACL_HBM_LIMIT", 0);
      limit > 0) {  // a small device, for OOM paths
    std::lock_guard<std::mutex> lock(g_mu);
    uint64_t used = 0;
    for (const auto& [start, bytes] : g_device) used += bytes;
    if (used + size > uint64_t(limit)) {
      g_error = "fake acl: aclrtMalloc: out of device memory";
      return 207001;  // ACL_ERROR_RT_MEMORY_ALLOCATION
    }
  }
  *p = std::aligned_alloc(64, (size + 63) / 64 * 64);
  if (!*p) return fail("aclrtMalloc: out of memory");
  std::lock_guard<std::mutex> lock(g_mu);
  g_device[reinterpret_cast<uintptr_t>(*p)] = size;
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtFree(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_device.erase(reinterpret_cast<uintptr_t>(p)) == 0) {
      g_error = "fake acl: aclrtFree: not a device allocation";
      return ACL_ERROR_INVALID_PARAM;
    }
  }
  std::free(p);
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtMallocHost(void** p, size_t size) {
  *p = std::malloc(size ? size : 1);
  return *p ? ACL_SUCCESS : fail("aclrtMallocHost: out of memory");
}

FAKE_ACL_EXPORT aclError aclrtFreeHost(void* p) {
  std::free(p);
  return ACL_SUCCESS;
}

static aclError check_copy(void* dst, size_t dest_max, const void* src, size_t count,
                           aclrtMemcpyKind kind) {
  if (count > dest_max) return fail("memcpy: count exceeds destMax");
  bool dst_dev = kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  bool src_dev = kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  if (dst_dev != is_device(dst) || (dst_dev && !fake_acl::is_device_range(dst, count)))
    return fail("memcpy: destination does not match the copy kind " + std::to_string(kind));
  if (src_dev != is_device(src) || (src_dev && !fake_acl::is_device_range(src, count)))
    return fail("memcpy: source does not match the copy kind " + std::to_string(kind));
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtMemcpy(void* dst, size_t dest_max, const void* src, size_t count,
                                     aclrtMemcpyKind kind) {
  if (aclError err = check_copy(dst, dest_max, src, count, kind)) return err;
  std::memmove(dst, src, count);
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtMemcpyAsync(void* dst, size_t dest_max, const void* src, size_t count,
                                          aclrtMemcpyKind kind, aclrtStream stream) {
  if (aclError err = check_copy(dst, dest_max, src, count, kind)) return err;
  if (!fake_acl::enqueue(stream, [=] { std::memmove(dst, src, count); }))
    return fail("memcpy: null stream");
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtCreateStream(aclrtStream* stream) {
  if (t_device < 0) return fail("aclrtCreateStream: no current device");
  *stream = new Stream();
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtDestroyStream(aclrtStream stream) {
  delete static_cast<Stream*>(stream);
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtSynchronizeStream(aclrtStream stream) {
  if (!stream) return fail("aclrtSynchronizeStream: null stream");
  static_cast<Stream*>(stream)->sync();
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtCreateEvent(aclrtEvent* event) {
  *event = new Event();
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtDestroyEvent(aclrtEvent event) {
  delete static_cast<Event*>(event);
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
  auto* e = static_cast<Event*>(event);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    gen = ++e->recorded;
  }
  fake_acl::enqueue(stream, [e, gen] {
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->completed < gen) e->completed = gen;
    e->cv.notify_all();
  });
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
  auto* e = static_cast<Event*>(event);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    gen = e->recorded;
  }
  fake_acl::enqueue(stream, [e, gen] { e->wait_for(gen); });
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtSynchronizeEvent(aclrtEvent event) {
  auto* e = static_cast<Event*>(event);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    gen = e->recorded;
  }
  e->wait_for(gen);
  return ACL_SUCCESS;
}

FAKE_ACL_EXPORT aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus* status) {
  auto* e = static_cast<Event*>(event);
  std::lock_guard<std::mutex> lock(e->mu);
  *status = e->completed >= e->recorded ? ACL_EVENT_RECORDED_STATUS_COMPLETE
                                        : ACL_EVENT_RECORDED_STATUS_NOT_READY;
  return ACL_SUCCESS;
}

}  // extern "C"
