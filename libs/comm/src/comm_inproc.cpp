// The in-process transport: one thread per rank, exchange through shared memory. Used by unit tests
// and `hp verify --simulate` to run every rank's partition in one process without MPI.
//
// A collective is a rendezvous keyed by (ordered group, per-group call count): each member deposits
// a copy of its input, waits until all p have arrived, computes its own result from the copies, and
// the last reader removes the entry. Copies (not pointers) keep in-place calls such as allreduce
// race-free. Point-to-point messages are buffered in per-(src, dst, tag) queues, so send never
// blocks, as with MPI_Isend. A failing rank marks the world failed and wakes everyone, so peers
// fail instead of hanging.
#include <fmt/core.h>

#include <algorithm>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "hp/comm/comm.h"

namespace hp::comm {
namespace {

template <class T>
void reduce_into(T* acc, const T* x, std::int64_t n, ReduceOp op) {
  for (std::int64_t i = 0; i < n; ++i) {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc[i] += x[i]; break;
      case ReduceOp::prod: acc[i] *= x[i]; break;
      case ReduceOp::max: acc[i] = acc[i] < x[i] ? x[i] : acc[i]; break;
      case ReduceOp::min: acc[i] = x[i] < acc[i] ? x[i] : acc[i]; break;
    }
  }
}

Status reduce_bytes(void* acc, const void* x, std::int64_t n, int dtype, ReduceOp op) {
  switch (dtype) {
    case HP_F32:
      reduce_into(static_cast<float*>(acc), static_cast<const float*>(x), n, op);
      return {};
    case HP_F64:
      reduce_into(static_cast<double*>(acc), static_cast<const double*>(x), n, op);
      return {};
    case HP_I32:
      reduce_into(static_cast<std::int32_t*>(acc), static_cast<const std::int32_t*>(x), n, op);
      return {};
    case HP_I64:
      reduce_into(static_cast<std::int64_t*>(acc), static_cast<const std::int64_t*>(x), n, op);
      return {};
    default:
      return Error(Errc::bad_input,
                   fmt::format("cannot reduce {} tensors", exec::dtype_label(dtype)));
  }
}

struct World {
  explicit World(int n, double timeout) : size(n), timeout_s(timeout) {}
  const int size;
  const double timeout_s;
  std::mutex mu;
  std::condition_variable cv;
  bool failed = false;

  struct Coll {
    std::vector<std::vector<unsigned char>> in;
    int arrived = 0, read = 0;
  };
  std::map<std::tuple<int, std::vector<int>, long>, Coll> colls;  ///< by channel, group, call
  std::map<std::tuple<int, int, int>, std::deque<std::vector<unsigned char>>>
      mail;  // (src, dst, tag)

  // Waits for `ready` under `lock`; fails when a peer failed or the timeout passes.
  template <class Pred>
  Status wait(std::unique_lock<std::mutex>& lock, Pred ready, const std::string& what) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(timeout_s));
    while (!ready()) {
      if (failed) return Error(Errc::runtime, fmt::format("{}: another rank failed", what));
      if (cancelled()) return Error(Errc::runtime, fmt::format("{}: cancelled (stopping)", what));
      // A thread that may be cancelled looks at its flag every 50 ms (nothing notifies it).
      const Clock::time_point until =
          cancellable() ? std::min(deadline, Clock::now() + std::chrono::milliseconds(50))
                        : deadline;
      if (cv.wait_until(lock, until) == std::cv_status::timeout && !ready() &&
          Clock::now() >= deadline)
        return Error(Errc::runtime,
                     fmt::format("{}: no progress for {:g} s (deadlock?)", what, timeout_s));
    }
    return {};
  }
};

class InProcessTransport : public Transport {
 public:
  InProcessTransport(World& w, int rank) : w_(w), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return w_.size; }

  Status allreduce(const std::vector<int>& group, const void* src, void* buf, std::int64_t count,
                   int dtype, ReduceOp op) override {
    const std::int64_t bytes = count * exec::dtype_size(dtype);
    return exchange(group, src, bytes, "allreduce",
                    [&](const std::vector<std::vector<unsigned char>>& in) -> Status {
                      std::memcpy(buf, in[0].data(), static_cast<std::size_t>(bytes));
                      for (std::size_t j = 1; j < in.size(); ++j)
                        HP_TRY(reduce_bytes(buf, in[j].data(), count, dtype, op));
                      return {};
                    });
  }
  Status allgather(const std::vector<int>& group, const void* in, void* out,
                   std::int64_t bytes) override {
    return exchange(group, in, bytes, "allgather",
                    [&](const std::vector<std::vector<unsigned char>>& all) -> Status {
                      for (std::size_t j = 0; j < all.size(); ++j)
                        std::memcpy(static_cast<unsigned char*>(out) + j * bytes, all[j].data(),
                                    static_cast<std::size_t>(bytes));
                      return {};
                    });
  }
  Status reduce_scatter(const std::vector<int>& group, const void* in, void* out,
                        std::int64_t count, int dtype, ReduceOp op) override {
    const std::int64_t bytes = count * exec::dtype_size(dtype);
    const std::int64_t p = static_cast<std::int64_t>(group.size());
    const std::int64_t pos = position(group);
    return exchange(group, in, bytes * p, "reduce_scatter",
                    [&](const std::vector<std::vector<unsigned char>>& all) -> Status {
                      std::memcpy(out, all[0].data() + pos * bytes,
                                  static_cast<std::size_t>(bytes));
                      for (std::size_t j = 1; j < all.size(); ++j)
                        HP_TRY(reduce_bytes(out, all[j].data() + pos * bytes, count, dtype, op));
                      return {};
                    });
  }
  Status alltoall(const std::vector<int>& group, const void* in, void* out,
                  std::int64_t bytes) override {
    const std::int64_t p = static_cast<std::int64_t>(group.size());
    const std::int64_t pos = position(group);
    return exchange(group, in, bytes * p, "alltoall",
                    [&](const std::vector<std::vector<unsigned char>>& all) -> Status {
                      for (std::size_t j = 0; j < all.size(); ++j)
                        std::memcpy(static_cast<unsigned char*>(out) + j * bytes,
                                    all[j].data() + pos * bytes, static_cast<std::size_t>(bytes));
                      return {};
                    });
  }
  Status send(int peer, int tag, const void* buf, std::int64_t bytes) override {
    if (peer < 0 || peer >= w_.size)
      return Error(Errc::bad_input, fmt::format("send to rank {}: no such rank", peer));
    std::lock_guard lock(w_.mu);
    const auto* b = static_cast<const unsigned char*>(buf);
    w_.mail[{rank_, peer, tag}].emplace_back(b, b + bytes);
    w_.cv.notify_all();
    return {};
  }
  Status recv(int peer, int tag, void* buf, std::int64_t bytes) override {
    if (peer < 0 || peer >= w_.size)
      return Error(Errc::bad_input, fmt::format("recv from rank {}: no such rank", peer));
    std::unique_lock lock(w_.mu);
    auto& q = w_.mail[{peer, rank_, tag}];
    HP_TRY(w_.wait(
        lock, [&] { return !q.empty(); },
        fmt::format("rank {} receiving tag {} from rank {}", rank_, tag, peer)));
    std::vector<unsigned char> m = std::move(q.front());
    q.pop_front();
    if (static_cast<std::int64_t>(m.size()) != bytes)
      return Error(Errc::runtime,
                   fmt::format("rank {} expected {} bytes with tag {} from rank {}, got {}", rank_,
                               bytes, tag, peer, m.size()));
    std::memcpy(buf, m.data(), m.size());
    return {};
  }
  Status sendrecv(int dst, const void* sbuf, int src, void* rbuf, std::int64_t bytes,
                  int tag) override {
    if (dst >= 0) HP_TRY(send(dst, tag, sbuf, bytes));
    if (src >= 0) HP_TRY(recv(src, tag, rbuf, bytes));
    return {};
  }

 private:
  std::int64_t position(const std::vector<int>& group) const {
    for (std::size_t i = 0; i < group.size(); ++i)
      if (group[i] == rank_) return static_cast<std::int64_t>(i);
    return -1;
  }

  template <class Compute>
  Status exchange(const std::vector<int>& group, const void* in, std::int64_t bytes,
                  const char* what, Compute compute) {
    const std::int64_t pos = position(group);
    if (pos < 0)
      return Error(Errc::internal, fmt::format("{}: rank {} is not in its group", what, rank_));
    // Two threads of a rank may call at once on different groups (a training rank's reduction
    // thread): the call counts are kept under the world's lock too.
    std::unique_lock lock(w_.mu);
    const int ch = channel();
    const long seq = calls_[{ch, group}]++;
    const auto key = std::make_tuple(ch, group, seq);
    auto& c = w_.colls[key];
    if (c.in.empty()) c.in.resize(group.size());
    const auto* b = static_cast<const unsigned char*>(in);
    c.in[static_cast<std::size_t>(pos)].assign(b, b + bytes);
    ++c.arrived;
    w_.cv.notify_all();
    const int p = static_cast<int>(group.size());
    HP_TRY(w_.wait(
        lock, [&] { return c.arrived == p; }, fmt::format("rank {} in {} #{}", rank_, what, seq)));
    for (const auto& v : c.in)
      if (static_cast<std::int64_t>(v.size()) != bytes)
        return Error(Errc::runtime,
                     fmt::format("{}: members passed different sizes ({} and {} bytes)", what,
                                 v.size(), bytes));
    Status s = compute(c.in);
    if (++c.read == p) w_.colls.erase(key);
    return s;
  }

  World& w_;
  const int rank_;
  std::map<std::pair<int, std::vector<int>>, long> calls_;  ///< by channel, group
};

}  // namespace

Status run_in_process(int ranks, const std::function<Status(int, Transport&)>& body,
                      double timeout_s) {
  if (ranks < 1) return Error(Errc::usage, "an in-process job needs at least one rank");
  World world(ranks, timeout_s);
  std::vector<Status> results(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      InProcessTransport t(world, r);
      Status s = body(r, t);
      if (!s.ok()) {
        std::lock_guard lock(world.mu);
        world.failed = true;
        world.cv.notify_all();
      }
      results[static_cast<std::size_t>(r)] = std::move(s);
    });
  for (auto& t : threads) t.join();
  // The first rank that failed on its own account (not merely because a peer failed) is the cause.
  for (int pass = 0; pass < 2; ++pass)
    for (int r = 0; r < ranks; ++r) {
      const Status& s = results[static_cast<std::size_t>(r)];
      if (s.ok()) continue;
      if (pass == 0 && s.error().message().find("another rank failed") != std::string::npos)
        continue;
      Error e = s.error();
      e.what.message = fmt::format("rank {}: {}", r, e.what.message);
      return e;
    }
  return {};
}

}  // namespace hp::comm
