// Collecting the whole model of a pipeline run on its lead (pipeline_run.h), for --save-model and
// for a checkpoint written in one piece (a transport of one rank; every other run's checkpoints are
// sharded, each rank writing its own pieces: sharded_run.h).
#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <array>
#include <map>

#include "pipeline_run.h"

namespace hp::train::detail {

namespace {

constexpr int kGatherTag = 32000;  // above every step tag (pipeline_tags.h)

// Sends one f32 tensor's bytes to `peer`, whose receiver knows its size.
Status send_all(comm::Transport& t, int peer, const std::vector<exec::HostTensor>& ts) {
  for (const auto& x : ts)
    HP_TRY(t.send(peer, kGatherTag, x.data.data(), static_cast<std::int64_t>(x.data.size())));
  return {};
}

}  // namespace

// Collective over the pipeline: the whole model's parameters and optimizer state, on the lead, in
// the forward model's initializer order (what a one-rank run lists). The other stages send their
// parameters (not the shared ones an earlier stage owns) in their own order; the lead knows that
// order and the shapes from the stage models of its peers, which it learns from their names.
Expected<Checkpoint> PipeRun::gather() {
  Checkpoint c;
  const int me = o.pp.stage;
  // A sharded optimizer's state, whole on every replica of the stage first.
  HP_ASSIGN_OR_RETURN(OptimizerState whole, whole_state());
  // Tensor parallelism: whole tensors from the stage's members; the first member's pipeline
  // gathers the stages.
  HP_ASSIGN_OR_RETURN(auto values, this->values());
  if (tps) {
    HP_ASSIGN_OR_RETURN(values, tps->gather(values));
    HP_ASSIGN_OR_RETURN(whole.exp_avg, tps->gather(whole.exp_avg));
    HP_ASSIGN_OR_RETURN(whole.exp_avg_sq, tps->gather(whole.exp_avg_sq));
    if (o.tp.index() != 0) return c;
  }
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  if (eps) {  // every member's experts of the stage (collective over its expert group)
    HP_ASSIGN_OR_RETURN(values, eps->gather(values, forward));
    names.clear();
    for (const auto& v : values) names.push_back(v.name);
    HP_ASSIGN_OR_RETURN(whole.exp_avg, eps->gather(whole.exp_avg, forward));
    HP_ASSIGN_OR_RETURN(whole.exp_avg_sq, eps->gather(whole.exp_avg_sq, forward));
  }
  std::vector<exec::HostTensor> mine, avg, avg_sq;
  for (std::size_t k = 0; k < names.size(); ++k) {
    if (!stage->owns(names[k])) continue;
    mine.push_back(values[k]);
    if (k < whole.exp_avg.size()) avg.push_back(whole.exp_avg[k]);
    if (k < whole.exp_avg_sq.size()) avg_sq.push_back(whole.exp_avg_sq[k]);
  }
  if (me != 0) {
    const int lead_rank = o.pp.ranks[0];
    std::string names;
    for (const auto& p : mine) names += p.name + '\n';
    std::int64_t counts[2] = {static_cast<std::int64_t>(names.size()),
                              (avg.empty() ? 0 : 1) + (avg_sq.empty() ? 0 : 1)};
    HP_TRY(t().send(lead_rank, kGatherTag, counts, sizeof counts));
    HP_TRY(t().send(lead_rank, kGatherTag, names.data(), counts[0]));
    HP_TRY(send_all(t(), lead_rank, mine));
    HP_TRY(send_all(t(), lead_rank, avg));
    HP_TRY(send_all(t(), lead_rank, avg_sq));
    HP_TRY(t().flush());
    return c;
  }
  // The shapes of every initializer, from the forward model.
  std::map<std::string, exec::HostTensor> like;
  std::vector<std::string> order;
  for (const auto& init : forward.proto->graph().initializer()) {
    order.push_back(init.name());
    exec::HostTensor h;
    h.name = init.name();
    h.dtype = HP_F32;
    h.dims.assign(init.dims().begin(), init.dims().end());
    like[h.name] = std::move(h);
  }
  std::map<std::string, std::array<exec::HostTensor, 3>> all;
  for (std::size_t k = 0; k < mine.size(); ++k)
    all[mine[k].name] = {mine[k], k < avg.size() ? avg[k] : exec::HostTensor{},
                         k < avg_sq.size() ? avg_sq[k] : exec::HostTensor{}};
  for (std::size_t s = 1; s < o.pp.ranks.size(); ++s) {
    const int peer = o.pp.ranks[s];
    std::int64_t counts[2] = {};
    HP_TRY(t().recv(peer, kGatherTag, counts, sizeof counts));
    std::string names(static_cast<std::size_t>(counts[0]), '\0');
    HP_TRY(t().recv(peer, kGatherTag, names.data(), counts[0]));
    std::vector<std::string> list;
    for (std::size_t a = 0, b; (b = names.find('\n', a)) != std::string::npos; a = b + 1)
      list.push_back(names.substr(a, b - a));
    // Parameters, then exp_avg, then exp_avg_sq (counts[1]: how many state lists follow).
    for (std::int64_t which = 0; which < 1 + std::min<std::int64_t>(counts[1], 2); ++which)
      for (const auto& n : list) {
        auto it = like.find(n);
        if (it == like.end()) return Error(Errc::internal, "a stage trains an unknown tensor", n);
        exec::HostTensor h = it->second;
        h.data.resize(static_cast<std::size_t>(h.numel()) * sizeof(float));
        HP_TRY(t().recv(peer, kGatherTag, h.data.data(), static_cast<std::int64_t>(h.data.size())));
        all[n][static_cast<std::size_t>(which)] = std::move(h);
      }
  }
  for (const auto& n : order) {
    auto it = all.find(n);
    if (it == all.end()) continue;
    c.params.push_back(it->second[0]);
    if (!it->second[1].data.empty()) c.state.exp_avg.push_back(it->second[1]);
    if (!it->second[2].data.empty()) c.state.exp_avg_sq.push_back(it->second[2]);
  }
  c.step = state.step;
  c.state.step = state.step;
  c.seed = o.seed;
  c.optimizer = optimizer_name(o.optimizer.kind);
  return c;
}

}  // namespace hp::train::detail
