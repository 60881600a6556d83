// Attribute parsing of hp-domain nodes into a CommPlan (comm_plan.h).
#include "comm_plan.h"

#include <fmt/core.h>

#include <cstdlib>
#include <optional>

#include "hp/core/hp_domain.h"

namespace hp::comm {

Expected<ReduceOp> parse_reduce_op(const std::string& name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "max") return ReduceOp::max;
  if (name == "min") return ReduceOp::min;
  if (name == "avg") return ReduceOp::avg;
  if (name == "prod") return ReduceOp::prod;
  return Error(Errc::bad_input, fmt::format("unknown reduction '{}'", name), "",
               "op is sum, max, min, avg or prod");
}

Expected<std::vector<std::int64_t>> parse_int_list(const std::string& text,
                                                   const std::string& what) {
  std::vector<std::int64_t> v;
  if (text.empty()) return v;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    char* stop = nullptr;
    long long x = std::strtoll(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0')
      return Error(Errc::bad_input,
                   fmt::format("attribute '{}' is not a list of integers: '{}'", what, text));
    v.push_back(x);
    pos = end + 1;
  }
  return v;
}

Error comm_node_error(const CommNode& n, std::string msg) {
  return Error(Errc::bad_input, std::move(msg),
               fmt::format("node '{}' (hp.{})", n.name, n.op_type));
}

namespace {

const std::string* find_attr(const CommNode& n, std::string_view name) {
  for (const auto& [k, v] : n.attrs)
    if (k == name) return &v;
  return nullptr;
}

Expected<std::int64_t> int_attr(const CommNode& n, std::string_view name,
                                std::optional<std::int64_t> def = {}) {
  const std::string* v = find_attr(n, name);
  if (!v) {
    if (def) return *def;
    return comm_node_error(n, fmt::format("attribute '{}' is missing", name));
  }
  auto l = parse_int_list(*v, std::string(name));
  if (!l || l->size() != 1)
    return comm_node_error(n, fmt::format("attribute '{}' is not an integer: '{}'", name, *v));
  return l->front();
}

Status parse_group(const CommNode& n, int me, int world, CommPlan& p) {
  const std::string* v = find_attr(n, domain::kAttrGroup);
  if (!v) return comm_node_error(n, "attribute 'group' is missing");
  auto l = parse_int_list(*v, "group");
  if (!l) return comm_node_error(n, l.error().message());
  for (std::int64_t r : *l) {
    if (r < 0 || r >= world)
      return comm_node_error(
          n, fmt::format("group rank {} is outside the job's ranks 0..{}", r, world - 1));
    for (int q : p.group)
      if (q == r) return comm_node_error(n, fmt::format("group lists rank {} twice", r));
    if (r == me) p.pos = static_cast<int>(p.group.size());
    p.group.push_back(static_cast<int>(r));
  }
  if (p.pos < 0)
    return comm_node_error(
        n, fmt::format("rank {} runs this node but is not in its group [{}]", me, *v));
  return {};
}

Status parse_op(const CommNode& n, CommPlan& p) {
  const std::string* v = find_attr(n, domain::kAttrOp);
  auto op = parse_reduce_op(v ? *v : "sum");
  if (!op) return comm_node_error(n, op.error().message());
  p.op = *op;
  return {};
}

Status parse_point_to_point(const CommNode& n, int me, int world, CommPlan& p) {
  HP_ASSIGN_OR_RETURN(auto peer, int_attr(n, domain::kAttrPeer));
  auto tag = int_attr(n, domain::kAttrTag, 0);
  if (!tag) return std::move(tag).error();
  // A rank may send to itself: with interleaved stages its later model chunk reads what an earlier
  // one produced (the message is buffered, as every send is).
  if (peer < 0 || peer >= world)
    return comm_node_error(n, fmt::format("peer {} is not a rank of the job (0..{}, this is {})",
                                          peer, world - 1, me));
  if (*tag < 0 || *tag >= 4096)
    return comm_node_error(n, fmt::format("tag {} is outside 0..4095", *tag));
  p.peer = static_cast<int>(peer);
  p.tag = static_cast<int>(*tag);
  if (p.kind == CommKind::send) return {};
  auto onnx_type = int_attr(n, domain::kAttrDtype);
  if (!onnx_type) return std::move(onnx_type).error();
  p.recv_dtype = exec::dtype_from_onnx(static_cast<std::int32_t>(*onnx_type));
  if (p.recv_dtype < 0 || exec::dtype_size(p.recv_dtype) == 0)
    return comm_node_error(n, fmt::format("dtype {} cannot be received", *onnx_type));
  const std::string* shape = find_attr(n, domain::kAttrShape);
  auto dims = parse_int_list(shape ? *shape : "", "shape");
  if (!dims) return comm_node_error(n, dims.error().message());
  for (auto d : *dims)
    if (d < 0) return comm_node_error(n, fmt::format("shape [{}] has a negative dim", *shape));
  p.recv_shape = std::move(*dims);
  return {};
}

Status parse_pairs(const CommNode& n, int me, int world, CommPlan& p) {
  const std::string* pv = find_attr(n, domain::kAttrPairs);
  auto pairs = parse_int_list(pv ? *pv : "", "pairs");
  if (!pairs) return comm_node_error(n, pairs.error().message());
  if (pairs->size() % 2)
    return comm_node_error(n, "attribute 'pairs' needs an even number of ranks (src, dst, ...)");
  for (std::size_t i = 0; i < pairs->size(); i += 2) {
    const auto s = (*pairs)[i], d = (*pairs)[i + 1];
    if (s < 0 || s >= world || d < 0 || d >= world)
      return comm_node_error(
          n, fmt::format("pair ({}, {}) names a rank outside 0..{}", s, d, world - 1));
    if (s == me) {
      if (p.permute_dst >= 0)
        return comm_node_error(n, fmt::format("rank {} is a source twice in 'pairs'", me));
      p.permute_dst = static_cast<int>(d);
    }
    if (d == me) {
      if (p.permute_src >= 0)
        return comm_node_error(n, fmt::format("rank {} is a destination twice in 'pairs'", me));
      p.permute_src = static_cast<int>(s);
    }
  }
  return {};
}

Expected<CommKind> kind_of(const CommNode& n) {
  const std::string& t = n.op_type;
  if (t == domain::kAllReduce) return CommKind::all_reduce;
  if (t == domain::kAllGather) return CommKind::all_gather;
  if (t == domain::kReduceScatter) return CommKind::reduce_scatter;
  if (t == domain::kAllToAll) return CommKind::all_to_all;
  if (t == domain::kCollectivePermute) return CommKind::permute;
  if (t == domain::kSend) return CommKind::send;
  if (t == domain::kRecv) return CommKind::recv;
  if (t == domain::kDispatch) return CommKind::dispatch;
  if (t == domain::kCombine) return CommKind::combine;
  return comm_node_error(n, fmt::format("hp.{} is not an hp-domain op this comm layer knows", t));
}

}  // namespace

Expected<CommPlan> make_comm_plan(const CommNode& n, int me, int world) {
  HP_ASSIGN_OR_RETURN(auto kind, kind_of(n));
  CommPlan p;
  p.op_type = n.op_type;
  p.attrs = n.attrs;
  p.kind = kind;
  switch (p.kind) {
    case CommKind::send:
    case CommKind::recv: HP_TRY(parse_point_to_point(n, me, world, p)); return p;
    case CommKind::permute: HP_TRY(parse_pairs(n, me, world, p)); return p;
    default: break;
  }
  HP_TRY(parse_group(n, me, world, p));
  if (p.kind == CommKind::all_reduce || p.kind == CommKind::reduce_scatter) HP_TRY(parse_op(n, p));
  auto axis = [&](std::string_view name, std::int64_t& into) -> Status {
    auto a = int_attr(n, name, 0);
    if (!a) return std::move(a).error();
    into = *a;
    return {};
  };
  if (p.kind == CommKind::all_gather || p.kind == CommKind::reduce_scatter)
    HP_TRY(axis(domain::kAttrAxis, p.axis));
  if (p.kind == CommKind::all_to_all) {
    HP_TRY(axis(domain::kAttrSplitAxis, p.split_axis));
    HP_TRY(axis(domain::kAttrConcatAxis, p.concat_axis));
  }
  if (p.kind == CommKind::dispatch || p.kind == CommKind::combine) {
    HP_ASSIGN_OR_RETURN(p.experts, int_attr(n, domain::kAttrExperts));
    const auto g = static_cast<std::int64_t>(p.group.size());
    if (p.experts < g || p.experts % g != 0)
      return comm_node_error(
          n, fmt::format("{} experts do not split over a group of {}", p.experts, g));
    HP_ASSIGN_OR_RETURN(auto stacked, int_attr(n, domain::kAttrStacked, 0));
    p.stacked = stacked != 0;
  }
  return p;
}

}  // namespace hp::comm
