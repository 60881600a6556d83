// What the cpu backend says about its one device. Nothing here is measured: core count and clock
// come from /proc/cpuinfo (sysconf as a fallback), memory from /proc/meminfo, and the peak FLOP/s
// is the usual back-of-envelope estimate
//     physical cores x clock x SIMD lanes (f32) x 2 (FMA = 2 FLOPs) x 2 (FMA ports per core)
// which is tagged "table" (derived from specs, not measured). The two-ports assumption holds for
// recent Intel and AMD server cores; the note field says so, so nobody mistakes it for a benchmark.
// Memory bandwidth is left "unknown": `hp offload-profile --measure` is the way to learn it.
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "cpu_internal.h"

namespace hp_cpu {
namespace {

struct CpuFacts {
  std::string model = "cpu";
  std::string flags;
  double mhz = 0;
  int physical_cores = 0;
  int logical_cores = 0;
};

std::string value_of(const std::string& line) {
  auto colon = line.find(':');
  if (colon == std::string::npos) return {};
  auto start = line.find_first_not_of(" \t", colon + 1);
  return start == std::string::npos ? std::string() : line.substr(start);
}

CpuFacts read_cpuinfo() {
  CpuFacts f;
  std::ifstream in("/proc/cpuinfo");
  std::string line, physical_id = "0";
  std::set<std::pair<std::string, std::string>> cores;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0)
      f.model = value_of(line);
    else if (line.rfind("cpu MHz", 0) == 0 && f.mhz == 0)
      f.mhz = std::atof(value_of(line).c_str());
    else if (line.rfind("flags", 0) == 0 && f.flags.empty())
      f.flags = " " + value_of(line) + " ";
    else if (line.rfind("physical id", 0) == 0)
      physical_id = value_of(line);
    else if (line.rfind("core id", 0) == 0)
      cores.emplace(physical_id, value_of(line));
    else if (line.rfind("processor", 0) == 0)
      ++f.logical_cores;
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (f.logical_cores == 0) f.logical_cores = online > 0 ? int(online) : 1;
  f.physical_cores = cores.empty() ? f.logical_cores : int(cores.size());
  return f;
}

/// MemTotal / MemAvailable in bytes from /proc/meminfo, falling back to sysconf.
std::pair<uint64_t, uint64_t> read_meminfo() {
  uint64_t total = 0, avail = 0;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemTotal:") total = kib * 1024;
    if (key == "MemAvailable:") avail = kib * 1024;
  }
  if (total == 0) total = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  if (avail == 0) avail = uint64_t(sysconf(_SC_AVPHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  return {total, avail};
}

bool has_flag(const CpuFacts& f, const char* flag) {
  return f.flags.find(std::string(" ") + flag + " ") != std::string::npos;
}

}  // namespace

hp_status* device_info(hp_ctx* ctx, int32_t dev, hp_device_info* out) {
  if (dev != 0 || !out)
    return hp_common::make_status(HP_INVALID, "cpu: device_info: no device %d", dev);
  CpuFacts f = read_cpuinfo();
  auto [total, avail] = read_meminfo();
  hp_device_info d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  hp_common::set_str(d.name, sizeof d.name, f.model);
  int lanes = 4;
  std::string isa = "sse";
  if (has_flag(f, "avx512f"))
    lanes = 16, isa = "avx512";
  else if (has_flag(f, "avx2") && has_flag(f, "fma"))
    lanes = 8, isa = "avx2";
  else if (has_flag(f, "asimd"))
    lanes = 4, isa = "neon";
#if defined(__x86_64__)
  hp_common::set_str(d.arch, sizeof d.arch, "x86_64 " + isa);
#elif defined(__aarch64__)
  hp_common::set_str(d.arch, sizeof d.arch, "aarch64 " + isa);
#else
  hp_common::set_str(d.arch, sizeof d.arch, isa);
#endif
  d.kind = HP_DEVICE_CPU;
  d.numa_node = -1;
  d.mem_total = total;
  d.mem_free = avail;
  // With a device budget the "device" is an arena of that size (cpu_plugin.cpp).
  if (ctx && ctx->arena.limit > 0) {
    const std::uint64_t used = ctx->arena.in_use.load();
    d.mem_total = ctx->arena.limit;
    d.mem_free = used >= ctx->arena.limit ? 0 : ctx->arena.limit - used;
  }
  d.compute_units = f.physical_cores;
  d.clock_hz = f.mhz * 1e6;
  if (d.clock_hz > 0) {
    double f32 = double(f.physical_cores) * d.clock_hz * lanes * 2.0 * 2.0;
    d.peak_flops[HP_F32] = f32;
    d.flops_prov[HP_F32] = HP_PROV_TABLE;
    d.peak_flops[HP_F64] = f32 / 2;
    d.flops_prov[HP_F64] = HP_PROV_TABLE;
  }
  d.caps = HP_CAP_EVENTS | HP_CAP_PINNED_HOST | HP_CAP_HOST_VISIBLE;
  std::ostringstream note;
  note << "peak estimated: " << f.physical_cores << " cores x " << f.mhz << " MHz x " << lanes
       << " f32 lanes x 2 fma x 2 ports; bandwidths not measured";
  hp_common::set_str(d.note, sizeof d.note, note.str());
  hp_common::copy_out(out, d);
  return nullptr;
}

}  // namespace hp_cpu
