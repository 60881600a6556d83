// TransportCommOps: the tensor side of the hp-domain ops (hp_domain.h). Parses the node's attributes,
// works out output shapes, packs the chunks of a split axis into contiguous blocks in group-member
// order, and hands bytes to the Transport. Keeping this apart from MPI means the in-process tests
// cover every shape rule, and the MPI transport only moves blocks.
#include <fmt/core.h>

#include <cstdlib>
#include <cstring>
#include <optional>

#include "hp/core/hp_domain.h"
#include "hp/runtime/comm.h"

namespace hp::runtime {

Expected<ReduceOp> parse_reduce_op(const std::string& name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "max") return ReduceOp::max;
  if (name == "min") return ReduceOp::min;
  if (name == "avg") return ReduceOp::avg;
  if (name == "prod") return ReduceOp::prod;
  return Error(Errc::bad_input, fmt::format("unknown reduction '{}'", name), "", "op is sum, max, min, avg or prod");
}

Expected<std::vector<std::int64_t>> parse_int_list(const std::string& text, const std::string& what) {
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
      return Error(Errc::bad_input, fmt::format("attribute '{}' is not a list of integers: '{}'", what, text));
    v.push_back(x);
    pos = end + 1;
  }
  return v;
}

namespace {

const std::string* find_attr(const CommNode& n, std::string_view name) {
  for (const auto& [k, v] : n.attrs)
    if (k == name) return &v;
  return nullptr;
}

Error node_error(const CommNode& n, std::string msg) {
  return Error(Errc::bad_input, std::move(msg), fmt::format("node '{}' (hp.{})", n.name, n.op_type));
}

Expected<std::int64_t> int_attr(const CommNode& n, std::string_view name, std::optional<std::int64_t> def = {}) {
  const std::string* v = find_attr(n, name);
  if (!v) {
    if (def) return *def;
    return node_error(n, fmt::format("attribute '{}' is missing", name));
  }
  auto l = parse_int_list(*v, std::string(name));
  if (!l || l->size() != 1) return node_error(n, fmt::format("attribute '{}' is not an integer: '{}'", name, *v));
  return l->front();
}

struct GroupInfo {
  std::vector<int> ranks;
  int pos = -1;  // this rank's member position
};

Expected<GroupInfo> group_attr(const CommNode& n, int me, int world) {
  const std::string* v = find_attr(n, domain::kAttrGroup);
  if (!v) return node_error(n, "attribute 'group' is missing");
  auto l = parse_int_list(*v, "group");
  if (!l) return node_error(n, l.error().message());
  GroupInfo g;
  for (std::int64_t r : *l) {
    if (r < 0 || r >= world)
      return node_error(n, fmt::format("group rank {} is outside the job's ranks 0..{}", r, world - 1));
    for (int q : g.ranks)
      if (q == r) return node_error(n, fmt::format("group lists rank {} twice", r));
    if (r == me) g.pos = static_cast<int>(g.ranks.size());
    g.ranks.push_back(static_cast<int>(r));
  }
  if (g.pos < 0) return node_error(n, fmt::format("rank {} runs this node but is not in its group [{}]", me, *v));
  return g;
}

Expected<int> axis_attr(const CommNode& n, std::string_view name, std::size_t rank) {
  auto a = int_attr(n, name, 0);
  if (!a) return std::move(a).error();
  std::int64_t ax = *a < 0 ? *a + static_cast<std::int64_t>(rank) : *a;
  if (ax < 0 || ax >= static_cast<std::int64_t>(rank))
    return node_error(n, fmt::format("{} {} is out of range for a rank-{} tensor", name, *a, rank));
  return static_cast<int>(ax);
}

// The byte geometry of splitting a tensor along one axis: `outer` rows of `axis_len * inner` bytes.
struct Geometry {
  std::int64_t outer = 1, axis_len = 1, inner = 1;  // inner in bytes
};
Geometry geometry(const std::vector<std::int64_t>& dims, int axis, int esize) {
  Geometry g;
  for (int i = 0; i < axis; ++i) g.outer *= dims[static_cast<std::size_t>(i)];
  g.axis_len = dims[static_cast<std::size_t>(axis)];
  g.inner = esize;
  for (std::size_t i = static_cast<std::size_t>(axis) + 1; i < dims.size(); ++i) g.inner *= dims[i];
  return g;
}

// Splits `src` (geometry g) into p contiguous blocks, block j = chunk j along the axis.
void pack_chunks(const unsigned char* src, const Geometry& g, int p, unsigned char* dst) {
  const std::int64_t c = g.axis_len / p, row = c * g.inner, block = g.outer * row;
  for (int j = 0; j < p; ++j)
    for (std::int64_t o = 0; o < g.outer; ++o)
      std::memcpy(dst + j * block + o * row, src + o * g.axis_len * g.inner + j * row, static_cast<std::size_t>(row));
}

// Concatenates p contiguous blocks (each of geometry `chunk`) along the axis into `dst`.
void concat_chunks(const unsigned char* src, const Geometry& chunk, int p, unsigned char* dst) {
  const std::int64_t row = chunk.axis_len * chunk.inner, block = chunk.outer * row;
  for (int j = 0; j < p; ++j)
    for (std::int64_t o = 0; o < chunk.outer; ++o)
      std::memcpy(dst + o * p * row + j * row, src + j * block + o * row, static_cast<std::size_t>(row));
}

HostTensor like(const HostTensor& x, std::vector<std::int64_t> dims, const std::string& name) {
  HostTensor t;
  t.name = name;
  t.dtype = x.dtype;
  t.dims = std::move(dims);
  t.data.assign(static_cast<std::size_t>(t.numel() * dtype_size(t.dtype)), 0);
  return t;
}

bool reducible(int dtype) { return dtype == HP_F32 || dtype == HP_F64 || dtype == HP_I32 || dtype == HP_I64; }

void divide(HostTensor& t, int p) {
  const std::int64_t n = t.numel();
  switch (t.dtype) {
    case HP_F32: for (std::int64_t i = 0; i < n; ++i) t.as<float>()[i] /= static_cast<float>(p); break;
    case HP_F64: for (std::int64_t i = 0; i < n; ++i) t.as<double>()[i] /= p; break;
    case HP_I32: for (std::int64_t i = 0; i < n; ++i) t.as<std::int32_t>()[i] /= p; break;
    case HP_I64: for (std::int64_t i = 0; i < n; ++i) t.as<std::int64_t>()[i] /= p; break;
    default: break;
  }
}

Expected<ReduceOp> op_attr(const CommNode& n, int dtype) {
  const std::string* v = find_attr(n, domain::kAttrOp);
  auto op = parse_reduce_op(v ? *v : "sum");
  if (!op) return node_error(n, op.error().message());
  if (!reducible(dtype)) return node_error(n, fmt::format("cannot reduce {} tensors", dtype_label(dtype)));
  return op;
}

Status check_divisible(const CommNode& n, const HostTensor& x, int axis, int p) {
  if (x.dims[static_cast<std::size_t>(axis)] % p != 0)
    return node_error(n, fmt::format("dim {} of {} (size {}) is not divisible by the group size {}", axis,
                                     dims_label(x.dims), x.dims[static_cast<std::size_t>(axis)], p));
  return {};
}

}  // namespace

bool TransportCommOps::handles(const std::string& op) const {
  for (std::string_view k : {domain::kAllReduce, domain::kAllGather, domain::kReduceScatter, domain::kAllToAll,
                             domain::kCollectivePermute, domain::kSend, domain::kRecv})
    if (op == k) return true;
  return false;
}

Status TransportCommOps::run(const CommNode& n, const std::vector<const HostTensor*>& in,
                             std::vector<HostTensor>& out) {
  const int me = t_.rank(), world = t_.size();
  const std::string out_name = n.outputs.empty() ? std::string() : n.outputs.front();
  const bool takes_input = n.op_type != domain::kRecv;
  if (takes_input && (in.empty() || !in.front()))
    return node_error(n, "the node has no input tensor");
  if (n.op_type != domain::kSend && out.empty()) return node_error(n, "the node has no output");
  const HostTensor* x = takes_input ? in.front() : nullptr;
  const int esize = x ? dtype_size(x->dtype) : 0;
  if (x && esize == 0) return node_error(n, fmt::format("cannot communicate {} tensors", dtype_label(x->dtype)));

  if (n.op_type == domain::kSend || n.op_type == domain::kRecv) {
    auto peer = int_attr(n, domain::kAttrPeer);
    if (!peer) return std::move(peer).error();
    auto tag = int_attr(n, domain::kAttrTag, 0);
    if (!tag) return std::move(tag).error();
    // A rank may send to itself: with interleaved stages its later model chunk reads what an earlier
    // one produced (the message is buffered, as every send is).
    if (*peer < 0 || *peer >= world)
      return node_error(n, fmt::format("peer {} is not a rank of the job (0..{}, this is {})", *peer, world - 1, me));
    if (*tag < 0 || *tag >= 4096) return node_error(n, fmt::format("tag {} is outside 0..4095", *tag));
    const int full_tag = micro_batch_ * 4096 + static_cast<int>(*tag);
    if (n.op_type == domain::kSend)
      return t_.send(static_cast<int>(*peer), full_tag, x->data.data(), static_cast<std::int64_t>(x->data.size()));
    auto onnx_type = int_attr(n, domain::kAttrDtype);
    if (!onnx_type) return std::move(onnx_type).error();
    const int dt = dtype_from_onnx(static_cast<std::int32_t>(*onnx_type));
    if (dt < 0 || dtype_size(dt) == 0) return node_error(n, fmt::format("dtype {} cannot be received", *onnx_type));
    const std::string* shape = find_attr(n, domain::kAttrShape);
    auto dims = parse_int_list(shape ? *shape : "", "shape");
    if (!dims) return node_error(n, dims.error().message());
    for (auto d : *dims)
      if (d < 0) return node_error(n, fmt::format("shape [{}] has a negative dim", *shape));
    HostTensor y;
    y.name = out_name;
    y.dtype = dt;
    y.dims = *dims;
    y.data.resize(static_cast<std::size_t>(y.numel() * dtype_size(dt)));
    HP_TRY(t_.recv(static_cast<int>(*peer), full_tag, y.data.data(), static_cast<std::int64_t>(y.data.size())));
    out.front() = std::move(y);
    return {};
  }

  if (n.op_type == domain::kCollectivePermute) {
    const std::string* pv = find_attr(n, domain::kAttrPairs);
    auto pairs = parse_int_list(pv ? *pv : "", "pairs");
    if (!pairs) return node_error(n, pairs.error().message());
    if (pairs->size() % 2) return node_error(n, "attribute 'pairs' needs an even number of ranks (src, dst, ...)");
    int src = -1, dst = -1;
    for (std::size_t i = 0; i < pairs->size(); i += 2) {
      const auto s = (*pairs)[i], d = (*pairs)[i + 1];
      if (s < 0 || s >= world || d < 0 || d >= world)
        return node_error(n, fmt::format("pair ({}, {}) names a rank outside 0..{}", s, d, world - 1));
      if (s == me) {
        if (dst >= 0) return node_error(n, fmt::format("rank {} is a source twice in 'pairs'", me));
        dst = static_cast<int>(d);
      }
      if (d == me) {
        if (src >= 0) return node_error(n, fmt::format("rank {} is a destination twice in 'pairs'", me));
        src = static_cast<int>(s);
      }
    }
    HostTensor y = like(*x, x->dims, out_name);  // zeros when nobody sends here
    if (src == me && dst == me) {
      y.data = x->data;
    } else {
      HP_TRY(t_.sendrecv(dst, x->data.data(), src, y.data.data(), static_cast<std::int64_t>(x->data.size()),
                         4095));
    }
    out.front() = std::move(y);
    return {};
  }

  auto g = group_attr(n, me, world);
  if (!g) return std::move(g).error();
  const int p = static_cast<int>(g->ranks.size());

  if (n.op_type == domain::kAllReduce) {
    auto op = op_attr(n, x->dtype);
    if (!op) return std::move(op).error();
    // Reduce in place in a buffer kept across calls: the executor hands over freshly allocated host
    // tensors, and MPI on fresh (just mmap'd) memory measured 20x slower for 1 MiB than on reused
    // memory (tests/bench/comm); two memcpys cost far less.
    const std::size_t bytes = x->data.size();
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    std::memcpy(scratch_.data(), x->data.data(), bytes);
    HP_TRY(t_.allreduce(g->ranks, scratch_.data(), scratch_.data(), x->numel(), x->dtype,
                        *op == ReduceOp::avg ? ReduceOp::sum : *op));
    HostTensor y;
    y.name = out_name;
    y.dtype = x->dtype;
    y.dims = x->dims;
    y.data.assign(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(bytes));
    if (*op == ReduceOp::avg) divide(y, p);
    out.front() = std::move(y);
    return {};
  }
  if (x->dims.empty()) return node_error(n, "a scalar cannot be split or gathered along an axis");

  if (n.op_type == domain::kAllGather) {
    auto axis = axis_attr(n, domain::kAttrAxis, x->dims.size());
    if (!axis) return std::move(axis).error();
    std::vector<unsigned char> blocks(x->data.size() * static_cast<std::size_t>(p));
    HP_TRY(t_.allgather(g->ranks, x->data.data(), blocks.data(), static_cast<std::int64_t>(x->data.size())));
    auto dims = x->dims;
    dims[static_cast<std::size_t>(*axis)] *= p;
    HostTensor y = like(*x, dims, out_name);
    concat_chunks(blocks.data(), geometry(x->dims, *axis, esize), p, y.data.data());
    out.front() = std::move(y);
    return {};
  }
  if (n.op_type == domain::kReduceScatter) {
    auto axis = axis_attr(n, domain::kAttrAxis, x->dims.size());
    if (!axis) return std::move(axis).error();
    auto op = op_attr(n, x->dtype);
    if (!op) return std::move(op).error();
    HP_TRY(check_divisible(n, *x, *axis, p));
    std::vector<unsigned char> blocks(x->data.size());
    pack_chunks(x->data.data(), geometry(x->dims, *axis, esize), p, blocks.data());
    auto dims = x->dims;
    dims[static_cast<std::size_t>(*axis)] /= p;
    HostTensor y = like(*x, dims, out_name);
    HP_TRY(t_.reduce_scatter(g->ranks, blocks.data(), y.data.data(), y.numel(), y.dtype,
                             *op == ReduceOp::avg ? ReduceOp::sum : *op));
    if (*op == ReduceOp::avg) divide(y, p);
    out.front() = std::move(y);
    return {};
  }
  if (n.op_type == domain::kAllToAll) {
    auto split = axis_attr(n, domain::kAttrSplitAxis, x->dims.size());
    if (!split) return std::move(split).error();
    auto concat = axis_attr(n, domain::kAttrConcatAxis, x->dims.size());
    if (!concat) return std::move(concat).error();
    HP_TRY(check_divisible(n, *x, *split, p));
    std::vector<unsigned char> blocks(x->data.size()), got(x->data.size());
    pack_chunks(x->data.data(), geometry(x->dims, *split, esize), p, blocks.data());
    HP_TRY(t_.alltoall(g->ranks, blocks.data(), got.data(), static_cast<std::int64_t>(x->data.size()) / p));
    auto chunk = x->dims;
    chunk[static_cast<std::size_t>(*split)] /= p;
    auto dims = chunk;
    dims[static_cast<std::size_t>(*concat)] *= p;
    HostTensor y = like(*x, dims, out_name);
    concat_chunks(got.data(), geometry(chunk, *concat, esize), p, y.data.data());
    out.front() = std::move(y);
    return {};
  }
  return node_error(n, fmt::format("hp.{} is not an hp-domain op this comm layer knows", n.op_type));
}

}  // namespace hp::runtime
