// The comm layer: runs the "hp"-domain communication nodes of a rank's partition (hp_domain.h).
//
// Two levels. A Transport moves bytes between global ranks: collectives over an *ordered* group
// (member i of the group is position i of every chunked result, whatever the rank numbers), plus
// tagged point-to-point. Two transports exist: MPI (one process per rank, communicators built per
// ordered group with MPI_Group_incl, so communicator rank == member position, and cached) and an
// in-process one (one thread per rank, exchange through shared memory) for `--simulate` and unit
// tests. On top, make_comm_ops() turns a Transport into the executor's CommOps: it parses the node
// attributes, computes output shapes, packs chunks along the node's axis into contiguous blocks in
// member order, calls the transport and unpacks. All tensor logic is therefore shared and tested
// once with the in-process transport; the MPI transport is a thin byte mover (tests/mpi checks it).
//
// Dtypes: every op moves any dtype; reductions (AllReduce, ReduceScatter) take f32, f64, i32 and
// i64. Pipeline tags: Send/Recv add micro_batch * 4096 to the node's tag (hp_domain.h), where
// micro_batch is set by the worker before each forward (set_micro_batch), so several in-flight
// micro-batches never match the wrong message.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/executor.h"

namespace hp::comm {

// The seam this layer implements, and the tensors it moves (hp/exec/executor.h).
using exec::CommAlloc;
using exec::CommNode;
using exec::CommOps;
using exec::CommTensor;
using exec::HostTensor;

enum class ReduceOp { sum, max, min, avg, prod };
/// "sum" -> ReduceOp::sum, ...; Errc::bad_input for anything else.
Expected<ReduceOp> parse_reduce_op(const std::string& name);

/// Moves bytes between global ranks. Every call is blocking for the calling rank; `group` lists the
/// members in chunk order and must contain rank(). Buffers are host memory.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// out = the reduction of everyone's `in` (`count` elements of hp_dtype `dtype`); in == out is
  /// allowed. avg is done by the caller (sum, then divide).
  virtual Status allreduce(const std::vector<int>& group, const void* in, void* out,
                           std::int64_t count, int dtype, ReduceOp op) = 0;
  /// out = member 0's block, member 1's block, ... (each `bytes` long).
  virtual Status allgather(const std::vector<int>& group, const void* in, void* out,
                           std::int64_t bytes) = 0;
  /// in holds p blocks of `count` elements; member i gets the reduction of everyone's block i.
  virtual Status reduce_scatter(const std::vector<int>& group, const void* in, void* out,
                                std::int64_t count, int dtype, ReduceOp op) = 0;
  /// in holds p blocks of `bytes`; block j goes to member j; out receives member i's block at
  /// position i.
  virtual Status alltoall(const std::vector<int>& group, const void* in, void* out,
                          std::int64_t bytes) = 0;
  /// Blocks of different sizes: `in` holds p blocks back to back, block j (send_bytes[j] long)
  /// for member j; `out` receives member i's block (recv_bytes[i] long) at the sum of the earlier
  /// recv_bytes. Each member's send_bytes[j] must equal member j's recv_bytes[i]. The default pads
  /// every block to the group's largest and runs alltoall (an all-reduce of that size first); the
  /// MPI transport overrides it with MPI_Alltoallv.
  virtual Status alltoallv(const std::vector<int>& group, const void* in,
                           const std::vector<std::int64_t>& send_bytes, void* out,
                           const std::vector<std::int64_t>& recv_bytes);
  /// Point-to-point; send may return before the receiver has the data (the bytes are copied).
  virtual Status send(int peer, int tag, const void* buf, std::int64_t bytes) = 0;
  virtual Status recv(int peer, int tag, void* buf, std::int64_t bytes) = 0;
  /// Sends `sbuf` to `dst` and receives `rbuf` from `src` without ordering deadlocks; -1 skips a
  /// side.
  virtual Status sendrecv(int dst, const void* sbuf, int src, void* rbuf, std::int64_t bytes,
                          int tag) = 0;
  /// Completes outstanding sends (their buffers were copied, so this only bounds memory and
  /// errors).
  virtual Status flush() { return {}; }
  /// Moves outstanding sends on without waiting for them and says whether any is left. A large
  /// message (MPI's rendezvous protocol) moves only while its sender is inside an MPI call: a rank
  /// that sends and then computes calls this now and then from another thread (any_thread) so its
  /// receiver need not wait for the computation to end.
  virtual Expected<bool> progress() { return false; }
  /// Whether calls may come from a thread other than the one that created the transport, one
  /// thread at a time (a training rank's gradient-reduction thread; MPI_THREAD_SERIALIZED).
  virtual bool any_thread() const { return true; }
  /// Collective over `group`: sets up what later calls on it need (an MPI communicator), so that a
  /// background thread's first call on the group cannot block inside the transport while another
  /// thread of the rank waits to use it. Calls on a group not connected do this themselves.
  virtual Status connect(const std::vector<int>& group) {
    (void)group;
    return {};
  }
};

/// Collectives this thread calls from now on use the communicators of `channel` (0 until set).
/// Each member of a group must make its calls on the group in one order. Two threads of a rank that
/// run collectives on the same group at once (a training rank's two gradient-reduction threads,
/// whose groups coincide under HSDP) therefore take different channels: the calls of one (group,
/// channel) keep one order. Every transport honours it, connect() included.
void set_channel(int channel);
/// This thread's channel.
int channel();

/// Collectives and receives this thread makes from now on give up with Errc::runtime once `*flag`
/// is true (null: never). A background thread's owner sets the flag before joining it: a rank that
/// stops on an error can leave that thread waiting in a collective its peers never reach, and
/// joining it would hang the rank instead of letting it report the error and exit.
void set_cancel_flag(const std::atomic<bool>* flag);
/// Whether this thread has a cancel flag (set_cancel_flag), and whether it is set.
bool cancellable();
bool cancelled();

/// Sets this thread's channel for a scope.
class ScopedChannel {
 public:
  explicit ScopedChannel(int c) : old_(channel()) { set_channel(c); }
  ~ScopedChannel() { set_channel(old_); }
  ScopedChannel(const ScopedChannel&) = delete;
  ScopedChannel& operator=(const ScopedChannel&) = delete;

 private:
  int old_;
};

struct CommPlan;

/// The CommOps of a rank on `transport` (not owned; must outlive the result). Each node's
/// attributes are parsed once and the plan kept per node (by address, checked against the node's
/// attributes), so a step's cost is the transport's: inputs are read where they lie, outputs
/// written into the memory the caller hands out, and chunk packing is skipped where a split axis is
/// the outermost one.
class TransportCommOps : public CommOps {
 public:
  explicit TransportCommOps(Transport& transport);
  ~TransportCommOps() override;
  bool handles(const std::string& op_type) const override;
  /// The HostTensor form: outputs are resized in place (a caller that keeps `outputs` reuses
  /// memory).
  Status run(const CommNode& node, const std::vector<const HostTensor*>& inputs,
             std::vector<HostTensor>& outputs) override;
  Status run_into(const CommNode& node, const std::vector<CommTensor>& inputs,
                  const CommAlloc& alloc) override;
  /// Send/Recv tags become tag + micro_batch * 4096 (hp_domain.h).
  void set_micro_batch(int k) { micro_batch_ = k; }
  Transport& transport() { return t_; }

 private:
  Expected<const CommPlan*> plan_for(const CommNode& node);
  /// hp.Dispatch and hp.Combine (comm_route.cpp).
  Status route(const CommPlan& plan, const CommNode& node, const std::vector<CommTensor>& inputs,
               const CommAlloc& alloc);

  Transport& t_;
  int micro_batch_ = 0;
  std::unordered_map<const CommNode*, std::unique_ptr<CommPlan>> plans_;
  std::vector<unsigned char> pack_,
      got_;  ///< chunk packing, reused across calls (warm memory for MPI)
};

/// Parses "0,2,1,3" (an int-list attribute as the executor hands it over). Errc::bad_input when
/// malformed.
Expected<std::vector<std::int64_t>> parse_int_list(const std::string& text,
                                                   const std::string& what);

// ---- MPI ---------------------------------------------------------------------------------------

/// Initialises MPI (MPI_THREAD_SERIALIZED: a training rank's reduction thread takes turns with the
/// executor thread; Transport::any_thread() says whether it was granted) once per
/// process; later calls return the same world. Errc::runtime when MPI_Init fails.
Expected<Transport*> mpi_world();
/// MPI_APPNUM of this process (the mpirun app context index), -1 when unset.
int mpi_appnum();
/// Collectives (all-reduce, reduce-scatter) that this thread calls on the MPI transport from now
/// on wait without spinning: started nonblocking, then polled, yielding the core between polls.
/// A rank's
/// background gradient-reduction thread sets it, so that it does not take the core from the
/// compute thread while its peers are still computing. Other threads keep MPI's blocking calls.
void set_patient_waits(bool patient);
/// Frees cached communicators and finalises MPI (success paths only; see mpi_abort).
void mpi_finalize();
/// MPI_Abort(MPI_COMM_WORLD, code): the whole job stops. Used on every worker error path, because a
/// rank that finalises and exits non-zero while others wait in a collective hangs the job.
[[noreturn]] void mpi_abort(int code);

// ---- in process --------------------------------------------------------------------------------

/// Runs `body(rank, transport)` on `ranks` threads that exchange through shared memory. A rank
/// whose body fails makes every blocked peer fail too (no hang); a blocked call fails after
/// `timeout_s`. Returns the first error by rank order.
Status run_in_process(int ranks, const std::function<Status(int rank, Transport& t)>& body,
                      double timeout_s = 60);

}  // namespace hp::comm
