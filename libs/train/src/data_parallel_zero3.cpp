// ZeRO-3 of DataParallelSync (data_parallel.h, level 3): the parameters' shards this rank holds,
// and the all-gathers by which the executor borrows a bucket of them for its uses.
//
// Order. Collectives on one communicator must start in the same order on every member. The
// executor asks for buckets in its node order, which is the same on every data-parallel member
// (they run the same gradient model), and this object serves the requests strictly in the order
// they came, on one thread with a channel of its own (comm::set_channel): the gradient buckets'
// reductions (the other thread, DataParallel::channel) and the executor's collectives (channel 0)
// keep theirs apart.
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "hp/plugin/hp_plugin.h"
#include "hp/train/data_parallel.h"

namespace hp::train {

using exec::HostTensor;

namespace {

/// The gathering thread's channel: apart from the reduction threads' (1 and 2, data_parallel.h).
int gather_channel(int reduce_channel) { return reduce_channel + 16; }

}  // namespace

/// Requests in the order the executor made them. The thread serves them oldest first; fetch takes
/// the oldest, which is always the one it wants (the executor fetches in the order it asked), once
/// it is served. A deque: its elements stay where they are while requests are added.
struct DataParallelSync::Gatherer {
  struct Request {
    std::size_t bucket = 0;
    std::vector<float> data;  ///< the whole bucket, once gathered
    bool done = false;
    Status status;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Request> queue;
  std::size_t served = 0;  ///< requests at the front of the queue that are done
  /// Buffers of fetched requests, for the next ones: MPI on memory it has touched before is many
  /// times faster than on fresh pages (tests/bench/comm), and at most two requests are in flight.
  std::vector<std::vector<float>> spare;
  bool stop = false;
  /// Set before joining: a gather still waiting for peers gives up (comm::set_cancel_flag). After
  /// a completed step nothing is in flight (no request goes past a step's end).
  std::atomic<bool> cancel{false};
  std::thread thread;
  ~Gatherer() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cancel = true;
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }
};

Status DataParallelSync::hold_parameters(std::vector<HostTensor>& params) {
  if (dp_.zero < 3 || shard_ == 1)
    return Error(Errc::internal, "only ZeRO-3 with a shard group of several holds parameters");
  if (params.size() != offsets_.size())
    return Error(Errc::internal,
                 fmt::format("{} parameters for a layout of {}", params.size(), offsets_.size()));
  if (held_offset_.empty()) {
    std::int64_t at = 0;
    for (const Bucket& b : buckets_) {
      held_offset_.push_back(at);
      at += b.length / shard_;
    }
    shard_params_.assign(static_cast<std::size_t>(at), 0.0f);
    grad_shard_.assign(static_cast<std::size_t>(at), 0.0f);
    staged_.assign(buckets_.size(), {});
    std::vector<float>().swap(flat_);  // gradients are staged bucket by bucket from now on
  }
  for (const FlatPiece& p : pieces_) {
    const HostTensor& t = params[p.param];
    if (t.data.size() != static_cast<std::size_t>(numel_[p.param]) * sizeof(float))
      return Error(Errc::internal, "a parameter to hold has no data", t.name);
    std::memcpy(held(bucket_of_[p.param], offsets_[p.param] + p.offset),
                reinterpret_cast<const float*>(t.data.data()) + p.offset,
                static_cast<std::size_t>(p.count) * sizeof(float));
  }
  for (HostTensor& t : params) std::vector<unsigned char>().swap(t.data);
  holding_ = true;
  if (!g_ && dp_.transport->any_thread()) start_gatherer();
  return {};
}

float* DataParallelSync::stage(std::size_t b) {
  std::vector<float>& buf = staged_[b];
  if (!buf.empty()) return buf.data();
  const Bucket& k = buckets_[b];
  {
    // A spare of exactly this length: buffers are never resized, so there are at most as many of
    // each length as buckets of that length, and all of them together never exceed the flat
    // vector level 2 keeps (buckets mostly share one length, bucket_mb, so they do get reused).
    std::lock_guard<std::mutex> lock(stage_mu_);
    auto it = std::find_if(spare_.begin(), spare_.end(), [&](const std::vector<float>& v) {
      return static_cast<std::int64_t>(v.size()) == k.length;
    });
    if (it != spare_.end()) {
      buf = std::move(*it);
      spare_.erase(it);
    }
  }
  if (buf.empty()) buf.resize(static_cast<std::size_t>(k.length));
  // The padding after the bucket's last parameter is reduced too: zeros, not a former bucket's.
  const std::int64_t used = offsets_[k.end - 1] + numel_[k.end - 1] - k.start;
  std::fill(buf.begin() + used, buf.end(), 0.0f);
  return buf.data();
}

void DataParallelSync::unstage(std::size_t b) {
  std::lock_guard<std::mutex> lock(stage_mu_);
  spare_.push_back(std::move(staged_[b]));
  staged_[b] = {};
}

float* DataParallelSync::reduced(std::size_t b, std::int64_t at) {
  return grad_shard_.data() + held_offset_[b] + (at - own_start(buckets_[b]));
}

std::int64_t DataParallelSync::gradient_bytes() {
  if (!holding_) return static_cast<std::int64_t>(flat_.size() * sizeof(float));
  std::lock_guard<std::mutex> lock(stage_mu_);
  std::size_t n = 0;
  for (const auto* list : {&staged_, &spare_})
    for (const auto& v : *list) n += v.size();
  return static_cast<std::int64_t>(n * sizeof(float));
}

std::vector<std::vector<std::string>> DataParallelSync::weight_groups(
    const std::vector<HostTensor>& params) const {
  std::vector<std::vector<std::string>> groups;
  for (const Bucket& b : buckets_) {
    auto& names = groups.emplace_back();
    for (std::size_t k = b.first; k < b.end; ++k) names.push_back(params[k].name);
  }
  return groups;
}

namespace {

/// All-gathers bucket `b`'s parameters (`part` elements of them at `mine` on this rank) into `out`.
Status gather_bucket(comm::Transport& t, const std::vector<int>& group, const float* mine,
                     std::int64_t part, std::vector<float>& out) {
  out.resize(static_cast<std::size_t>(part) * group.size());
  return t.allgather(group, mine, out.data(), part * static_cast<std::int64_t>(sizeof(float)));
}

}  // namespace

void DataParallelSync::start_gatherer() {
  {  // its communicator is set up here, on the thread that owns the transport
    const comm::ScopedChannel channel(gather_channel(dp_.channel));
    if (Status st = dp_.transport->connect(shard_group_); !st) return;  // gathers run in fetch
  }
  g_ = std::make_shared<Gatherer>();
  g_->thread = std::thread([this] {
    comm::set_patient_waits(true);
    comm::set_channel(gather_channel(dp_.channel));
    Gatherer& g = *g_;
    comm::set_cancel_flag(&g.cancel);
    for (;;) {
      Gatherer::Request* r = nullptr;
      {
        std::unique_lock<std::mutex> lock(g.mu);
        g.cv.wait(lock, [&] { return g.stop || g.served < g.queue.size(); });
        if (g.stop) return;
        r = &g.queue[g.served];
        if (!g.spare.empty()) {
          r->data = std::move(g.spare.back());
          g.spare.pop_back();
        }
      }
      const Bucket& b = buckets_[r->bucket];
      const auto t0 = TraceLog::Clock::now();
      Status st = gather_bucket(*dp_.transport, shard_group_, held(r->bucket, own_start(b)),
                                b.length / shard_, r->data);
      if (trace_)
        trace_->add(
            fmt::format("gather bucket {} ({:.1f} MiB)", r->bucket, b.length * 4.0 / (1 << 20)),
            "zero-3 all-gather", 3, t0, TraceLog::Clock::now(),
            fmt::format(R"({{"bucket": {}, "parameters": [{}, {}], "bytes": {}}})", r->bucket,
                        b.first, b.end, b.length * 4));
      {
        std::lock_guard<std::mutex> lock(g.mu);
        r->status = std::move(st);
        r->done = true;
        ++g.served;
      }
      g.cv.notify_all();
    }
  });
}

void DataParallelSync::prefetch(std::size_t g) {
  if (!g_ || g >= buckets_.size()) return;  // without the thread, fetch gathers
  {
    std::lock_guard<std::mutex> lock(g_->mu);
    g_->queue.push_back({g, {}, false, {}});
  }
  g_->cv.notify_all();
}

Status DataParallelSync::fetch(std::size_t g, std::span<float* const> dst) {
  if (!holding_ || g >= buckets_.size())
    return Error(Errc::internal, fmt::format("no bucket {} of parameters is held", g));
  const Bucket& b = buckets_[g];
  if (dst.size() != b.end - b.first)
    return Error(Errc::internal, fmt::format("bucket {} has {} parameters, {} were asked for", g,
                                             b.end - b.first, dst.size()));
  std::vector<float> data;
  if (!g_) {
    HP_TRY(gather_bucket(*dp_.transport, shard_group_, held(g, own_start(b)), b.length / shard_,
                         data));
  } else {
    std::unique_lock<std::mutex> lock(g_->mu);
    if (g_->queue.empty() || g_->queue.front().bucket != g) {  // not asked for: ask now
      if (!g_->queue.empty())
        return Error(Errc::internal, fmt::format("bucket {} fetched out of the order asked", g));
      g_->queue.push_back({g, {}, false, {}});
      g_->cv.notify_all();
    }
    g_->cv.wait(lock, [&] { return g_->queue.front().done; });
    Gatherer::Request r = std::move(g_->queue.front());
    g_->queue.pop_front();
    --g_->served;
    lock.unlock();
    HP_TRY(std::move(r.status));
    data = std::move(r.data);
  }
  for (std::size_t k = b.first; k < b.end; ++k) {
    if (!dst[k - b.first]) continue;  // a pipeline part holding only some of the bucket
    const float* from = data.data() + (offsets_[k] - b.start);
    const std::int64_t d = k < dp_.divisor.size() ? dp_.divisor[k] : 1;
    if (d == 1) {
      std::memcpy(dst[k - b.first], from, static_cast<std::size_t>(numel_[k]) * sizeof(float));
    } else {  // the executor's form of a partial addend (DataParallel::divisor)
      const auto by = static_cast<float>(d);  // as TensorParallelSync::stored divides
      for (std::int64_t i = 0; i < numel_[k]; ++i) dst[k - b.first][i] = from[i] / by;
    }
  }
  if (g_) {
    std::lock_guard<std::mutex> lock(g_->mu);
    g_->spare.push_back(std::move(data));
  }
  return {};
}

Expected<std::vector<HostTensor>> DataParallelSync::gather_parameters(
    const std::vector<HostTensor>& params) {
  if (!holding_) return Error(Errc::internal, "gather_parameters without held parameters");
  std::vector<HostTensor> out;
  out.reserve(params.size());
  std::vector<float> data;
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    const Bucket& b = buckets_[bi];
    HP_TRY(gather_bucket(*dp_.transport, shard_group_, held(bi, own_start(b)), b.length / shard_,
                         data));
    for (std::size_t k = b.first; k < b.end; ++k) {
      HostTensor t;
      t.name = params[k].name;
      t.dtype = HP_F32;
      t.dims = params[k].dims;
      t.data.resize(static_cast<std::size_t>(numel_[k]) * sizeof(float));
      std::memcpy(t.data.data(), data.data() + (offsets_[k] - b.start), t.data.size());
      out.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace hp::train
