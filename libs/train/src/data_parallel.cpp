// Data-parallel gradient reduction and the sharded optimizer (data_parallel.h).
#include "hp/train/data_parallel.h"

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

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

/// The communication thread: reduces the buckets last to first, each once it is complete. The
/// order is fixed, not the order buckets complete in: collectives on one communicator must be
/// started in the same order on every member, and members need not complete gradients in the same
/// order (expert-parallel members hold different experts, so their graphs and schedules differ).
/// Last to first is the order a backward completes them in. An error is kept and reported by
/// finish_step; the buckets after it are still taken (not reduced), so finish_step never waits for
/// work that will not come.
struct DataParallelSync::Worker {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> complete;  ///< per bucket, this step
  std::size_t done = 0;        ///< buckets finished this step (the last `done` ones)
  bool stop = false;
  /// Set before joining: a reduction still waiting for peers gives up (comm::set_cancel_flag).
  std::atomic<bool> cancel{false};
  Status failed;
  std::thread thread;
};

void DataParallelSync::worker() {
  comm::set_patient_waits(true);
  comm::set_channel(dp_.channel);
  Worker& w = *w_;
  comm::set_cancel_flag(&w.cancel);
  for (;;) {
    std::size_t b = 0;
    {
      std::unique_lock<std::mutex> lock(w.mu);
      const auto next = [&] { return buckets_.size() - 1 - w.done; };
      w.cv.wait(lock, [&] { return w.stop || (w.done < buckets_.size() && w.complete[next()]); });
      if (w.stop) return;
      b = next();
    }
    const auto t0 = TraceLog::Clock::now();
    Status st = w.failed ? reduce_bucket(buckets_[b]) : Status{};
    if (trace_) {
      const Bucket& k = buckets_[b];
      trace_->add(fmt::format("reduce bucket {} ({:.1f} MiB)", b, k.length * 4.0 / (1 << 20)),
                  dp_.zero <= 1 ? "dp all-reduce" : "dp reduce-scatter", 1, t0,
                  TraceLog::Clock::now(),
                  fmt::format(R"({{"bucket": {}, "parameters": [{}, {}], "bytes": {}}})", b,
                              k.first, k.end, k.length * 4));
    }
    {
      std::lock_guard<std::mutex> lock(w.mu);
      if (!st && w.failed) w.failed = std::move(st);
      ++w.done;
    }
    w.cv.notify_all();
  }
}

Expected<std::unique_ptr<DataParallelSync>> DataParallelSync::create(
    const DataParallel& dp, const std::vector<HostTensor>& params) {
  std::unique_ptr<DataParallelSync> s(new DataParallelSync());
  s->dp_ = dp;
  if (dp.zero < 0 || dp.zero > 3)
    return Error(Errc::bad_input, fmt::format("optimizer_shard level {} is not 0..3", dp.zero));
  for (const HostTensor& p : params)
    if (p.dtype != HP_F32)
      return Error(Errc::bad_input, "data parallelism reduces f32 parameters only", p.name);
  const int n = dp.active() ? static_cast<int>(dp.group.size()) : 1;
  const int idx = dp.active() ? dp.index() : 0;
  if (idx < 0)
    return Error(Errc::internal,
                 fmt::format("rank {} is not in its data-parallel group", dp.transport->rank()));
  s->shard_ = dp.zero == 0 ? 1 : (dp.shard > 0 ? dp.shard : n);
  if (s->shard_ > n || n % s->shard_ != 0)
    return Error(Errc::bad_input,
                 fmt::format("the shard group of {} ranks does not divide the data-parallel "
                             "group of {}",
                             s->shard_, n));
  s->position_ = idx % s->shard_;
  const int first = idx - s->position_;
  if (dp.active()) {
    s->shard_group_.assign(dp.group.begin() + first, dp.group.begin() + first + s->shard_);
    for (int j = s->position_; j < n; j += s->shard_) s->replica_group_.push_back(dp.group[j]);
  }
  // Buckets of whole parameters in order, each padded to a multiple of the shard count.
  const std::int64_t limit = std::max<std::int64_t>(1, dp.bucket_bytes / 4);
  std::int64_t at = 0;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const std::int64_t numel = params[k].numel();
    if (s->buckets_.empty() || s->buckets_.back().length + numel > limit) {
      if (!s->buckets_.empty()) {
        Bucket& b = s->buckets_.back();
        b.length = (b.length + s->shard_ - 1) / s->shard_ * s->shard_;
        at = b.start + b.length;
      }
      s->buckets_.push_back({at, 0, k, k});
    }
    Bucket& b = s->buckets_.back();
    s->offsets_.push_back(b.start + b.length);
    s->numel_.push_back(numel);
    s->bucket_of_.push_back(s->buckets_.size() - 1);
    b.length += numel;
    b.end = k + 1;
  }
  if (!s->buckets_.empty()) {
    Bucket& b = s->buckets_.back();
    b.length = (b.length + s->shard_ - 1) / s->shard_ * s->shard_;
    at = b.start + b.length;
  }
  s->flat_.assign(static_cast<std::size_t>(at), 0.0f);
  for (const Bucket& b : s->buckets_) {
    const std::int64_t lo = s->own_start(b), hi = lo + b.length / s->shard_;
    for (std::size_t k = b.first; k < b.end; ++k) {
      const std::int64_t a = std::max(lo, s->offsets_[k]);
      const std::int64_t e = std::min(hi, s->offsets_[k] + s->numel_[k]);
      if (a < e) s->pieces_.push_back({k, a - s->offsets_[k], e - a});
    }
  }
  s->ready_.assign(params.size(), 0);
  if (dp.active() && dp.transport->any_thread()) {
    // The communication thread's groups are set up here, on the thread that owns the transport
    // (Transport::connect).
    const comm::ScopedChannel channel(dp.channel);
    for (const auto* g : {&s->dp_.group, &s->shard_group_, &s->replica_group_})
      if (g->size() > 1) HP_TRY(dp.transport->connect(*g));
    s->w_ = std::make_unique<Worker>();
    s->w_->complete.assign(s->buckets_.size(), 0);
    s->w_->thread = std::thread([p = s.get()] { p->worker(); });
  }
  return s;
}

DataParallelSync::~DataParallelSync() {
  if (!w_) return;
  {
    std::lock_guard<std::mutex> lock(w_->mu);
    w_->stop = true;
  }
  // A step that failed on this rank may have left a bucket's reduction waiting for peers that
  // will not come; on a step that completed, nothing is in flight.
  w_->cancel = true;
  w_->cv.notify_all();
  w_->thread.join();
}

Status DataParallelSync::reduce_bucket(const Bucket& b) {
  const auto bi = static_cast<std::size_t>(&b - buckets_.data());
  float* data = holding_ ? staged_[bi].data() : flat_.data() + b.start;
  if (dp_.zero <= 1 || shard_ == 1) {  // every rank keeps the whole sum
    return dp_.transport->allreduce(dp_.group, data, data, b.length, HP_F32, comm::ReduceOp::sum);
  }
  // Reduce-scatter into scratch (the transport's in and out must not overlap), then the replicas
  // of this shard agree.
  const std::int64_t part = b.length / shard_;
  std::vector<float> block(static_cast<std::size_t>(part));
  HP_TRY(dp_.transport->reduce_scatter(shard_group_, data, block.data(), part, HP_F32,
                                       comm::ReduceOp::sum));
  if (replica_group_.size() > 1)
    HP_TRY(dp_.transport->allreduce(replica_group_, block.data(), block.data(), part, HP_F32,
                                    comm::ReduceOp::sum));
  if (holding_) {  // the shard is all this rank keeps of the bucket's gradients
    std::copy(block.begin(), block.end(), reduced(bi, own_start(b)));
    unstage(bi);
    return {};
  }
  std::copy(block.begin(), block.end(), flat_.begin() + own_start(b));
  return {};
}

Status DataParallelSync::begin_step(std::int64_t count) {
  double n = static_cast<double>(count);
  if (dp_.active())
    HP_TRY(dp_.transport->allreduce(dp_.group, &n, &n, 1, HP_F64, comm::ReduceOp::sum));
  return begin_step(count, n);
}

Status DataParallelSync::begin_step(std::int64_t count, double n) {
  if (n <= 0)
    return Error(Errc::runtime, "the global batch has no label position to train on (all -100)");
  count_ = count;
  total_ = n;
  // Each rank's share of the group's mean; a rank without labels contributes zeros, not NaN.
  scale_ = static_cast<float>(static_cast<double>(count) / n);
  std::fill(ready_.begin(), ready_.end(), 0);
  for (std::size_t b = 0; b < staged_.size(); ++b)  // a failed step may have left some taken
    if (!staged_[b].empty()) unstage(b);
  pending_.clear();
  for (const Bucket& b : buckets_) pending_.push_back(b.end - b.first);
  if (w_) {
    std::lock_guard<std::mutex> lock(w_->mu);
    w_->done = 0;
    w_->failed = {};
    std::fill(w_->complete.begin(), w_->complete.end(), 0);
  }
  return {};
}

void DataParallelSync::gradient_ready(std::size_t k, const HostTensor& grad) {
  if (k >= ready_.size() || ready_[k] || grad.numel() != numel_[k] || grad.dtype != HP_F32)
    return;  // finish_step takes it from the returned outputs (and checks it there)
  const float* g = f32(grad);
  const std::size_t bk = bucket_of_[k];
  float* out =
      holding_ ? stage(bk) + (offsets_[k] - buckets_[bk].start) : flat_.data() + offsets_[k];
  if (dp_.weighted)
    std::memcpy(out, g, static_cast<std::size_t>(numel_[k]) * sizeof(float));
  else if (count_ > 0)
    for (std::int64_t i = 0; i < numel_[k]; ++i) out[i] = g[i] * scale_;
  else
    std::fill(out, out + numel_[k], 0.0f);
  ready_[k] = 1;
  const std::size_t b = bucket_of_[k];
  if (--pending_[b] != 0 || !w_) return;
  {
    std::lock_guard<std::mutex> lock(w_->mu);
    w_->complete[b] = 1;
  }
  w_->cv.notify_all();
}

Expected<double> DataParallelSync::finish_step(double loss, std::vector<HostTensor>& grads) {
  if (grads.size() != offsets_.size())
    return Error(Errc::internal,
                 fmt::format("{} gradients for {} parameters", grads.size(), offsets_.size()));
  for (std::size_t k = 0; k < grads.size(); ++k) {
    if (grads[k].numel() != numel_[k] || grads[k].dtype != HP_F32)
      return Error(Errc::internal, "a gradient is not shaped like its parameter", grads[k].name);
    if (!ready_[k]) gradient_ready(k, grads[k]);
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (dp_.active()) {
    if (w_) {
      std::unique_lock<std::mutex> lock(w_->mu);
      w_->cv.wait(lock, [&] { return w_->done == buckets_.size(); });
      if (!w_->failed) return std::move(w_->failed).error();
    } else {
      for (const Bucket& b : buckets_) HP_TRY(reduce_bucket(b));
    }
  }
  exposed_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double sum = count_ > 0 ? loss * static_cast<double>(count_) : 0.0;
  if (dp_.active())
    HP_TRY(dp_.transport->allreduce(dp_.group, &sum, &sum, 1, HP_F64, comm::ReduceOp::sum));
  std::vector<HostTensor> out;
  out.reserve(pieces_.size());
  for (const FlatPiece& p : pieces_) {
    const bool whole = p.offset == 0 && p.count == numel_[p.param];
    // A whole parameter's gradient buffer is reused (no allocation); a piece gets its own.
    HostTensor t = whole ? std::move(grads[p.param]) : piece_tensor(grads[p.param].name, p.count);
    const std::int64_t at = offsets_[p.param] + p.offset;
    std::memcpy(f32(t), holding_ ? reduced(bucket_of_[p.param], at) : flat_.data() + at,
                static_cast<std::size_t>(p.count) * sizeof(float));
    out.push_back(std::move(t));
  }
  grads = std::move(out);
  return sum / total_;
}

Expected<double> DataParallelSync::reduce(double loss, std::int64_t count,
                                          std::vector<HostTensor>& grads) {
  HP_TRY(begin_step(count));
  return finish_step(loss, grads);
}

Status DataParallelSync::allgather_bucket(const Bucket& b, float* flat) {
  const std::int64_t part = b.length / shard_;
  std::vector<float> block(flat + own_start(b), flat + own_start(b) + part);
  return dp_.transport->allgather(shard_group_, block.data(), flat + b.start,
                                  part * static_cast<std::int64_t>(sizeof(float)));
}

Expected<StepInfo> DataParallelSync::update(const OptimizerConfig& c,
                                            std::vector<HostTensor>& params,
                                            std::vector<HostTensor>& grads, OptimizerState& state,
                                            const Mirror& mirror) {
  HP_ASSIGN_OR_RETURN(const double sq, squared_norm(grads, c.threads));
  return update_with_norm(c, params, grads, state, std::sqrt(sq), mirror);
}

Expected<double> DataParallelSync::squared_norm(const std::vector<HostTensor>& grads, int threads) {
  if (grads.size() != pieces_.size())
    return Error(Errc::internal, "DataParallelSync::squared_norm before finish_step");
  // This rank's part: its pieces (every parameter at shard 1), those counted.
  std::vector<char> counted;
  if (!dp_.counted.empty())
    for (const FlatPiece& p : pieces_) counted.push_back(dp_.counted.at(p.param));
  double sq = sum_of_squares(grads, counted, threads);
  if (shard_ > 1)
    HP_TRY(dp_.transport->allreduce(shard_group_, &sq, &sq, 1, HP_F64, comm::ReduceOp::sum));
  if (!dp_.norm_group.empty())
    HP_TRY(dp_.transport->allreduce(dp_.norm_group, &sq, &sq, 1, HP_F64, comm::ReduceOp::sum));
  return sq;
}

Expected<StepInfo> DataParallelSync::update_with_norm(const OptimizerConfig& c,
                                                      std::vector<HostTensor>& params,
                                                      std::vector<HostTensor>& grads,
                                                      OptimizerState& state, double norm,
                                                      const Mirror& mirror) {
  if (grads.size() != pieces_.size())
    return Error(Errc::internal, "DataParallelSync::update before finish_step");
  if (shard_ == 1) {
    // Every rank updates every parameter (its pieces are the whole tensors, in order): in place,
    // without copies of the model.
    return optimizer_step(c, params, grads, state, norm, mirror);
  }
  // The pieces this rank updates, shaped as their gradients (whole tensors keep their dims), from
  // the whole parameters or, at ZeRO-3, from the shard this rank holds.
  std::vector<HostTensor> mine;
  mine.reserve(pieces_.size());
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    const FlatPiece& p = pieces_[k];
    HostTensor t = piece_tensor(params[p.param].name, p.count);
    t.dims = grads[k].dims;
    const float* from = holding_ ? held(bucket_of_[p.param], offsets_[p.param] + p.offset)
                                 : f32(params[p.param]) + p.offset;
    std::memcpy(f32(t), from, static_cast<std::size_t>(p.count) * sizeof(float));
    mine.push_back(std::move(t));
  }
  HP_ASSIGN_OR_RETURN(StepInfo info, optimizer_step(c, mine, grads, state, norm));
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    const FlatPiece& p = pieces_[k];
    float* to = holding_ ? held(bucket_of_[p.param], offsets_[p.param] + p.offset)
                         : flat_.data() + offsets_[p.param] + p.offset;
    std::memcpy(to, f32(mine[k]), static_cast<std::size_t>(p.count) * sizeof(float));
  }
  if (holding_) return info;  // the executor gathers them for their next use
  for (const Bucket& b : buckets_) HP_TRY(allgather_bucket(b, flat_.data()));
  for (std::size_t k = 0; k < params.size(); ++k)
    std::memcpy(f32(params[k]), flat_.data() + offsets_[k],
                static_cast<std::size_t>(numel_[k]) * sizeof(float));
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
  // At ZeRO-3 there is no flat vector between steps: a checkpoint's gathers get one of their own.
  std::vector<float> scratch;
  if (holding_ && !buckets_.empty())
    scratch.resize(static_cast<std::size_t>(buckets_.back().start + buckets_.back().length));
  std::vector<float>& flat = holding_ ? scratch : flat_;
  for (int l = 0; l < static_cast<int>(lists); ++l) {
    const auto& src = l == 0 ? state.exp_avg : state.exp_avg_sq;
    std::fill(flat.begin(), flat.end(), 0.0f);
    for (std::size_t k = 0; k < pieces_.size() && k < src.size(); ++k)
      std::memcpy(flat.data() + offsets_[pieces_[k].param] + pieces_[k].offset, f32(src[k]),
                  static_cast<std::size_t>(pieces_[k].count) * sizeof(float));
    for (const Bucket& b : buckets_) HP_TRY(allgather_bucket(b, flat.data()));
    auto& dst = l == 0 ? whole.exp_avg : whole.exp_avg_sq;
    for (std::size_t k = 0; k < params.size(); ++k) {
      HostTensor t = piece_tensor(params[k].name, numel_[k]);
      t.dims = params[k].dims;
      std::memcpy(f32(t), flat.data() + offsets_[k],
                  static_cast<std::size_t>(numel_[k]) * sizeof(float));
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
