// The reductions of expert-parallel training (hp/train/expert_parallel.h: ExpertParallelSync).
#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "hp/plugin/hp_plugin.h"
#include "hp/train/expert_parallel.h"
#include "hp/train/optimizer.h"

namespace hp::train {

namespace {

int position(const std::vector<int>& v, int x) {
  auto it = std::find(v.begin(), v.end(), x);
  return it == v.end() ? -1 : static_cast<int>(it - v.begin());
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
  for (const auto& p : params) {
    if (p.dtype != HP_F32)
      return Error(Errc::bad_input, "only float32 parameters are trained for now", p.name);
    s->names_.push_back(p.name);
    s->expert_.push_back(std::find(mine.begin(), mine.end(), p.name) != mine.end());
    s->shared_.push_back(!s->expert_.back());
  }
  s->experts_of_ = std::move(experts_of);
  return s;
}

Expected<double> ExpertParallelSync::begin_step(std::int64_t count) {
  double counts[1] = {static_cast<double>(count)}, total[1] = {0};
  HP_TRY(ep_.transport->allreduce(ep_.data, counts, total, 1, HP_F64, comm::ReduceOp::sum));
  // No label anywhere: every rank's loss is 0 over 0 positions; an even share keeps it finite.
  share_ = total[0] > 0 ? counts[0] / total[0] : 1.0 / static_cast<double>(ep_.data.size());
  return share_;
}

Status ExpertParallelSync::sum(const std::vector<int>& group, std::vector<exec::HostTensor>& grads,
                               bool experts) {
  if (group.size() < 2) return {};
  std::vector<float> flat;
  for (std::size_t k = 0; k < grads.size(); ++k)
    if ((expert_[k] != 0) == experts)
      flat.insert(flat.end(), grads[k].as<float>(), grads[k].as<float>() + grads[k].numel());
  if (flat.empty()) return {};
  HP_TRY(ep_.transport->allreduce(group, flat.data(), flat.data(),
                                  static_cast<std::int64_t>(flat.size()), HP_F32,
                                  comm::ReduceOp::sum));
  std::size_t at = 0;
  for (std::size_t k = 0; k < grads.size(); ++k)
    if ((expert_[k] != 0) == experts) {
      const auto n = static_cast<std::size_t>(grads[k].numel());
      std::memcpy(grads[k].as<float>(), flat.data() + at, n * sizeof(float));
      at += n;
    }
  return {};
}

Expected<double> ExpertParallelSync::finish_step(double loss,
                                                 std::vector<exec::HostTensor>& grads) {
  if (grads.size() != names_.size())
    return Error(Errc::internal, fmt::format("{} gradients for {} expert-parallel parameters",
                                             grads.size(), names_.size()));
  double mine[1] = {loss * share_}, all[1] = {0};
  HP_TRY(ep_.transport->allreduce(ep_.data, mine, all, 1, HP_F64, comm::ReduceOp::sum));
  HP_TRY(sum(ep_.data, grads, false));
  HP_TRY(sum(ep_.replicas, grads, true));
  return all[0];
}

Expected<double> ExpertParallelSync::global_norm(const std::vector<exec::HostTensor>& grads) const {
  double experts[1] = {sum_of_squares(grads, expert_)}, total[1] = {0};
  HP_TRY(ep_.transport->allreduce(ep_.group, experts, total, 1, HP_F64, comm::ReduceOp::sum));
  return std::sqrt(sum_of_squares(grads, shared_) + total[0]);
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
  HP_TRY(ep_.transport->allgather(ep_.group, send.data(), all.data(), block));
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
