// The parsed form of an hp-domain node's attributes (hp_domain.h), made once per node by
// TransportCommOps and kept by it per node: parsing the text attributes and checking the group on
// every step costs as much as a small AllReduce itself. What depends on the input (axis against its
// rank, dtype reducible, divisibility) is still checked per call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/comm/comm.h"
#include "hp/core/expected.h"

namespace hp::comm {

enum class CommKind {
  all_reduce,
  all_gather,
  reduce_scatter,
  all_to_all,
  permute,
  send,
  recv,
  dispatch,
  combine
};

struct CommPlan {
  std::string op_type;  ///< the node's, to tell a cached plan still fits the node at its address
  std::vector<std::pair<std::string, std::string>> attrs;
  CommKind kind = CommKind::all_reduce;
  std::vector<int> group;                                  ///< collectives: the ordered members
  int pos = -1;                                            ///< this rank's member position
  ReduceOp op = ReduceOp::sum;                             ///< AllReduce, ReduceScatter
  std::int64_t axis = 0, split_axis = 0, concat_axis = 0;  ///< as written (may be negative)
  int peer = -1, tag = 0;                                  ///< Send, Recv
  int recv_dtype = -1;                                     ///< Recv: hp_dtype
  std::vector<std::int64_t> recv_shape;
  int permute_src = -1, permute_dst = -1;  ///< CollectivePermute: -1 when this rank has none
  std::int64_t experts = 0;                ///< Dispatch, Combine: E, a multiple of the group
  bool stacked = false;                    ///< Dispatch: X is [T, E, ...]
};

/// Parses `node` for rank `me` of `world`. Errc::bad_input naming the node for anything malformed.
Expected<CommPlan> make_comm_plan(const CommNode& node, int me, int world);

/// The node's error: Errc::bad_input with where = "node 'NAME' (hp.OP)".
Error comm_node_error(const CommNode& node, std::string message);

}  // namespace hp::comm
