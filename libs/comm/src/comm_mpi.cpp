// The MPI transport. One communicator per ordered group and channel (comm::set_channel), built with
// MPI_Group_incl in the group's member order (so communicator rank == member position and
// collectives need no permutation) and MPI_Comm_create_group (collective over the members only:
// ranks outside the group need not take part). Communicators are cached for the life of the
// process. Errors come back as values (MPI_ERRORS_RETURN on every communicator); the worker turns
// them into MPI_Abort.
//
// Sends are MPI_Isend from a private copy kept until completion: a pipeline stage can send a
// micro-batch and go on computing the next one while the message is in flight, and two neighbours
// that send to each other before receiving cannot deadlock on rendezvous-sized messages.
#include <fmt/core.h>
#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "hp/comm/comm.h"

namespace hp::comm {
namespace {

std::string mpi_error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<std::size_t>(len));
}

Status check(int code, const char* what) {
  if (code == MPI_SUCCESS) return {};
  return Error(Errc::runtime, fmt::format("{} failed: {}", what, mpi_error_text(code)));
}

Expected<MPI_Datatype> mpi_type(int dtype) {
  switch (dtype) {
    case HP_F32: return MPI_FLOAT;
    case HP_F64: return MPI_DOUBLE;
    case HP_I32: return MPI_INT32_T;
    case HP_I64: return MPI_INT64_T;
    default:
      return Error(Errc::bad_input,
                   fmt::format("cannot reduce {} tensors over MPI", exec::dtype_label(dtype)));
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::prod: return MPI_PROD;
    default: return MPI_SUM;
  }
}

Expected<int> count_of(std::int64_t n) {
  if (n < 0 || n > INT_MAX)
    return Error(Errc::runtime, fmt::format("a message of {} elements exceeds MPI's int count", n));
  return static_cast<int>(n);
}

// Collectives called from a thread that set this wait without spinning (set_patient_waits).
thread_local bool t_patient = false;

// Threads of this process that are not patient and wait for, or are about to take, the transport's
// lock. A patient thread lets them go first (Access below): an unlock followed at once by a lock
// wins the mutex again nearly every time, so without this a compute thread, woken on each unlock
// of a polling reduction thread, can wait out that thread's whole collective while its peers wait
// for it; worst with more ranks than cores, where the woken thread runs late.
std::atomic<int> g_eager{0};

// The transport's lock, taken fairly between a rank's threads (see g_eager).
class Access {
 public:
  explicit Access(std::mutex& mu) : lock_(mu, std::defer_lock) { acquire(); }
  void release() { lock_.unlock(); }
  void acquire() {
    if (!t_patient) {
      g_eager.fetch_add(1, std::memory_order_acq_rel);
      lock_.lock();
      g_eager.fetch_sub(1, std::memory_order_acq_rel);
      return;
    }
    while (g_eager.load(std::memory_order_acquire) > 0) std::this_thread::yield();
    lock_.lock();
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

// Completes `req`, started under `lock` (the transport's): MPI_Wait holding it, or, for a patient
// thread, MPI_Test polls that let go of the lock and yield the core in between, so that a rank's
// background reduction thread leaves the core to the compute thread while its peers are still
// computing (MPI's blocking calls poll at full speed), and leaves the transport to it: the compute
// thread's own blocking calls progress the patient thread's request too. Sleeping instead of
// yielding starves the transfer itself: a large message moves in fragments, each progressed by a
// poll (measured: 0.11 s instead of 0.05 s left after the backward for 108 MB).
Status finish(MPI_Request& req, const char* what, Access& access) {
  if (!t_patient) return check(MPI_Wait(&req, MPI_STATUS_IGNORE), what);
  for (int spins = 0;; ++spins) {
    int done = 0;
    HP_TRY(check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what));
    if (done) return {};
    // The request stays unfinished: the rank is stopping and exits without MPI_Finalize.
    if (cancelled()) return Error(Errc::runtime, fmt::format("{}: cancelled (stopping)", what));
    access.release();
    if (spins > 64) std::this_thread::yield();
    access.acquire();
  }
}

// Two threads of a rank may use the transport at once (a training rank's gradient-reduction thread
// beside the compute thread's tensor- or expert-parallel collectives), while MPI_THREAD_SERIALIZED
// allows one MPI call at a time: every call is made holding mu_. Only the compute thread blocks
// inside MPI holding it; a patient thread holds it for one call at a time (finish), so no rank's
// lock ever waits on another rank's thread that waits on a lock (which, with two threads per rank,
// could close a cycle across ranks). A patient thread therefore must not create a communicator
// (MPI_Comm_create_group blocks): its groups are connect()ed by the compute thread beforehand.
class MpiTransport : public Transport {
 public:
  bool serialized = false;  ///< MPI granted MPI_THREAD_SERIALIZED
  bool any_thread() const override { return serialized; }
  MpiTransport() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status allreduce(const std::vector<int>& group, const void* in, void* buf, std::int64_t count,
                   int dtype, ReduceOp op) override {
    Access lock(mu_);
    HP_ASSIGN_OR_RETURN(auto c, comm(group));
    auto t = mpi_type(dtype);
    if (!t) return std::move(t).error();
    auto n = count_of(count);
    if (!n) return std::move(n).error();
    if (t_patient) {
      MPI_Request req = MPI_REQUEST_NULL;
      HP_TRY(check(MPI_Iallreduce(in == buf ? MPI_IN_PLACE : in, buf, *n, *t, mpi_op(op), c, &req),
                   "MPI_Iallreduce"));
      return finish(req, "MPI_Iallreduce", lock);
    }
    return check(MPI_Allreduce(in == buf ? MPI_IN_PLACE : in, buf, *n, *t, mpi_op(op), c),
                 "MPI_Allreduce");
  }
  Status allgather(const std::vector<int>& group, const void* in, void* out,
                   std::int64_t bytes) override {
    Access lock(mu_);
    HP_ASSIGN_OR_RETURN(auto c, comm(group));
    auto n = count_of(bytes);
    if (!n) return std::move(n).error();
    if (t_patient) {  // ZeRO-3's gathering threads: never blocked in MPI holding the lock
      MPI_Request req = MPI_REQUEST_NULL;
      HP_TRY(check(MPI_Iallgather(in, *n, MPI_BYTE, out, *n, MPI_BYTE, c, &req), "MPI_Iallgather"));
      return finish(req, "MPI_Iallgather", lock);
    }
    return check(MPI_Allgather(in, *n, MPI_BYTE, out, *n, MPI_BYTE, c), "MPI_Allgather");
  }
  Status reduce_scatter(const std::vector<int>& group, const void* in, void* out,
                        std::int64_t count, int dtype, ReduceOp op) override {
    Access lock(mu_);
    HP_ASSIGN_OR_RETURN(auto c, comm(group));
    auto t = mpi_type(dtype);
    if (!t) return std::move(t).error();
    auto n = count_of(count);
    if (!n) return std::move(n).error();
    if (t_patient) {
      MPI_Request req = MPI_REQUEST_NULL;
      HP_TRY(check(MPI_Ireduce_scatter_block(in, out, *n, *t, mpi_op(op), c, &req),
                   "MPI_Ireduce_scatter_block"));
      return finish(req, "MPI_Ireduce_scatter_block", lock);
    }
    return check(MPI_Reduce_scatter_block(in, out, *n, *t, mpi_op(op), c),
                 "MPI_Reduce_scatter_block");
  }
  Status alltoall(const std::vector<int>& group, const void* in, void* out,
                  std::int64_t bytes) override {
    Access lock(mu_);
    HP_ASSIGN_OR_RETURN(auto c, comm(group));
    auto n = count_of(bytes);
    if (!n) return std::move(n).error();
    return check(MPI_Alltoall(in, *n, MPI_BYTE, out, *n, MPI_BYTE, c), "MPI_Alltoall");
  }
  Status alltoallv(const std::vector<int>& group, const void* in,
                   const std::vector<std::int64_t>& send_bytes, void* out,
                   const std::vector<std::int64_t>& recv_bytes) override {
    const std::size_t p = group.size();
    if (send_bytes.size() != p || recv_bytes.size() != p)
      return Error(Errc::internal, "alltoallv: a block size per member is needed");
    std::vector<int> sc(p), sd(p), rc(p), rd(p);
    std::int64_t s_at = 0, r_at = 0;
    for (std::size_t j = 0; j < p; ++j) {
      HP_ASSIGN_OR_RETURN(sc[j], count_of(send_bytes[j]));
      HP_ASSIGN_OR_RETURN(sd[j], count_of(s_at));
      HP_ASSIGN_OR_RETURN(rc[j], count_of(recv_bytes[j]));
      HP_ASSIGN_OR_RETURN(rd[j], count_of(r_at));
      s_at += send_bytes[j];
      r_at += recv_bytes[j];
    }
    Access lock(mu_);
    HP_ASSIGN_OR_RETURN(auto c, comm(group));
    return check(
        MPI_Alltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE, c),
        "MPI_Alltoallv");
  }
  Status send(int peer, int tag, const void* buf, std::int64_t bytes) override {
    Access lock(mu_);
    HP_ASSIGN_OR_RETURN(auto n, count_of(bytes));
    HP_TRY(reap(false));
    auto& p = pending_.emplace_back();
    const auto* b = static_cast<const unsigned char*>(buf);
    p.data.assign(b, b + bytes);
    return check(MPI_Isend(p.data.data(), n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &p.req),
                 "MPI_Isend");
  }
  Status recv(int peer, int tag, void* buf, std::int64_t bytes) override {
    Access lock(mu_);
    HP_ASSIGN_OR_RETURN(auto n, count_of(bytes));
    MPI_Status st;
    HP_TRY(check(MPI_Recv(buf, n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &st), "MPI_Recv"));
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (got != n)
      return Error(Errc::runtime,
                   fmt::format("rank {} expected {} bytes with tag {} from rank {}, got {}", rank_,
                               n, tag, peer, got));
    return {};
  }
  Status sendrecv(int dst, const void* sbuf, int src, void* rbuf, std::int64_t bytes,
                  int tag) override {
    Access lock(mu_);
    HP_ASSIGN_OR_RETURN(auto n, count_of(bytes));
    return check(MPI_Sendrecv(sbuf, dst < 0 ? 0 : n, MPI_BYTE, dst < 0 ? MPI_PROC_NULL : dst, tag,
                              rbuf, src < 0 ? 0 : n, MPI_BYTE, src < 0 ? MPI_PROC_NULL : src, tag,
                              MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                 "MPI_Sendrecv");
  }
  Status flush() override {
    Access lock(mu_);
    return reap(true);
  }
  Expected<bool> progress() override {
    Access lock(mu_);
    HP_TRY(reap(false));
    return !pending_.empty();
  }
  Status connect(const std::vector<int>& group) override {
    Access lock(mu_);
    HP_ASSIGN_OR_RETURN(auto c, comm(group));
    (void)c;
    return {};
  }

  void free_comms() {
    Access lock(mu_);
    (void)reap(true);
    for (auto& [g, c] : comms_)
      if (c != MPI_COMM_WORLD && c != MPI_COMM_NULL) MPI_Comm_free(&c);
    comms_.clear();
  }

 private:
  struct Pending {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<unsigned char> data;
  };

  // Completes finished sends (all of them when `all`), freeing their copies.
  Status reap(bool all) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      MPI_Status st;
      if (all) {
        HP_TRY(check(MPI_Wait(&it->req, &st), "MPI_Wait (send)"));
        done = 1;
      } else {
        HP_TRY(check(MPI_Test(&it->req, &done, &st), "MPI_Test (send)"));
      }
      it = done ? pending_.erase(it) : std::next(it);
    }
    return {};
  }

  Expected<MPI_Comm> comm(const std::vector<int>& group) {
    const int ch = channel();
    auto it = comms_.find({ch, group});
    if (it != comms_.end()) return it->second;
    bool identity = ch == 0 && static_cast<int>(group.size()) == size_;
    for (std::size_t i = 0; identity && i < group.size(); ++i)
      identity = group[i] == static_cast<int>(i);
    MPI_Comm c = MPI_COMM_WORLD;
    if (!identity) {
      MPI_Group world_group, g;
      MPI_Comm_group(MPI_COMM_WORLD, &world_group);
      HP_TRY(check(MPI_Group_incl(world_group, static_cast<int>(group.size()), group.data(), &g),
                   "MPI_Group_incl"));
      // The tag separates creations of different groups that share members.
      int tag = ch % 30000;
      for (int r : group) tag = (tag * 131 + r + 1) % 30000;
      Status s = check(MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &c), "MPI_Comm_create_group");
      MPI_Group_free(&g);
      MPI_Group_free(&world_group);
      HP_TRY(s);
      MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    }
    comms_.emplace(std::make_pair(ch, group), c);
    return c;
  }

  std::mutex mu_;
  int rank_ = 0, size_ = 1;
  std::map<std::pair<int, std::vector<int>>, MPI_Comm> comms_;  ///< by channel, group
  std::list<Pending> pending_;
};

MpiTransport* g_world = nullptr;

}  // namespace

Expected<Transport*> mpi_world() {
  if (g_world) return static_cast<Transport*>(g_world);
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    // SERIALIZED: a training rank reduces gradients on a second thread while the first runs the
    // backward (hp/train/data_parallel.h), the two never calling MPI at once.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      return Error(Errc::runtime, "MPI_Init_thread failed");
  }
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  g_world = new MpiTransport();
  g_world->serialized = level >= MPI_THREAD_SERIALIZED;
  return static_cast<Transport*>(g_world);
}

int mpi_appnum() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return -1;
  int* v = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &v, &flag);
  return flag && v ? *v : -1;
}

void set_patient_waits(bool patient) { t_patient = patient; }

void mpi_finalize() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) return;
  if (g_world) g_world->free_comms();
  MPI_Finalize();
}

void mpi_abort(int code) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace hp::comm
