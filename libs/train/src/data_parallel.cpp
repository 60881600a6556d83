// Data-parallel gradient reduction and the sharded optimizer (data_parallel.h).
#include "hp/train/data_parallel.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hp/plugin/hp_plugin.h"

namespace hp::train {

using exec::HostTensor;

int DataParallel::index() const {
  if (!transport) return group.empty() ? 0 : -1;
  const auto it = std::find(group.begin(), group.end(), transport->rank());
  return it == group.end() ? -1 : static_cast<int>(it - group.begin());
}

namespace {

HostTensor piece_tensor(const std::string& name, std::int64_t count) {
  HostTensor t;
  t.name = name;
  t.dtype = HP_F32;
  t.dims = {count};
  t.data.assign(static_cast<std::size_t>(count) * sizeof(float), 0);
  return t;
}

const float* f32(const HostTensor& t) { return reinterpret_cast<const float*>(t.data.data()); }
float* f32(HostTensor& t) { return reinterpret_cast<float*>(t.data.data()); }

}  // namespace

Expected<DataParallelSync> DataParallelSync::create(const DataParallel& dp,
                                                    const std::vector<HostTensor>& params) {
  DataParallelSync s;
  s.dp_ = dp;
  if (dp.zero < 0 || dp.zero > 3)
    return Error(Errc::bad_input, fmt::format("optimizer_shard level {} is not 0..3", dp.zero));
  for (const HostTensor& p : params) {
    if (p.dtype != HP_F32)
      return Error(Errc::bad_input, "data parallelism reduces f32 parameters only", p.name);
    s.offsets_.push_back(s.total_);
    s.total_ += p.numel();
  }
  const int n = dp.active() ? static_cast<int>(dp.group.size()) : 1;
  const int idx = dp.active() ? dp.index() : 0;
  if (idx < 0)
    return Error(Errc::internal,
                 fmt::format("rank {} is not in its data-parallel group", dp.transport->rank()));
  s.shard_ = dp.zero == 0 ? 1 : (dp.shard > 0 ? dp.shard : n);
  if (s.shard_ > n || n % s.shard_ != 0)
    return Error(Errc::bad_input,
                 fmt::format("the shard group of {} ranks does not divide the data-parallel "
                             "group of {}",
                             s.shard_, n));
  s.position_ = idx % s.shard_;
  const int first = idx - s.position_;
  if (dp.active()) {
    s.shard_group_.assign(dp.group.begin() + first, dp.group.begin() + first + s.shard_);
    for (int j = s.position_; j < n; j += s.shard_) s.replica_group_.push_back(dp.group[j]);
  }
  s.per_shard_ = (s.total_ + s.shard_ - 1) / s.shard_;
  s.flat_.assign(static_cast<std::size_t>(s.per_shard_ * s.shard_), 0.0f);
  const std::int64_t lo = s.position_ * s.per_shard_;
  const std::int64_t hi = std::min(s.total_, lo + s.per_shard_);
  for (std::size_t k = 0; k < params.size(); ++k) {
    const std::int64_t a = std::max(lo, s.offsets_[k]);
    const std::int64_t b = std::min(hi, s.offsets_[k] + params[k].numel());
    if (a < b) s.pieces_.push_back({k, a - s.offsets_[k], b - a});
  }
  return s;
}

Status DataParallelSync::allreduce_chunked(const std::vector<int>& group, float* data,
                                           std::int64_t count) {
  const std::int64_t chunk = std::max<std::int64_t>(1, dp_.bucket_bytes / 4);
  for (std::int64_t at = 0; at < count; at += chunk)
    HP_TRY(dp_.transport->allreduce(group, data + at, data + at, std::min(chunk, count - at),
                                    HP_F32, comm::ReduceOp::sum));
  return {};
}

Expected<double> DataParallelSync::reduce(double loss, std::int64_t count,
                                          std::vector<HostTensor>& grads) {
  if (grads.size() != offsets_.size())
    return Error(Errc::internal,
                 fmt::format("{} gradients for {} parameters", grads.size(), offsets_.size()));
  double sums[2] = {count > 0 ? loss * static_cast<double>(count) : 0.0,
                    static_cast<double>(count)};
  if (dp_.active())
    HP_TRY(dp_.transport->allreduce(dp_.group, sums, sums, 2, HP_F64, comm::ReduceOp::sum));
  if (sums[1] <= 0)
    return Error(Errc::runtime, "the global batch has no label position to train on (all -100)");
  // Each rank's share of the group's mean; a rank without labels contributes zeros, not NaN.
  const float scale = static_cast<float>(static_cast<double>(count) / sums[1]);
  for (std::size_t k = 0; k < grads.size(); ++k) {
    const float* g = f32(grads[k]);
    float* out = flat_.data() + offsets_[k];
    const std::int64_t n = grads[k].numel();
    if (count > 0)
      for (std::int64_t i = 0; i < n; ++i) out[i] = g[i] * scale;
    else
      std::fill(out, out + n, 0.0f);
  }
  float* mine = flat_.data() + position_ * per_shard_;
  if (dp_.active()) {
    if (dp_.zero <= 1) {
      HP_TRY(allreduce_chunked(dp_.group, flat_.data(), total_));
    } else {
      // Reduce-scatter into a separate block (the transport's in and out must not overlap), then
      // the replicas of this shard agree.
      std::vector<float> block(static_cast<std::size_t>(per_shard_));
      HP_TRY(dp_.transport->reduce_scatter(shard_group_, flat_.data(), block.data(), per_shard_,
                                           HP_F32, comm::ReduceOp::sum));
      if (replica_group_.size() > 1)
        HP_TRY(allreduce_chunked(replica_group_, block.data(), per_shard_));
      std::copy(block.begin(), block.end(), mine);
    }
  }
  std::vector<HostTensor> out;
  out.reserve(pieces_.size());
  for (const FlatPiece& p : pieces_) {
    HostTensor t = piece_tensor(grads[p.param].name, p.count);
    std::memcpy(f32(t), flat_.data() + offsets_[p.param] + p.offset,
                static_cast<std::size_t>(p.count) * sizeof(float));
    if (p.offset == 0 && p.count == grads[p.param].numel()) t.dims = grads[p.param].dims;
    out.push_back(std::move(t));
  }
  grads = std::move(out);
  return sums[0] / sums[1];
}

Status DataParallelSync::allgather_params(std::vector<HostTensor>& params) {
  std::vector<float> block(static_cast<std::size_t>(per_shard_), 0.0f);
  std::copy(flat_.begin() + position_ * per_shard_, flat_.begin() + (position_ + 1) * per_shard_,
            block.begin());
  HP_TRY(dp_.transport->allgather(shard_group_, block.data(), flat_.data(),
                                  per_shard_ * static_cast<std::int64_t>(sizeof(float))));
  for (std::size_t k = 0; k < params.size(); ++k)
    std::memcpy(f32(params[k]), flat_.data() + offsets_[k],
                static_cast<std::size_t>(params[k].numel()) * sizeof(float));
  return {};
}

Expected<StepInfo> DataParallelSync::update(const OptimizerConfig& c,
                                            std::vector<HostTensor>& params,
                                            std::vector<HostTensor>& grads, OptimizerState& state) {
  if (grads.size() != pieces_.size())
    return Error(Errc::internal, "DataParallelSync::update before reduce");
  // The pieces this rank updates, shaped as their gradients (whole tensors keep their dims).
  std::vector<HostTensor> mine;
  mine.reserve(pieces_.size());
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    const FlatPiece& p = pieces_[k];
    HostTensor t = piece_tensor(params[p.param].name, p.count);
    t.dims = grads[k].dims;
    std::memcpy(f32(t), f32(params[p.param]) + p.offset,
                static_cast<std::size_t>(p.count) * sizeof(float));
    mine.push_back(std::move(t));
  }
  double sq = 0;
  for (const HostTensor& g : grads) {
    const double n = global_norm({g});
    sq += n * n;
  }
  if (shard_ > 1)
    HP_TRY(dp_.transport->allreduce(shard_group_, &sq, &sq, 1, HP_F64, comm::ReduceOp::sum));
  HP_ASSIGN_OR_RETURN(StepInfo info, optimizer_step(c, mine, grads, state, std::sqrt(sq)));
  if (shard_ == 1) {
    for (std::size_t k = 0; k < pieces_.size(); ++k)
      params[pieces_[k].param].data = std::move(mine[k].data);
    return info;
  }
  for (std::size_t k = 0; k < pieces_.size(); ++k)
    std::memcpy(flat_.data() + offsets_[pieces_[k].param] + pieces_[k].offset, f32(mine[k]),
                static_cast<std::size_t>(pieces_[k].count) * sizeof(float));
  HP_TRY(allgather_params(params));
  return info;
}

Expected<OptimizerState> DataParallelSync::gather_state(const OptimizerState& state,
                                                        const std::vector<HostTensor>& params) {
  if (shard_ == 1) return state;
  OptimizerState whole;
  whole.step = state.step;
  // Every rank takes part in the same gathers: how many state lists exist is a property of the
  // optimizer and the step, not of this rank's pieces (a rank may own none).
  double lists = static_cast<double>(!state.exp_avg.empty()) + !state.exp_avg_sq.empty();
  HP_TRY(dp_.transport->allreduce(shard_group_, &lists, &lists, 1, HP_F64, comm::ReduceOp::max));
  std::vector<float> block(static_cast<std::size_t>(per_shard_));
  for (int l = 0; l < static_cast<int>(lists); ++l) {
    const auto& src = l == 0 ? state.exp_avg : state.exp_avg_sq;
    std::fill(block.begin(), block.end(), 0.0f);
    for (std::size_t k = 0; k < pieces_.size() && k < src.size(); ++k)
      std::memcpy(
          block.data() + offsets_[pieces_[k].param] + pieces_[k].offset - position_ * per_shard_,
          f32(src[k]), static_cast<std::size_t>(pieces_[k].count) * sizeof(float));
    HP_TRY(dp_.transport->allgather(shard_group_, block.data(), flat_.data(),
                                    per_shard_ * static_cast<std::int64_t>(sizeof(float))));
    auto& dst = l == 0 ? whole.exp_avg : whole.exp_avg_sq;
    for (std::size_t k = 0; k < params.size(); ++k) {
      HostTensor t = piece_tensor(params[k].name, params[k].numel());
      t.dims = params[k].dims;
      std::memcpy(f32(t), flat_.data() + offsets_[k],
                  static_cast<std::size_t>(params[k].numel()) * sizeof(float));
      dst.push_back(std::move(t));
    }
  }
  return whole;
}

OptimizerState DataParallelSync::slice_state(const OptimizerState& whole) const {
  if (shard_ == 1) return whole;
  OptimizerState s;
  s.step = whole.step;
  for (int l = 0; l < 2; ++l) {
    const auto& src = l == 0 ? whole.exp_avg : whole.exp_avg_sq;
    auto& dst = l == 0 ? s.exp_avg : s.exp_avg_sq;
    if (src.empty()) continue;
    for (const FlatPiece& p : pieces_) {
      HostTensor t = piece_tensor(src[p.param].name, p.count);
      if (p.offset == 0 && p.count == src[p.param].numel()) t.dims = src[p.param].dims;
      std::memcpy(f32(t), f32(src[p.param]) + p.offset,
                  static_cast<std::size_t>(p.count) * sizeof(float));
      dst.push_back(std::move(t));
    }
  }
  return s;
}

}  // namespace hp::train
