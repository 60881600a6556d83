// Peak figures of Ascend devices by SoC name (aclrtGetSocName), per device as ACL enumerates them.
// ACL exposes no FLOP/s or bandwidth query, so these come from published figures and are tagged
// "table"; `hp offload-profile --measure` replaces bandwidths with measurements. Where no figure we
// could cite exists the value stays "unknown" rather than guessed.
//
// Sources:
//  - Ascend 910C ("Ascend910_93xx"): Huawei, "Serving Large Language Models on Huawei
//  CloudMatrix384"
//    (arXiv:2506.12708, section 3): each die sustains ~376 TFLOPS dense BF16/FP16 (752 per
//    package), has 64 GB HBM at 1.6 TB/s (3.2 TB/s, 128 GB per package), and each NPU package gets
//    up to 392 GB/s unidirectional UB bandwidth (196 GB/s per die when split evenly). CANN
//    enumerates each 910C die as one device, so the per-die figures apply.
//  - Ascend 910B ("Ascend910B1".."Ascend910B4"): 313 TFLOPS FP16 is the figure commonly quoted for
//    the 910B3 (Atlas 800T A2 material); 64 GB HBM. No authoritative HBM or host-link bandwidth was
//    found (docs/offload.md, "Bandwidth figures"), so those stay unknown.
#include <cstring>

#include "ascend_internal.h"

namespace hp_ascend {
namespace {

struct SocRow {
  const char* prefix;  // matched against the start of aclrtGetSocName()
  double f16_flops;    // also BF16
  double mem_Bps;
  double peer_Bps;
  int32_t ai_cores;  // cube cores per device
  const char* note;
};

constexpr SocRow kSocs[] = {
    {"Ascend910_93", 376e12, 1.6e12, 196e9, 24,
     "910C die: arXiv:2506.12708 (CloudMatrix384) figures; bandwidth to host not published"},
    {"Ascend910B", 313e12, 0, 0, 0,
     "910B: 313 TFLOPS FP16 as quoted for 910B3; HBM/host bandwidth unknown, measure them"},
};

}  // namespace

void fill_soc_figures(const std::string& soc, hp_device_info& d) {
  for (const auto& row : kSocs) {
    if (soc.rfind(row.prefix, 0) != 0) continue;
    d.peak_flops[HP_F16] = d.peak_flops[HP_BF16] = row.f16_flops;
    d.flops_prov[HP_F16] = d.flops_prov[HP_BF16] = HP_PROV_TABLE;
    if (row.mem_Bps > 0) d.mem_Bps = row.mem_Bps, d.mem_prov = HP_PROV_TABLE;
    if (row.peer_Bps > 0) d.peer_Bps = row.peer_Bps, d.peer_prov = HP_PROV_TABLE;
    if (row.ai_cores > 0) d.compute_units = row.ai_cores;
    hp_common::set_str(d.note, sizeof d.note, row.note);
    return;
  }
  hp_common::set_str(d.note, sizeof d.note, "soc '" + soc + "' not in hp's table; figures unknown");
}

}  // namespace hp_ascend
