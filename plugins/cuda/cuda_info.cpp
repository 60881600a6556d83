// Peak figures of NVIDIA GPUs. cudart reports SM count and clocks but not FLOP/s, so known
// data-centre parts come from NVIDIA's datasheets (dense, no sparsity), tagged "table":
//   A100 SXM (sm_80): FP32 19.5 TF, TF32 156 TF, FP16/BF16 312 TF, FP64 9.7 TF; HBM2e 1.555 TB/s
//   (40 GB)
//                     or 2.039 TB/s (80 GB)            -- NVIDIA A100 datasheet
//   H100 SXM (sm_90): FP32 67 TF, FP16/BF16 989 TF, FP64 34 TF, FP8 1979 TF; HBM3 3.35 TB/s
//   H200 (sm_90):     compute as H100 SXM; HBM3e 4.8 TB/s (141 GB) -- NVIDIA H200 datasheet
//   GH200 (sm_90):    compute as H100 SXM; HBM3 4.0 TB/s (96 GB) -- NVIDIA GH200 datasheet
// (the PCIe H100 is lower: 51 TF FP32, 756 TF BF16, 2.0 TB/s). Anything else gets an estimate from
// the attributes, also tagged "table" with a note: FP32 = SMs x clock x FP32 lanes per SM x 2,
// memory bandwidth = memory clock x 2 (DDR) x bus width / 8. Host links (PCIe / NVLink-C2C) are not
// estimated.
#include <cstring>
#include <string>

#include "cuda_internal.h"

namespace hp_cuda {
namespace {

struct GpuRow {
  const char* name_part;  // substring of cudaDeviceProp::name
  double f32, f16, f64, f8, mem_Bps;
  const char* note;
};

constexpr GpuRow kGpus[] = {
    {"GH200", 67e12, 989e12, 34e12, 1979e12, 4.0e12, "NVIDIA GH200 datasheet (dense)"},
    {"H200", 67e12, 989e12, 34e12, 1979e12, 4.8e12, "NVIDIA H200 SXM datasheet (dense)"},
    {"H100 PCIe", 51e12, 756e12, 26e12, 1513e12, 2.0e12, "NVIDIA H100 PCIe datasheet (dense)"},
    {"H100", 67e12, 989e12, 34e12, 1979e12, 3.35e12, "NVIDIA H100 SXM datasheet (dense)"},
    {"A100-SXM4-80GB", 19.5e12, 312e12, 9.7e12, 0, 2.039e12, "NVIDIA A100 80GB datasheet (dense)"},
    {"A100", 19.5e12, 312e12, 9.7e12, 0, 1.555e12, "NVIDIA A100 40GB datasheet (dense)"},
};

int fp32_lanes_per_sm(int major, int minor) {
  if (major == 8 && minor == 0) return 64;
  if (major >= 8) return 128;  // sm_86/89/90/100/120
  return 64;
}

int attribute(cudaDeviceAttr attr, int dev) {
  int v = 0;
  return cudaDeviceGetAttribute(&v, attr, dev) == cudaSuccess ? v : 0;
}

}  // namespace

void fill_figures(int dev, const cudaDeviceProp& prop, hp_device_info& d) {
  double clock_khz = attribute(cudaDevAttrClockRate, dev);
  d.clock_hz = clock_khz * 1e3;
  for (const auto& row : kGpus) {
    if (!std::strstr(prop.name, row.name_part)) continue;
    d.peak_flops[HP_F32] = row.f32;
    d.peak_flops[HP_F16] = d.peak_flops[HP_BF16] = row.f16;
    d.peak_flops[HP_F64] = row.f64;
    d.peak_flops[HP_F8] = row.f8;
    for (int t : {HP_F32, HP_F16, HP_BF16, HP_F64, HP_F8})
      if (d.peak_flops[t] > 0) d.flops_prov[t] = HP_PROV_TABLE;
    d.mem_Bps = row.mem_Bps;
    d.mem_prov = HP_PROV_TABLE;
    hp_common::set_str(d.note, sizeof d.note, row.note);
    return;
  }
  int lanes = fp32_lanes_per_sm(prop.major, prop.minor);
  if (d.clock_hz > 0) {
    d.peak_flops[HP_F32] = double(prop.multiProcessorCount) * d.clock_hz * lanes * 2.0;
    d.flops_prov[HP_F32] = HP_PROV_TABLE;
  }
  double mem_khz = attribute(cudaDevAttrMemoryClockRate, dev);
  if (mem_khz > 0 && prop.memoryBusWidth > 0) {
    d.mem_Bps = mem_khz * 1e3 * 2.0 * prop.memoryBusWidth / 8.0;
    d.mem_prov = HP_PROV_TABLE;
  }
  hp_common::set_str(d.note, sizeof d.note,
                     "estimated from SM count, clocks and bus width; not in hp's datasheet table");
}

}  // namespace hp_cuda
