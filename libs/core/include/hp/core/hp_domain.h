// The "hp" ONNX domain: communication nodes that `hp shard` writes into per-rank partitions and the
// runtime's comm layer executes. This header is the contract between the two; both sides use these
// names, so a partition written by one hp runs on another.
//
// Every node lives in domain "hp" (the model imports opset {domain "hp", version 1}). Attributes:
//
//   group   ints    the ordered global ranks taking part. The order is the chunk order: AllGather
//                   concatenates member i's chunk at position i, ReduceScatter/AllToAll give member
//                   i chunk i. It need not be ascending (docs/shard.md, "Group member ordering");
//                   the comm layer permutes chunks when its communicator orders ranks differently.
//   group_name string  optional; a manifest group name for logs.
//
// clang-format off
//   AllReduce      X -> Y (same shape)            op: "sum" | "max" | "min" | "avg" | "prod"
//   AllGather      X -> Y, Y.shape[axis] = p * X.shape[axis]               axis: int
//   ReduceScatter  X -> Y, Y.shape[axis] = X.shape[axis] / p         axis: int, op as AllReduce
//   AllToAll       X -> Y: X is split into p chunks along split_axis, chunk j goes to group[j];
//                  the p chunks received are concatenated along concat_axis in group order.
//                                                 split_axis: int, concat_axis: int
//   CollectivePermute X -> Y: pairs = [src0, dst0, src1, dst1, ...] (global ranks); each rank
//                  sends X to its dst and receives Y from its src; a rank with no src gets zeros
//                  of X's shape.
//   Send           X -> (no outputs)              peer: int (global rank), tag: int
//   Recv           (no inputs) -> Y               peer: int, tag: int, dtype: int (TensorProto
//                                                 type), shape: ints
//   Dispatch       X, I -> Y_0 .. Y_{m-1}: routed expert dispatch (expert parallelism). I [T, k]
//                  (int64) names each of this member's T tokens' k experts out of `experts` E,
//                  which the group shares out in blocks of m = E / p (member j holds experts
//                  [j*m, (j+1)*m)). Y_e holds, for this member's local expert e, the rows routed to
//                  it from every member, in member order and token order within a member. X is
//                  [T, ...] (one row per token, `stacked` 0) or [T, E, ...] (row (t, e) for the
//                  pair, `stacked` 1).      experts: int, stacked: int
//   Combine        Y_0 .. Y_{m-1}, I -> Z [T, E, ...]: Dispatch's inverse: the rows come back to
//                  the members whose tokens they are and land at (t, e); pairs not routed are 0.
//                                                 experts: int
// clang-format on
//
// Send/Recv tags: pipeline stages use tag = micro_batch * 4096 + tensor index, so several in-flight
// micro-batches never match the wrong message.
#pragma once

#include <string_view>

namespace hp::domain {

inline constexpr std::string_view kDomain = "hp";
inline constexpr int kOpsetVersion = 1;

inline constexpr std::string_view kAllReduce = "AllReduce";
inline constexpr std::string_view kAllGather = "AllGather";
inline constexpr std::string_view kReduceScatter = "ReduceScatter";
inline constexpr std::string_view kAllToAll = "AllToAll";
inline constexpr std::string_view kCollectivePermute = "CollectivePermute";
inline constexpr std::string_view kSend = "Send";
inline constexpr std::string_view kRecv = "Recv";
inline constexpr std::string_view kDispatch = "Dispatch";
inline constexpr std::string_view kCombine = "Combine";

inline constexpr std::string_view kAttrGroup = "group";
inline constexpr std::string_view kAttrGroupName = "group_name";
inline constexpr std::string_view kAttrOp = "op";
inline constexpr std::string_view kAttrAxis = "axis";
inline constexpr std::string_view kAttrSplitAxis = "split_axis";
inline constexpr std::string_view kAttrConcatAxis = "concat_axis";
inline constexpr std::string_view kAttrPairs = "pairs";
inline constexpr std::string_view kAttrPeer = "peer";
inline constexpr std::string_view kAttrTag = "tag";
inline constexpr std::string_view kAttrDtype = "dtype";
inline constexpr std::string_view kAttrShape = "shape";
inline constexpr std::string_view kAttrExperts = "experts";
inline constexpr std::string_view kAttrStacked = "stacked";

}  // namespace hp::domain
