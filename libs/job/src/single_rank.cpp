// prepare_single_rank and stats_line (single_rank.h).
#include "single_rank.h"

#include <fmt/core.h>

#include "hp/exec/compare.h"

namespace hp::job {
using exec::bind_inputs;
using exec::ExecStats;
using exec::Executor;
using exec::open_backends;
using exec::read_tensor_dir;

Expected<SingleRank> prepare_single_rank(const std::filesystem::path& model_path,
                                         const std::filesystem::path& inputs,
                                         const std::string& backend, int threads,
                                         const std::vector<std::filesystem::path>& paths,
                                         const std::vector<std::string>& open_options,
                                         bool profile) {
  SingleRank p;
  HP_ASSIGN_OR_RETURN(auto b, open_backends(backend, threads, paths, open_options));
  p.backends = b;
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  auto m = model::load_model(model_path, lo);
  if (!m) return std::move(m).error();
  exec::ExecOptions eo{p.backends.primary, p.backends.cpu, nullptr};
  eo.profile = profile;
  auto ex = Executor::create(*m, eo);
  if (!ex) return std::move(ex).error();
  p.exec = std::move(*ex);
  auto given = read_tensor_dir(inputs, "input");
  if (!given) return std::move(given).error();
  auto bound = bind_inputs(p.exec->inputs(), std::move(*given), inputs.string());
  if (!bound) return std::move(bound).error();
  p.inputs = std::move(*bound);
  return p;
}

nlohmann::ordered_json outputs_json(const std::vector<exec::HostTensor>& outs) {
  auto a = nlohmann::ordered_json::array();
  for (const auto& t : outs) {
    const exec::TensorSummary s = exec::summarize_tensor(t);
    nlohmann::ordered_json o{{"name", s.name}, {"dtype", s.dtype}, {"shape", s.dims}};
    if (s.counted > 0) {
      o["min"] = s.min;
      o["max"] = s.max;
      o["mean"] = s.mean;
    }
    o["nan"] = s.nans;
    o["first"] = s.first;
    a.push_back(std::move(o));
  }
  return a;
}

std::string stats_line(const ExecStats& s, const std::string& backend) {
  return fmt::format(
      "ran {} nodes on {} ({} on the cpu fallback) in {:.3f} s; peak tensor memory {:.2f} MiB "
      "(weights {:.2f} MiB)\n",
      s.nodes, backend, s.nodes_on_fallback, s.seconds,
      static_cast<double>(s.peak_bytes) / (1 << 20),
      static_cast<double>(s.weight_bytes) / (1 << 20));
}

}  // namespace hp::job
