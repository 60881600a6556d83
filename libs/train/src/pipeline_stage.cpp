// PipelineStage (pipeline_stage.h).
//
// Tags: a tensor crossing the boundary is two messages, a header (rank count, dtype, dims) and its
// bytes, tagged ((k * 2 + direction) * 64 + i) * 2 + {0, 1} for micro-batch k, direction 0
// (activations) or 1 (their gradients) and cut tensor i. Messages between two ranks with distinct
// tags never match the wrong receive whatever order the two action lists interleave in, and every
// tag stays below 32768, the least MPI_TAG_UB MPI allows.
#include "pipeline_stage.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "batches.h"
#include "hp/exec/backends.h"
#include "hp/plugin/hp_plugin.h"

namespace hp::train::detail {

namespace {

constexpr int kMaxMicro = 128, kMaxCut = 64, kMaxRank = 8;

int tag_of(int micro, int direction, int tensor, int half) {
  return ((micro * 2 + direction) * kMaxCut + tensor) * 2 + half;
}

bool is_float(int dtype) {
  return dtype == HP_F32 || dtype == HP_F16 || dtype == HP_BF16 || dtype == HP_F64;
}

void scale_f32(exec::HostTensor& t, float s) {
  if (s == 1.0f || t.dtype != HP_F32) return;
  float* p = t.as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] *= s;
}

}  // namespace

Expected<std::unique_ptr<PipelineStage>> PipelineStage::create(const TrainOptions& o,
                                                               const model::Model& forward,
                                                               const model::DimBindings& dims) {
  const PipelineRole& role = o.pp;
  if (role.cuts.size() + 1 != role.ranks.size())
    return Error(Errc::bad_input,
                 fmt::format("{} pipeline stages need {} stage boundaries, not {}",
                             role.ranks.size(), role.ranks.size() - 1, role.cuts.size()));
  if (role.micro_batches < 1 || role.micro_batches > kMaxMicro)
    return Error(Errc::bad_input,
                 fmt::format("pipeline training takes 1 to {} micro-batches, not {}", kMaxMicro,
                             role.micro_batches));
  for (const auto& cut : role.cuts)
    if (cut.empty() || cut.size() > static_cast<std::size_t>(kMaxCut))
      return Error(Errc::bad_input,
                   fmt::format("the stage boundary has {} tensors (1 to {} are supported)",
                               cut.size(), kMaxCut));
  std::unique_ptr<PipelineStage> s(new PipelineStage());
  s->role_ = role;
  s->stage_ = role.stage;
  HP_ASSIGN_OR_RETURN(PipelinePieces pieces, split_pipeline(forward, role.cuts, dims));
  const auto me = static_cast<std::size_t>(s->stage_);
  // The floating-point tensors of boundary b: their gradients go back from stage b + 1 to b.
  auto float_cut = [&](std::size_t b) {
    std::vector<std::string> out;
    for (const auto& io : exec::model_io(pieces.stages[b + 1]).inputs)
      for (const auto& c : role.cuts[b])
        if (io.name == c && is_float(io.dtype)) out.push_back(c);
    return out;
  };
  if (me > 0) s->float_in_ = float_cut(me - 1);
  if (!s->last()) s->float_out_ = float_cut(me);
  GradSpec spec = o.grad;
  spec.dims = dims;
  if (!s->last()) {
    spec.logits.clear();
    spec.output_grads = s->float_out_;
  }
  spec.input_grads = s->float_in_;
  HP_ASSIGN_OR_RETURN(s->gg_, build_grad_graph(pieces.stages[me], spec));
  HP_ASSIGN_OR_RETURN(GradParts parts,
                      split_backward(s->gg_, role.split_weight ? BackwardSplit::input_weight
                                                               : BackwardSplit::whole));
  std::vector<std::filesystem::path> paths(o.plugin_paths.begin(), o.plugin_paths.end());
  HP_ASSIGN_OR_RETURN(auto b,
                      exec::open_backends(o.backend.empty() ? "cpu" : o.backend, o.threads, paths));
  for (auto [part, dst] :
       {std::pair{&parts.forward, &s->forward_}, std::pair{&parts.backward, &s->backward_},
        std::pair{&parts.weight, &s->weight_}}) {
    dst->part = std::move(*part);
    if (dst->part.empty()) continue;
    HP_ASSIGN_OR_RETURN(dst->ex,
                        exec::Executor::create(dst->part.model, {b.primary, b.cpu, nullptr}));
  }
  for (std::size_t k = 0; k < s->gg_.grads.size(); ++k) s->grad_index_[s->gg_.grads[k]] = k;
  for (const auto& [w, stages] : pieces.shared) {
    if (std::find(s->gg_.params.begin(), s->gg_.params.end(), w) == s->gg_.params.end()) continue;
    for (int st : stages) s->shared_[w].push_back(role.ranks[static_cast<std::size_t>(st)]);
    s->owned_[w] = stages.front() == s->stage_;
  }
  s->loss_kind_ = o.grad.loss;
  HP_ASSIGN_OR_RETURN(auto values, s->read_params());
  for (auto& v : values) {
    if (v.dtype != HP_F32)
      return Error(Errc::bad_input, "only float32 parameters are trained for now", v.name);
    std::fill(v.data.begin(), v.data.end(), 0);
    s->grads_.push_back(std::move(v));
  }
  return s;
}

Expected<std::vector<exec::HostTensor>> PipelineStage::read_params() {
  std::vector<exec::HostTensor> out;
  for (const auto& p : gg_.params) {
    Part* holder = nullptr;
    for (Part* q : {&forward_, &backward_, &weight_})
      if (q->ex &&
          std::find(q->part.params.begin(), q->part.params.end(), p) != q->part.params.end())
        holder = q;
    if (!holder) return Error(Errc::internal, "no part of the stage holds parameter " + p);
    HP_ASSIGN_OR_RETURN(auto h, holder->ex->weight(p));
    h.name = p;
    out.push_back(std::move(h));
  }
  return out;
}

bool PipelineStage::owns(const std::string& name) const {
  auto it = owned_.find(name);
  return it == owned_.end() || it->second;
}

Status PipelineStage::set_weights(const std::vector<exec::HostTensor>& params) {
  for (Part* q : {&forward_, &backward_, &weight_}) {
    if (!q->ex) continue;
    for (const auto& p : params)
      if (std::find(q->part.params.begin(), q->part.params.end(), p.name) != q->part.params.end())
        HP_TRY(q->ex->set_weight(p.name, p));
  }
  return {};
}

std::int64_t PipelineStage::peak_bytes() const {
  std::int64_t peak = 0;
  for (const Part* q : {&forward_, &backward_, &weight_})
    if (q->ex) peak = std::max(peak, q->ex->stats().peak_bytes);
  return peak + held_peak_;
}

std::unique_lock<std::mutex> PipelineStage::hold() {
  return progress_ ? progress_->lock() : std::unique_lock<std::mutex>();
}

Status PipelineStage::send(int peer, int tag, const exec::HostTensor& t) {
  std::int64_t header[2 + kMaxRank] = {static_cast<std::int64_t>(t.dims.size()), t.dtype};
  if (t.dims.size() > static_cast<std::size_t>(kMaxRank))
    return Error(Errc::not_implemented, "a stage boundary tensor of rank above 8", t.name);
  for (std::size_t i = 0; i < t.dims.size(); ++i) header[2 + i] = t.dims[i];
  auto turn = hold();
  HP_TRY(role_.transport->send(peer, tag, header, sizeof header));
  HP_TRY(role_.transport->send(peer, tag + 1, t.data.data(),
                               static_cast<std::int64_t>(t.data.size())));
  if (progress_) progress_->sent();
  return {};
}

Expected<exec::HostTensor> PipelineStage::recv(int peer, int tag, const std::string& name) {
  std::int64_t header[2 + kMaxRank] = {};
  auto turn = hold();
  HP_TRY(role_.transport->recv(peer, tag, header, sizeof header));
  exec::HostTensor t;
  t.name = name;
  t.dtype = static_cast<int>(header[1]);
  if (header[0] < 0 || header[0] > kMaxRank || exec::dtype_size(t.dtype) == 0)
    return Error(Errc::runtime, "a malformed tensor header from the pipeline peer", name);
  t.dims.assign(header + 2, header + 2 + header[0]);
  t.data.resize(static_cast<std::size_t>(t.numel() * exec::dtype_size(t.dtype)));
  HP_TRY(role_.transport->recv(peer, tag + 1, t.data.data(),
                               static_cast<std::int64_t>(t.data.size())));
  return t;
}

Status PipelineStage::run_part(Part& p, Env& env, float scale) {
  if (!p.ex) return {};
  std::vector<exec::HostTensor> in;
  for (const auto& name : p.part.inputs) {
    auto it = env.find(name);
    if (it == env.end())
      return Error(Errc::internal, "a stage part reads a tensor nothing gave it", name);
    in.push_back(it->second);
  }
  HP_ASSIGN_OR_RETURN(auto outs, p.ex->run(in));
  for (std::size_t i = 0; i < outs.size() && i < p.part.outputs.size(); ++i) {
    const std::string& name = p.part.outputs[i];
    exec::HostTensor& t = outs[i];
    if (auto g = grad_index_.find(name); g != grad_index_.end()) {
      exec::HostTensor& acc = grads_[g->second];
      if (t.dtype != HP_F32 || t.data.size() != acc.data.size())
        return Error(Errc::internal, "a gradient part's shape differs from its parameter", name);
      float* a = acc.as<float>();
      const float* v = t.as<float>();
      for (std::int64_t e = 0; e < acc.numel(); ++e) a[e] += scale * v[e];
    } else if (name == gg_.loss && !name.empty()) {
      loss_ +=
          static_cast<double>(scale) * (t.dtype == HP_F32 ? t.as<float>()[0] : t.as<double>()[0]);
    } else {
      if (std::find(gg_.input_grad_outputs.begin(), gg_.input_grad_outputs.end(), name) !=
          gg_.input_grad_outputs.end())
        scale_f32(t, scale);
      t.name = name;
      env[name] = std::move(t);
    }
  }
  return {};
}

Expected<double> PipelineStage::run_step(const std::vector<std::vector<exec::HostTensor>>& micro,
                                         std::int64_t total_labels) {
  const int m = static_cast<int>(micro.size());
  if (m != role_.micro_batches)
    return Error(Errc::internal, "the step's micro-batches differ from the schedule's");
  for (auto& g : grads_) std::fill(g.data.begin(), g.data.end(), 0);
  loss_ = 0;
  std::vector<Env> env(static_cast<std::size_t>(m));
  std::vector<float> scale(static_cast<std::size_t>(m), 1.0f);
  for (int k = 0; k < m; ++k) {
    for (const auto& t : micro[static_cast<std::size_t>(k)]) env[k][t.name] = t;
    // The last stage's loss gradient seed: the micro-batch's share of the global batch's labels.
    if (last() && total_labels > 0)
      scale[k] = static_cast<float>(static_cast<double>(label_count(micro[k].back(), loss_kind_)) /
                                    static_cast<double>(total_labels));
  }
  const int prev = stage_ > 0 ? role_.ranks[stage_ - 1] : -1;
  const int next = last() ? -1 : role_.ranks[stage_ + 1];
  ++step_;
  held_peak_ = 0;
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
  for (const PipelineAction& a : role_.actions) {
    const auto t0 = std::chrono::steady_clock::now();
    auto ready = t0;  // when the action's inputs had arrived: the wait before is bubble
    const int k = a.micro_batch;
    if (k < 0 || k >= m)
      return Error(Errc::internal, "a schedule action outside the micro-batches");
    Env& e = env[k];
    switch (a.kind) {
      case PipelineAction::Kind::forward:
        if (prev >= 0) {
          const auto& in = role_.cuts[static_cast<std::size_t>(stage_ - 1)];
          for (std::size_t i = 0; i < in.size(); ++i) {
            HP_ASSIGN_OR_RETURN(e[in[i]], recv(prev, tag_of(k, 0, static_cast<int>(i), 0), in[i]));
          }
          ready = std::chrono::steady_clock::now();
        }
        HP_TRY(run_part(forward_, e, scale[k]));
        if (next >= 0) {
          const auto& out = role_.cuts[static_cast<std::size_t>(stage_)];
          for (std::size_t i = 0; i < out.size(); ++i)
            HP_TRY(send(next, tag_of(k, 0, static_cast<int>(i), 0), e.at(out[i])));
        }
        break;
      case PipelineAction::Kind::backward:
        if (next >= 0) {
          for (std::size_t i = 0; i < float_out_.size(); ++i) {
            const std::string g = float_out_[i] + ".grad";
            HP_ASSIGN_OR_RETURN(e[g], recv(next, tag_of(k, 1, static_cast<int>(i), 0), g));
          }
          ready = std::chrono::steady_clock::now();
        }
        HP_TRY(run_part(backward_, e, scale[k]));
        if (prev >= 0)
          for (std::size_t i = 0; i < float_in_.size(); ++i)
            HP_TRY(send(prev, tag_of(k, 1, static_cast<int>(i), 0), e.at(float_in_[i] + ".grad")));
        if (!role_.split_weight) e.clear();
        break;
      case PipelineAction::Kind::weight:
        HP_TRY(run_part(weight_, e, scale[k]));
        e.clear();
        break;
    }
    std::int64_t held = 0;
    for (const auto& each : env)
      for (const auto& [n, t] : each)
        if (!data.count(n)) held += static_cast<std::int64_t>(t.data.size());
    held_peak_ = std::max(held_peak_, held);
    if (trace_) {
      const std::string name = fmt::format("{} {}.{}", "FBW"[static_cast<int>(a.kind)], step_, k);
      if (ready > t0) trace_->add("wait " + name, "wait", 0, t0, ready);
      trace_->add(name, "compute", 0, ready, std::chrono::steady_clock::now());
    }
  }
  auto turn = hold();
  HP_TRY(role_.transport->flush());
  // Weights several stages read: each holds a part of the gradient; all get the sum. Every rank
  // of a group reaches its all-reduces in the same (name) order.
  for (const auto& [w, group] : shared_) {
    auto& g = grads_[static_cast<std::size_t>(std::find(gg_.params.begin(), gg_.params.end(), w) -
                                              gg_.params.begin())];
    HP_TRY(role_.transport->allreduce(group, g.data.data(), g.data.data(), g.numel(), HP_F32,
                                      comm::ReduceOp::sum));
  }
  double loss = last() ? loss_ : 0.0;
  HP_TRY(role_.transport->allreduce(role_.ranks, &loss, &loss, 1, HP_F64, comm::ReduceOp::sum));
  return loss;
}

Expected<double> PipelineStage::global_norm() {
  double sq = 0;
  for (std::size_t k = 0; k < grads_.size(); ++k) {
    if (!owns(gg_.params[k])) continue;  // counted by the first stage reading it
    const float* g = grads_[k].as<float>();
    for (std::int64_t e = 0; e < grads_[k].numel(); ++e) sq += static_cast<double>(g[e]) * g[e];
  }
  HP_TRY(role_.transport->allreduce(role_.ranks, &sq, &sq, 1, HP_F64, comm::ReduceOp::sum));
  return std::sqrt(sq);
}

}  // namespace hp::train::detail
