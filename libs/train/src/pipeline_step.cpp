// PipelineStage::run_step (pipeline_stage.h): one step's actions of a rank over the micro-batches.
//
// Each action runs one part of one of the rank's chunks on one micro-batch's tensors. What a chunk
// passes to the next virtual stage (activations forward, their gradients back) is sent to that
// stage's rank, or, when the rank holds that stage too (ZB-V's turn at the last rank, an
// interleaved pipeline of one rank per chunk), put straight into its tensors.
#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <set>

#include "batches.h"
#include "hp/plugin/hp_plugin.h"
#include "pipeline_stage.h"
#include "pipeline_tags.h"

namespace hp::train::detail {

namespace {

void scale_f32(exec::HostTensor& t, float s) {
  if (s == 1.0f || t.dtype != HP_F32) return;
  float* p = t.as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] *= s;
}

}  // namespace

Status PipelineStage::run_part(Chunk& c, Part& p, Env& env, float scale) {
  if (!p.ex) return {};
  std::vector<exec::HostTensor> in;
  // With the loss's gradient scaled in the graph (expert parallelism), what the part writes is
  // weighted already.
  const float out_scale = c.graph_scale ? 1.0f : scale;
  for (const auto& name : p.part.inputs) {
    if (name == kLossScaleInput) {  // the micro-batch's share of the group's label positions
      exec::HostTensor t;
      t.name = name;
      t.dtype = HP_F32;
      t.data.resize(sizeof(float));
      *t.as<float>() = static_cast<float>(static_cast<double>(scale) * share_);
      in.push_back(std::move(t));
      continue;
    }
    auto it = env.find(name);
    if (it == env.end())
      return Error(Errc::internal, "a stage part reads a tensor nothing gave it", name);
    in.push_back(it->second);
  }
  HP_ASSIGN_OR_RETURN(auto outs, p.ex->run(in));
  comm_seconds_ += exec::comm_seconds(p.ex->stats());
  for (std::size_t i = 0; i < outs.size() && i < p.part.outputs.size(); ++i) {
    const std::string& name = p.part.outputs[i];
    exec::HostTensor& t = outs[i];
    if (auto g = c.grad_index.find(name); g != c.grad_index.end()) {
      exec::HostTensor& acc = grads_[g->second];
      if (t.dtype != HP_F32 || t.data.size() != acc.data.size())
        return Error(Errc::internal, "a gradient part's shape differs from its parameter", name);
      float* a = acc.as<float>();
      const float* v = t.as<float>();
      for (std::int64_t e = 0; e < acc.numel(); ++e) a[e] += out_scale * v[e];
    } else if (name == c.gg.loss && !name.empty()) {
      loss_ +=
          static_cast<double>(scale) * (t.dtype == HP_F32 ? t.as<float>()[0] : t.as<double>()[0]);
    } else {
      if (std::find(c.gg.input_grad_outputs.begin(), c.gg.input_grad_outputs.end(), name) !=
          c.gg.input_grad_outputs.end())
        scale_f32(t, out_scale);
      t.name = name;
      env[name] = std::move(t);
    }
  }
  return {};
}

Status PipelineStage::run_action(const PipelineAction& a, std::vector<std::vector<Env>>& env,
                                 const std::vector<float>& scale) {
  const int vs = a.stage >= 0 ? a.stage : chunks_.front().stage;
  const int k = a.micro_batch, last = role_.stages() - 1, p = static_cast<int>(role_.ranks.size());
  Chunk* c = chunk(vs);
  if (!c || k < 0 || k >= static_cast<int>(scale.size()))
    return Error(Errc::internal,
                 fmt::format("a schedule action of virtual stage {}, micro-batch {}, that this "
                             "rank does not hold",
                             vs, k));
  auto env_of = [&](int stage) -> Env& {
    return env[static_cast<std::size_t>(chunk(stage) - chunks_.data())]
              [static_cast<std::size_t>(k)];
  };
  Env& e = env_of(vs);
  const float s = vs == last ? scale[static_cast<std::size_t>(k)] : 1.0f;
  const auto t0 = std::chrono::steady_clock::now();
  auto ready = t0;  // when the action's inputs had arrived: the wait before is bubble
  switch (a.kind) {
    case PipelineAction::Kind::forward: {
      if (vs > 0 && !mine(vs - 1)) {
        const auto& in = role_.cuts[static_cast<std::size_t>(vs - 1)];
        for (std::size_t i = 0; i < in.size(); ++i) {
          HP_ASSIGN_OR_RETURN(
              e[in[i]],
              recv(rank_of(vs - 1), tag_of(vs - 1, p, k, 0, static_cast<int>(i), 0), in[i]));
        }
        ready = std::chrono::steady_clock::now();
      }
      HP_TRY(run_part(*c, c->forward, e, s));
      if (vs < last) {
        const auto& out = role_.cuts[static_cast<std::size_t>(vs)];
        for (std::size_t i = 0; i < out.size(); ++i) {
          if (mine(vs + 1))
            env_of(vs + 1)[out[i]] = e.at(out[i]);
          else
            HP_TRY(
                send(rank_of(vs + 1), tag_of(vs, p, k, 0, static_cast<int>(i), 0), e.at(out[i])));
        }
      }
      break;
    }
    case PipelineAction::Kind::backward:
      if (vs < last && !mine(vs + 1)) {
        for (std::size_t i = 0; i < c->float_out.size(); ++i) {
          const std::string g = c->float_out[i] + ".grad";
          HP_ASSIGN_OR_RETURN(
              e[g], recv(rank_of(vs + 1), tag_of(vs, p, k, 1, static_cast<int>(i), 0), g));
        }
        ready = std::chrono::steady_clock::now();
      }
      HP_TRY(run_part(*c, c->backward, e, s));
      for (std::size_t i = 0; vs > 0 && i < c->float_in.size(); ++i) {
        const std::string g = c->float_in[i] + ".grad";
        if (mine(vs - 1))
          env_of(vs - 1)[g] = e.at(g);
        else
          HP_TRY(send(rank_of(vs - 1), tag_of(vs - 1, p, k, 1, static_cast<int>(i), 0), e.at(g)));
      }
      if (!role_.split_weight) e.clear();
      break;
    case PipelineAction::Kind::weight:
      HP_TRY(run_part(*c, c->weight, e, s));
      e.clear();
      break;
  }
  if (trace_) {
    const std::string name = fmt::format("{} {}.{}", "FBW"[static_cast<int>(a.kind)], step_, k);
    const std::string args = fmt::format("{{\"stage\": {}}}", vs);
    if (ready > t0) trace_->add("wait " + name, "wait", 0, t0, ready, args);
    trace_->add(name, "compute", 0, ready, std::chrono::steady_clock::now(), args);
  }
  return {};
}

std::vector<std::vector<std::size_t>> PipelineStage::finals() {
  const auto& actions = role_.actions;
  std::vector<std::vector<std::size_t>> out(actions.size());
  std::vector<long> last(grads_.size(), -1);
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const PipelineAction& a = actions[i];
    Chunk* c = chunk(a.stage >= 0 ? a.stage : chunks_.front().stage);
    if (!c) continue;
    const Part& p = part_of(*c, a.kind);
    if (!p.ex) continue;
    for (const auto& name : p.part.outputs)
      if (auto g = c->grad_index.find(name); g != c->grad_index.end())
        last[g->second] = static_cast<long>(i);
  }
  for (std::size_t k = 0; k < last.size(); ++k)
    if (last[k] >= 0 && !shared_.count(params_[k]))
      out[static_cast<std::size_t>(last[k])].push_back(k);
  return out;
}

Expected<double> PipelineStage::run_step(const std::vector<std::vector<exec::HostTensor>>& micro,
                                         std::int64_t total_labels, double share) {
  const int m = static_cast<int>(micro.size());
  share_ = share;
  if (m != role_.micro_batches)
    return Error(Errc::internal, "the step's micro-batches differ from the schedule's");
  for (auto& g : grads_) std::fill(g.data.begin(), g.data.end(), 0);
  loss_ = 0;
  const bool has_last = mine(role_.stages() - 1);
  // env[chunk][k]: micro-batch k's tensors of a chunk; every chunk starts from the data inputs.
  std::vector<std::vector<Env>> env(chunks_.size(), std::vector<Env>(static_cast<std::size_t>(m)));
  std::vector<float> scale(static_cast<std::size_t>(m), 1.0f);
  for (int k = 0; k < m; ++k) {
    for (auto& per_chunk : env)
      for (const auto& t : micro[static_cast<std::size_t>(k)]) per_chunk[k][t.name] = t;
    // The last stage's loss gradient seed: the micro-batch's share of the global batch's labels.
    if (has_last && total_labels > 0)
      scale[k] = static_cast<float>(static_cast<double>(label_count(micro[k].back(), loss_kind_)) /
                                    static_cast<double>(total_labels));
  }
  if (gathers_) HP_TRY(gathers_->begin_step());
  ++step_;
  held_peak_ = 0;
  comm_seconds_ = 0;
  SendProgress progress(*role_.transport);
  progress_ = &progress;
  struct Reset {
    SendProgress*& p;
    ~Reset() { p = nullptr; }
  } reset{progress_};
  // The data inputs are held for the whole step in `micro` by the caller; count what the
  // schedule adds to them.
  std::set<std::string> data;
  for (const auto& t : micro[0]) data.insert(t.name);
  for (std::size_t i = 0; i < role_.actions.size(); ++i) {
    HP_TRY(run_action(role_.actions[i], env, scale));
    if (hook_)
      for (std::size_t k : finals_[i]) hook_(k, grads_[k]);
    std::int64_t held = 0;
    for (const auto& per_chunk : env)
      for (const auto& each : per_chunk)
        for (const auto& [n, t] : each)
          if (!data.count(n)) held += static_cast<std::int64_t>(t.data.size());
    held_peak_ = std::max(held_peak_, held);
  }
  auto turn = hold();
  HP_TRY(role_.transport->flush());
  // Weights several ranks read: each holds a part of the gradient; all get the sum. Every rank
  // of a group reaches its all-reduces in the same (name) order.
  for (const auto& [w, group] : shared_) {
    auto& g = grads_[static_cast<std::size_t>(std::find(params_.begin(), params_.end(), w) -
                                              params_.begin())];
    HP_TRY(role_.transport->allreduce(group, g.data.data(), g.data.data(), g.numel(), HP_F32,
                                      comm::ReduceOp::sum));
  }
  double loss = has_last ? loss_ : 0.0;
  HP_TRY(role_.transport->allreduce(role_.ranks, &loss, &loss, 1, HP_F64, comm::ReduceOp::sum));
  return loss;
}

Expected<double> PipelineStage::global_norm() {
  double sq = 0;
  for (std::size_t k = 0; k < grads_.size(); ++k) {
    if (!owns(params_[k])) continue;  // counted by the first stage reading it
    const float* g = grads_[k].as<float>();
    for (std::int64_t e = 0; e < grads_[k].numel(); ++e) sq += static_cast<double>(g[e]) * g[e];
  }
  HP_TRY(role_.transport->allreduce(role_.ranks, &sq, &sq, 1, HP_F64, comm::ReduceOp::sum));
  return std::sqrt(sq);
}

}  // namespace hp::train::detail
