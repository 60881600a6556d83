// The reductions of expert-parallel training (hp/train/expert_parallel.h: ExpertParallelSync).
#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "hp/plugin/hp_plugin.h"
#include "hp/train/expert_parallel.h"
#include "hp/train/optimizer.h"

namespace hp::train {

namespace {

int position(const std::vector<int>& v, int x) {
  auto it = std::find(v.begin(), v.end(), x);
  return it == v.end() ? -1 : static_cast<int>(it - v.begin());
}

// Under HSDP, an expert's shard group: the ranks of `replicas` inside this rank's shard group of
// `data` (a consecutive block of ep.shard ranks there). They must be a consecutive block of
// `replicas` too, as DataParallelSync cuts its group into blocks; with expert groups laid
// consecutively in `data` they are whenever the expert group's size divides the shard group's or
// the reverse.
Expected<int> expert_shard(const ExpertParallel& ep) {
  if (ep.shard <= 0) return 0;
  const int me = position(ep.data, ep.transport->rank());
  const int first = me / ep.shard * ep.shard;
  std::vector<int> inside;
  for (int k = first; k < first + ep.shard && k < static_cast<int>(ep.data.size()); ++k)
    if (position(ep.replicas, ep.data[static_cast<std::size_t>(k)]) >= 0)
      inside.push_back(ep.data[static_cast<std::size_t>(k)]);
  const int n = static_cast<int>(inside.size());
  const int at = position(ep.replicas, ep.transport->rank());
  const int start = at / n * n;
  const bool block = static_cast<int>(ep.replicas.size()) % n == 0 &&
                     std::equal(inside.begin(), inside.end(), ep.replicas.begin() + start);
  if (!block)
    return Error(Errc::bad_input,
                 fmt::format("shard groups of {} ranks do not split the {} ranks holding each "
                             "expert into equal blocks: make shard_group a multiple or a divisor "
                             "of expert_parallel = {}",
                             ep.shard, ep.replicas.size(), ep.group.size()));
  return n;
}

}  // namespace

int ExpertParallel::index() const { return transport ? position(group, transport->rank()) : -1; }

int ExpertParallel::part() const { return transport ? position(data, transport->rank()) : -1; }

Expected<std::unique_ptr<ExpertParallelSync>> ExpertParallelSync::create(
    const ExpertParallel& ep, const std::vector<exec::HostTensor>& params,
    std::vector<std::vector<std::string>> experts_of) {
  const int me = ep.index();
  if (!ep.transport || me < 0 || ep.part() < 0 || position(ep.replicas, ep.transport->rank()) < 0)
    return Error(Errc::internal, "this rank is not in its expert-parallel groups");
  if (experts_of.size() != ep.group.size())
    return Error(Errc::internal, "expert owners do not match the expert-parallel group");
  std::unique_ptr<ExpertParallelSync> s(new ExpertParallelSync());
  s->ep_ = ep;
  const auto& mine = experts_of[static_cast<std::size_t>(me)];
  auto& shapes = s->shapes_;
  for (const auto& p : params) {
    if (p.dtype != HP_F32)
      return Error(Errc::bad_input, "only float32 parameters are trained for now", p.name);
    const bool expert = std::find(mine.begin(), mine.end(), p.name) != mine.end();
    s->names_.push_back(p.name);
    s->expert_.push_back(expert);
    s->at_.push_back(shapes[expert].size());
    exec::HostTensor t;  // DataParallelSync lays out names, dims and sizes only
    t.name = p.name;
    t.dtype = p.dtype;
    t.dims = p.dims;
    shapes[expert].push_back(std::move(t));
  }
  s->experts_of_ = std::move(experts_of);
  DataParallel shared;
  shared.transport = ep.transport;
  shared.group = ep.data;
  shared.zero = ep.zero;
  shared.bucket_bytes = ep.bucket_bytes;
  shared.weighted = true;
  shared.shard = ep.shard;
  DataParallel experts = shared;
  experts.group = ep.replicas;
  // Pipeline stages: a weight several stages share is counted once (an expert never is shared).
  if (!ep.counted.empty()) {
    if (ep.counted.size() != params.size())
      return Error(Errc::internal, "expert-parallel norm flags do not match the parameters");
    for (std::size_t k = 0; k < params.size(); ++k)
      if (!s->expert_[k]) shared.counted.push_back(ep.counted[k]);
  }
  // Under HSDP the two syncs' groups can coincide (both replicate across shard groups).
  experts.channel = shared.channel + 1;
  HP_ASSIGN_OR_RETURN(experts.shard, expert_shard(ep));
  HP_ASSIGN_OR_RETURN(s->shared_, DataParallelSync::create(shared, shapes[0]));
  HP_ASSIGN_OR_RETURN(s->experts_, DataParallelSync::create(experts, shapes[1]));
  return s;
}

ExpertParallelSync::~ExpertParallelSync() = default;

template <class T>
std::pair<std::vector<T>, std::vector<T>> ExpertParallelSync::split(std::vector<T> all) const {
  std::pair<std::vector<T>, std::vector<T>> out;
  for (std::size_t k = 0; k < all.size() && k < expert_.size(); ++k)
    (expert_[k] ? out.second : out.first).push_back(std::move(all[k]));
  return out;
}

namespace {

// The inverse of split: the two lists back in parameter order.
template <class T>
std::vector<T> merge(const std::vector<char>& expert, std::vector<T> shared,
                     std::vector<T> experts) {
  std::vector<T> out;
  std::size_t a = 0, b = 0;
  for (char e : expert) out.push_back(std::move(e ? experts.at(b++) : shared.at(a++)));
  return out;
}

// The first `n` entries of each list of `s`, and the rest.
std::pair<OptimizerState, OptimizerState> cut_state(OptimizerState s, std::size_t n) {
  std::pair<OptimizerState, OptimizerState> out;
  out.first.step = out.second.step = s.step;
  for (auto list : {&OptimizerState::exp_avg, &OptimizerState::exp_avg_sq}) {
    auto& v = s.*list;
    if (v.empty()) continue;
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>(std::min(n, v.size()));
    (out.first.*list).assign(std::make_move_iterator(v.begin()), std::make_move_iterator(mid));
    (out.second.*list).assign(std::make_move_iterator(mid), std::make_move_iterator(v.end()));
  }
  return out;
}

OptimizerState join_state(OptimizerState a, OptimizerState b) {
  for (auto list : {&OptimizerState::exp_avg, &OptimizerState::exp_avg_sq})
    for (auto& t : b.*list) (a.*list).push_back(std::move(t));
  return a;
}

}  // namespace

Expected<double> ExpertParallelSync::begin_step(std::int64_t count) {
  HP_TRY(shared_->begin_step(count));
  HP_TRY(experts_->begin_step(count, shared_->total()));  // the data-parallel group's count
  return shared_->share();
}

void ExpertParallelSync::gradient_ready(std::size_t k, const exec::HostTensor& grad) {
  if (k < expert_.size()) (expert_[k] ? experts_ : shared_)->gradient_ready(at_[k], grad);
}

Expected<double> ExpertParallelSync::finish_step(double loss,
                                                 std::vector<exec::HostTensor>& grads) {
  if (grads.size() != names_.size())
    return Error(Errc::internal, fmt::format("{} gradients for {} expert-parallel parameters",
                                             grads.size(), names_.size()));
  auto [shared, experts] = split(std::move(grads));
  HP_ASSIGN_OR_RETURN(const double all, shared_->finish_step(loss, shared));
  if (auto e = experts_->finish_step(loss, experts); !e) return std::move(e).error();
  shared_pieces_ = shared.size();
  grads = std::move(shared);
  for (auto& g : experts) grads.push_back(std::move(g));
  return all;
}

Expected<StepInfo> ExpertParallelSync::update(const OptimizerConfig& c,
                                              std::vector<exec::HostTensor>& params,
                                              std::vector<exec::HostTensor>& grads,
                                              OptimizerState& state) {
  if (grads.size() != shared_->pieces().size() + experts_->pieces().size())
    return Error(Errc::internal, "ExpertParallelSync::update before finish_step");
  std::vector<exec::HostTensor> gs(std::make_move_iterator(grads.begin()),
                                   std::make_move_iterator(grads.begin() + shared_pieces_));
  std::vector<exec::HostTensor> ge(std::make_move_iterator(grads.begin() + shared_pieces_),
                                   std::make_move_iterator(grads.end()));
  grads.clear();
  // The whole model's norm: the shared weights once, every member's experts.
  HP_ASSIGN_OR_RETURN(const double sq_shared, shared_->squared_norm(gs, c.threads));
  HP_ASSIGN_OR_RETURN(double sq_experts, experts_->squared_norm(ge, c.threads));
  HP_TRY(ep_.transport->allreduce(ep_.group, &sq_experts, &sq_experts, 1, HP_F64,
                                  comm::ReduceOp::sum));
  double sq = sq_shared + sq_experts;
  if (!ep_.norm_group.empty())  // the pipeline's other stages
    HP_TRY(ep_.transport->allreduce(ep_.norm_group, &sq, &sq, 1, HP_F64, comm::ReduceOp::sum));
  const double norm = std::sqrt(sq);
  auto [ps, pe] = split(std::move(params));
  auto [ss, se] = cut_state(std::move(state), shared_->pieces().size());
  auto a = shared_->update_with_norm(c, ps, gs, ss, norm);
  auto b = a ? experts_->update_with_norm(c, pe, ge, se, norm) : a;
  params = merge(expert_, std::move(ps), std::move(pe));
  state = join_state(std::move(ss), std::move(se));
  if (!b) return std::move(b).error();
  return a;
}

Expected<OptimizerState> ExpertParallelSync::gather_state(const OptimizerState& state) {
  // Even unsharded, the state lists the shared weights first: put it back in parameter order.
  auto [ss, se] = cut_state(state, shared_->pieces().size());
  HP_ASSIGN_OR_RETURN(OptimizerState ws, shared_->gather_state(ss, shapes_[0]));
  HP_ASSIGN_OR_RETURN(OptimizerState we, experts_->gather_state(se, shapes_[1]));
  OptimizerState whole;
  whole.step = state.step;
  for (auto list : {&OptimizerState::exp_avg, &OptimizerState::exp_avg_sq})
    if (!(ws.*list).empty() || !(we.*list).empty())
      whole.*list = merge(expert_, std::move(ws.*list), std::move(we.*list));
  return whole;
}

OptimizerState ExpertParallelSync::slice_state(const OptimizerState& whole) const {
  OptimizerState ws, we;
  ws.step = we.step = whole.step;
  for (auto list : {&OptimizerState::exp_avg, &OptimizerState::exp_avg_sq})
    if (!(whole.*list).empty()) std::tie(ws.*list, we.*list) = split(whole.*list);
  return join_state(shared_->slice_state(ws), experts_->slice_state(we));
}

Status ExpertParallelSync::hold(std::vector<exec::HostTensor>& params) {
  if (params.size() != names_.size())
    return Error(Errc::internal, "hold: not this member's parameter list");
  if (ep_.zero < 3) return Error(Errc::internal, "only ZeRO-3 holds parameters");
  for (const char which : {0, 1}) {
    DataParallelSync& s = which ? *experts_ : *shared_;
    if (!s.sharded()) continue;
    std::vector<exec::HostTensor> list;
    for (std::size_t k = 0; k < params.size(); ++k)
      if (expert_[k] == which) list.push_back(std::move(params[k]));
    Status st = s.hold_parameters(list);
    std::size_t a = 0;  // back in place: names and dims, and the data where holding failed
    for (std::size_t k = 0; k < params.size(); ++k)
      if (expert_[k] == which) params[k] = std::move(list[a++]);
    HP_TRY(std::move(st));
  }
  shared_groups_ = holds_shared() ? shared_->weight_groups(shapes_[0]).size() : 0;
  return {};
}

Status ExpertParallelSync::same_shared_order(const std::vector<std::size_t>& sequence,
                                             const std::string& where) const {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the shared buckets asked for
  for (std::size_t g : sequence)
    if (g < shared_groups_) h = (h ^ (g + 1)) * 1099511628211ull;
  std::int64_t lo = static_cast<std::int64_t>(h >> 1), hi = lo;
  HP_TRY(ep_.transport->allreduce(ep_.data, &lo, &lo, 1, HP_I64, comm::ReduceOp::min));
  HP_TRY(ep_.transport->allreduce(ep_.data, &hi, &hi, 1, HP_I64, comm::ReduceOp::max));
  if (lo != hi)
    return Error(Errc::not_implemented,
                 "ZeRO-3 with expert parallelism needs every member to use the shared weights in "
                 "the same order, and this model's members do not (their experts differ in "
                 "shape)",
                 where, "use optimizer_shard 2");
  return {};
}

bool ExpertParallelSync::holds_shared() const { return shared_->holds_parameters(); }
bool ExpertParallelSync::holds_experts() const { return experts_->holds_parameters(); }

std::vector<std::vector<std::string>> ExpertParallelSync::held_groups() const {
  std::vector<std::vector<std::string>> out;
  if (holds_shared()) out = shared_->weight_groups(shapes_[0]);
  if (holds_experts())
    for (auto& g : experts_->weight_groups(shapes_[1])) out.push_back(std::move(g));
  return out;
}

void ExpertParallelSync::prefetch(std::size_t g) {
  if (g < shared_groups_)
    shared_->prefetch(g);
  else
    experts_->prefetch(g - shared_groups_);
}

Status ExpertParallelSync::fetch(std::size_t g, std::span<float* const> dst) {
  return g < shared_groups_ ? shared_->fetch(g, dst) : experts_->fetch(g - shared_groups_, dst);
}

Expected<std::vector<exec::HostTensor>> ExpertParallelSync::with_held(
    const std::vector<exec::HostTensor>& params) {
  std::vector<exec::HostTensor> out = params;
  for (const char which : {0, 1}) {
    DataParallelSync& s = which ? *experts_ : *shared_;
    if (!s.holds_parameters()) continue;
    HP_ASSIGN_OR_RETURN(auto whole, s.gather_parameters(shapes_[static_cast<int>(which)]));
    for (std::size_t k = 0; k < out.size() && k < expert_.size(); ++k)
      if (expert_[k] == which) out[k] = std::move(whole[at_[k]]);
  }
  return out;
}

bool ExpertParallelSync::sharded() const { return shared_->sharded() || experts_->sharded(); }

void ExpertParallelSync::set_trace(TraceLog* trace) {
  shared_->set_trace(trace);
  experts_->set_trace(trace);
}

Expected<std::vector<exec::HostTensor>> ExpertParallelSync::gather(
    const std::vector<exec::HostTensor>& mine, const model::Model& forward) const {
  if (mine.empty()) return std::vector<exec::HostTensor>{};  // no optimizer state (plain SGD)
  // Every member's experts are laid end to end, padded to the largest member's bytes; their dims
  // come from the forward model, which every rank holds whole.
  std::map<std::string, std::vector<std::int64_t>> dims;
  for (const auto& t : forward.proto->graph().initializer())
    dims[t.name()] = std::vector<std::int64_t>(t.dims().begin(), t.dims().end());
  auto bytes_of = [&](const std::string& name) -> std::int64_t {
    std::int64_t n = 4;
    for (auto d : dims.at(name)) n *= d;
    return n;
  };
  std::int64_t block = 0;
  for (const auto& names : experts_of_) {
    std::int64_t b = 0;
    for (const auto& n : names) b += bytes_of(n);
    block = std::max(block, b);
  }
  std::vector<unsigned char> send(static_cast<std::size_t>(block));
  std::size_t at = 0;
  std::map<std::string, const exec::HostTensor*> by_name;
  for (std::size_t k = 0; k < mine.size(); ++k) by_name[names_[k]] = &mine[k];
  for (const auto& n : experts_of_[static_cast<std::size_t>(ep_.index())]) {
    const auto* t = by_name.at(n);
    std::memcpy(send.data() + at, t->data.data(), t->data.size());
    at += t->data.size();
  }
  std::vector<unsigned char> all(static_cast<std::size_t>(block) * ep_.group.size());
  // A pipeline stage without expert layers has none to gather (block is the same on every member).
  if (block > 0) HP_TRY(ep_.transport->allgather(ep_.group, send.data(), all.data(), block));
  std::map<std::string, exec::HostTensor> whole;
  for (std::size_t k = 0; k < mine.size(); ++k)
    if (!expert_[k]) {
      whole[names_[k]] = mine[k];
      whole[names_[k]].name = names_[k];
    }
  for (std::size_t m = 0; m < experts_of_.size(); ++m) {
    std::size_t off = m * static_cast<std::size_t>(block);
    for (const auto& n : experts_of_[m]) {
      exec::HostTensor t;
      t.name = n;
      t.dtype = HP_F32;
      t.dims = dims.at(n);
      const auto b = static_cast<std::size_t>(bytes_of(n));
      t.data.assign(all.begin() + static_cast<std::ptrdiff_t>(off),
                    all.begin() + static_cast<std::ptrdiff_t>(off + b));
      off += b;
      whole[n] = std::move(t);
    }
  }
  std::vector<exec::HostTensor> out;
  for (const auto& t : forward.proto->graph().initializer())
    if (auto it = whole.find(t.name()); it != whole.end()) out.push_back(std::move(it->second));
  return out;
}

}  // namespace hp::train
