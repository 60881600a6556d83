// Routed expert dispatch and combine (hp_domain.h's Dispatch and Combine): a token goes only to
// the members holding the experts its router chose, and comes back from them, with one
// all-to-all of block counts and one of variable-sized blocks each way (docs/training.md, "Expert
// parallelism"). Both ops work the routing out from the indices alone, so Combine needs nothing
// Dispatch kept: it exchanges the counts again (p x m integers) rather than holding state between
// the two nodes, which may be a forward and its backward, or two layers apart.
//
// Row order, which both ops and their gradients (libs/train/src/rules_comm.cpp) rely on: the rows
// for member q go out expert by expert (q's local experts in order), each expert's rows in token
// order; a member's output for local expert e is its rows from member 0, then member 1, ...
#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "comm_plan.h"
#include "hp/comm/comm.h"
#include "hp/core/hp_domain.h"

namespace hp::comm {

Status Transport::alltoallv(const std::vector<int>& group, const void* in,
                            const std::vector<std::int64_t>& send_bytes, void* out,
                            const std::vector<std::int64_t>& recv_bytes) {
  const std::size_t p = group.size();
  if (send_bytes.size() != p || recv_bytes.size() != p)
    return Error(Errc::internal, "alltoallv: a block size per member is needed");
  std::int64_t block = 0;
  for (std::size_t j = 0; j < p; ++j) block = std::max({block, send_bytes[j], recv_bytes[j]});
  HP_TRY(allreduce(group, &block, &block, 1, HP_I64, ReduceOp::max));
  if (block == 0) return {};
  const auto b = static_cast<std::size_t>(block);
  std::vector<unsigned char> padded(p * b), got(p * b);
  const auto* src = static_cast<const unsigned char*>(in);
  for (std::size_t j = 0; j < p; ++j) {
    if (send_bytes[j] > 0)  // a member with nothing to send may pass no buffer at all
      std::memcpy(padded.data() + j * b, src, static_cast<std::size_t>(send_bytes[j]));
    src += send_bytes[j];
  }
  HP_TRY(alltoall(group, padded.data(), got.data(), block));
  auto* dst = static_cast<unsigned char*>(out);
  for (std::size_t j = 0; j < p; ++j) {
    if (recv_bytes[j] > 0)
      std::memcpy(dst, got.data() + j * b, static_cast<std::size_t>(recv_bytes[j]));
    dst += recv_bytes[j];
  }
  return {};
}

namespace {

/// Which of this member's tokens go to each expert, from the indices I [T, k].
struct Routing {
  std::int64_t tokens = 0;
  std::vector<std::vector<std::int64_t>> of;  ///< per global expert: its tokens, ascending
};

Expected<Routing> routing(const CommNode& n, const CommTensor& idx, std::int64_t experts) {
  if (idx.dims.size() != 2 || (idx.dtype != HP_I64 && idx.dtype != HP_I32))
    return comm_node_error(n, "the expert indices must be an int64 or int32 tensor [tokens, k]");
  Routing r;
  r.tokens = idx.dims[0];
  r.of.resize(static_cast<std::size_t>(experts));
  const std::int64_t k = idx.dims[1];
  for (std::int64_t t = 0; t < r.tokens; ++t)
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t at = t * k + j;
      const std::int64_t e = idx.dtype == HP_I64 ? static_cast<const std::int64_t*>(idx.data)[at]
                                                 : static_cast<const std::int32_t*>(idx.data)[at];
      if (e < 0 || e >= experts)
        return comm_node_error(n,
                               fmt::format("token {} is routed to expert {} of {}", t, e, experts));
      auto& list = r.of[static_cast<std::size_t>(e)];
      if (list.empty() || list.back() != t) list.push_back(t);  // an expert chosen twice: once
    }
  return r;
}

}  // namespace

namespace {

/// What a member checks before any exchange: the indices, and the rows' dims. Fills the routing
/// and the row (its dims after the token axis, or after the expert axis of a stacked tensor).
Status check_local(const CommPlan& pl, const CommNode& n, const std::vector<CommTensor>& in,
                   std::size_t n_x, Routing& r, std::vector<std::int64_t>& rest,
                   std::int64_t& row) {
  if (in.size() != n_x + 1 || in.back().dtype < 0)
    return comm_node_error(
        n, fmt::format("hp.{} takes {} tensors and the expert indices", n.op_type, n_x));
  HP_ASSIGN_OR_RETURN(r, routing(n, in.back(), pl.experts));
  const CommTensor& x0 = in.front();
  const int esize = exec::dtype_size(x0.dtype);
  const bool dispatch = pl.kind == CommKind::dispatch;
  const std::size_t lead = dispatch && pl.stacked ? 2 : 1;
  if (esize == 0 || x0.dims.size() < lead)
    return comm_node_error(n, pl.stacked ? "a stacked tensor needs a token and an expert axis"
                                         : "the rows to route must be a tensor of rank 1 or more");
  rest.assign(x0.dims.begin() + static_cast<std::ptrdiff_t>(lead), x0.dims.end());
  row = esize;
  for (std::int64_t d : rest) row *= d;
  if (dispatch && (x0.dims[0] != r.tokens || (pl.stacked && x0.dims[1] != pl.experts)))
    return comm_node_error(
        n, fmt::format("{} rows for {} routed tokens{}", x0.dims[0], r.tokens,
                       pl.stacked ? fmt::format(" and {} experts", pl.experts) : ""));
  return {};
}

}  // namespace

// A member that cannot route still takes part in the exchanges up to the point where every member
// knows: the counts carry a failure flag, and a flag is all-reduced before the rows move, so a
// fault on one member ends the op on all of them instead of leaving the others blocked.
Status TransportCommOps::route(const CommPlan& pl, const CommNode& n,
                               const std::vector<CommTensor>& in, const CommAlloc& alloc) {
  const auto p = static_cast<std::int64_t>(pl.group.size());
  const std::int64_t m = pl.experts / p;  // experts per member
  const bool dispatch = pl.kind == CommKind::dispatch;
  const std::size_t n_x = dispatch ? 1 : static_cast<std::size_t>(m);
  Routing r;
  std::vector<std::int64_t> rest;
  std::int64_t row = 0;
  Status local = check_local(pl, n, in, n_x, r, rest, row);
  // What this member sends to each member's experts (its tokens), and what it holds of every
  // member's tokens for its own: the second is the first, exchanged. Per member, m counts and a
  // flag (1: this member failed).
  const std::int64_t stride = m + 1;
  std::vector<std::int64_t> mine(static_cast<std::size_t>(p * stride)), theirs(mine.size());
  for (std::int64_t q = 0; q < p; ++q) {
    for (std::int64_t e = 0; local && e < m; ++e)
      mine[static_cast<std::size_t>(q * stride + e)] =
          static_cast<std::int64_t>(r.of[static_cast<std::size_t>(q * m + e)].size());
    mine[static_cast<std::size_t>(q * stride + m)] = local ? 0 : 1;
  }
  HP_TRY(t_.alltoall(pl.group, mine.data(), theirs.data(),
                     stride * static_cast<std::int64_t>(sizeof(std::int64_t))));
  HP_TRY(std::move(local));
  for (std::int64_t q = 0; q < p; ++q)
    if (theirs[static_cast<std::size_t>(q * stride + m)] != 0)
      return comm_node_error(n, fmt::format("member {} of the group could not route its tokens "
                                            "(its own error says why)",
                                            q));
  auto count = [&](const std::vector<std::int64_t>& c, std::int64_t q, std::int64_t e) {
    return c[static_cast<std::size_t>(q * stride + e)];
  };
  const CommTensor& x0 = in.front();
  std::vector<std::int64_t> out_bytes(static_cast<std::size_t>(p)),
      in_bytes(static_cast<std::size_t>(p));
  // Dispatch sends `mine` and receives `theirs`; Combine the reverse.
  const auto& sends = dispatch ? mine : theirs;
  const auto& recvs = dispatch ? theirs : mine;
  std::int64_t sent = 0, got = 0;
  for (std::int64_t q = 0; q < p; ++q) {
    for (std::int64_t e = 0; e < m; ++e) {
      out_bytes[static_cast<std::size_t>(q)] += count(sends, q, e) * row;
      in_bytes[static_cast<std::size_t>(q)] += count(recvs, q, e) * row;
    }
    sent += out_bytes[static_cast<std::size_t>(q)];
    got += in_bytes[static_cast<std::size_t>(q)];
  }
  // What needs the counts: Combine's inputs are the rows Dispatch gave, and the exchange's byte
  // offsets fit the transport's int counts (MPI's). Then every member agrees before the rows move.
  Status ready;
  if (sent > INT32_MAX || got > INT32_MAX)
    ready = comm_node_error(n, fmt::format("{} bytes to send and {} to receive exceed one "
                                           "exchange's 2 GiB",
                                           sent, got));
  for (std::int64_t e = 0; ready && !dispatch && e < m; ++e) {
    const CommTensor& y = in[static_cast<std::size_t>(e)];
    std::int64_t rows = 0;
    for (std::int64_t q = 0; q < p; ++q) rows += count(theirs, q, e);
    if (y.dtype != x0.dtype || y.dims.empty() || y.dims[0] != rows ||
        !std::equal(y.dims.begin() + 1, y.dims.end(), rest.begin(), rest.end()))
      ready = comm_node_error(
          n, fmt::format("expert {}'s output has dims {}; {} rows like expert {}'s were routed "
                         "to it",
                         pl.pos * m + e, exec::dims_label({y.dims.begin(), y.dims.end()}), rows,
                         pl.pos * m));
  }
  std::int64_t failed = ready ? 0 : 1;
  HP_TRY(t_.allreduce(pl.group, &failed, &failed, 1, HP_I64, ReduceOp::max));
  HP_TRY(std::move(ready));
  if (failed) return comm_node_error(n, "another member of the group could not exchange its rows");
  pack_.resize(static_cast<std::size_t>(sent));
  got_.resize(static_cast<std::size_t>(got));

  if (dispatch) {
    const auto* src = static_cast<const unsigned char*>(x0.data);
    unsigned char* at = pack_.data();
    for (std::int64_t e = 0; e < p * m; ++e)
      for (std::int64_t t : r.of[static_cast<std::size_t>(e)]) {
        const std::int64_t from = pl.stacked ? t * pl.experts + e : t;
        std::memcpy(at, src + from * row, static_cast<std::size_t>(row));
        at += row;
      }
    HP_TRY(t_.alltoallv(pl.group, pack_.data(), out_bytes, got_.data(), in_bytes));
    // Output e: its rows from member 0, member 1, ...; they lie expert-major within each member.
    std::vector<unsigned char*> ys(static_cast<std::size_t>(m));
    for (std::int64_t e = 0; e < m; ++e) {
      std::int64_t rows = 0;
      for (std::int64_t q = 0; q < p; ++q) rows += count(theirs, q, e);
      std::vector<std::int64_t> dims{rows};
      dims.insert(dims.end(), rest.begin(), rest.end());
      HP_ASSIGN_OR_RETURN(void* y, alloc(static_cast<std::size_t>(e), x0.dtype, dims, -1));
      ys[static_cast<std::size_t>(e)] = static_cast<unsigned char*>(y);
    }
    const unsigned char* from = got_.data();
    for (std::int64_t q = 0; q < p; ++q)
      for (std::int64_t e = 0; e < m; ++e) {
        const std::int64_t bytes = count(theirs, q, e) * row;
        if (bytes)
          std::memcpy(ys[static_cast<std::size_t>(e)], from, static_cast<std::size_t>(bytes));
        ys[static_cast<std::size_t>(e)] += bytes;
        from += bytes;
      }
    return {};
  }

  // Combine: every input is one local expert's rows, as Dispatch laid them out (checked above).
  unsigned char* at = pack_.data();
  std::vector<std::int64_t> used(static_cast<std::size_t>(m));
  for (std::int64_t q = 0; q < p; ++q)
    for (std::int64_t e = 0; e < m; ++e) {
      const std::int64_t bytes = count(theirs, q, e) * row;
      const auto* y = static_cast<const unsigned char*>(in[static_cast<std::size_t>(e)].data);
      if (bytes)
        std::memcpy(at, y + used[static_cast<std::size_t>(e)], static_cast<std::size_t>(bytes));
      used[static_cast<std::size_t>(e)] += bytes;
      at += bytes;
    }
  HP_TRY(t_.alltoallv(pl.group, pack_.data(), out_bytes, got_.data(), in_bytes));
  std::vector<std::int64_t> dims{r.tokens, pl.experts};
  dims.insert(dims.end(), rest.begin(), rest.end());
  HP_ASSIGN_OR_RETURN(void* zp, alloc(0, x0.dtype, dims, -1));
  auto* z = static_cast<unsigned char*>(zp);
  if (r.tokens * row > 0) std::memset(z, 0, static_cast<std::size_t>(r.tokens * pl.experts * row));
  const unsigned char* from = got_.data();
  for (std::int64_t e = 0; e < p * m; ++e)
    for (std::int64_t t : r.of[static_cast<std::size_t>(e)]) {
      std::memcpy(z + (t * pl.experts + e) * row, from, static_cast<std::size_t>(row));
      from += row;
    }
  return {};
}

}  // namespace hp::comm
