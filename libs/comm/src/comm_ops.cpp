// TransportCommOps: the tensor side of the hp-domain ops (hp_domain.h). Works out output shapes,
// packs the chunks of a split axis into contiguous blocks in group-member order, and hands bytes to
// the Transport. Keeping this apart from MPI means the in-process tests cover every shape rule, and
// the MPI transport only moves blocks.
//
// The hot path does no more than the transport needs: the node's attributes were parsed once
// (comm_plan.h), inputs are read where the executor keeps them, outputs are written into the
// executor's pool buffers (an AllReduce into its donated input, in place), and where the split axis
// is the outermost non-trivial one the blocks are the tensor itself, so nothing is packed. Packing,
// where needed, goes through buffers kept across calls: MPI over shared memory is far slower on
// pages it has not touched before.
#include <fmt/core.h>

#include <cstring>

#include "comm_plan.h"
#include "hp/comm/comm.h"
#include "hp/core/hp_domain.h"

namespace hp::comm {

namespace {

Expected<int> resolve_axis(const CommNode& n, std::string_view name, std::int64_t a,
                           std::size_t rank) {
  std::int64_t ax = a < 0 ? a + static_cast<std::int64_t>(rank) : a;
  if (ax < 0 || ax >= static_cast<std::int64_t>(rank))
    return comm_node_error(
        n, fmt::format("{} {} is out of range for a rank-{} tensor", name, a, rank));
  return static_cast<int>(ax);
}

// The byte geometry of splitting a tensor along one axis: `outer` rows of `axis_len * inner` bytes.
struct Geometry {
  std::int64_t outer = 1, axis_len = 1, inner = 1;  // inner in bytes
};
Geometry geometry(std::span<const std::int64_t> dims, int axis, int esize) {
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
      std::memcpy(dst + j * block + o * row, src + o * g.axis_len * g.inner + j * row,
                  static_cast<std::size_t>(row));
}

// Concatenates p contiguous blocks (each of geometry `chunk`) along the axis into `dst`.
void concat_chunks(const unsigned char* src, const Geometry& chunk, int p, unsigned char* dst) {
  const std::int64_t row = chunk.axis_len * chunk.inner, block = chunk.outer * row;
  for (int j = 0; j < p; ++j)
    for (std::int64_t o = 0; o < chunk.outer; ++o)
      std::memcpy(dst + o * p * row + j * row, src + j * block + o * row,
                  static_cast<std::size_t>(row));
}

bool reducible(int dtype) {
  return dtype == HP_F32 || dtype == HP_F64 || dtype == HP_I32 || dtype == HP_I64;
}

template <class T>
void divide_as(void* data, std::int64_t n, int p) {
  T* v = static_cast<T*>(data);
  for (std::int64_t i = 0; i < n; ++i) v[i] /= static_cast<T>(p);
}

void divide(void* data, int dtype, std::int64_t n, int p) {
  switch (dtype) {
    case HP_F32: divide_as<float>(data, n, p); break;
    case HP_F64: divide_as<double>(data, n, p); break;
    case HP_I32: divide_as<std::int32_t>(data, n, p); break;
    case HP_I64: divide_as<std::int64_t>(data, n, p); break;
    default: break;
  }
}

Status check_reducible(const CommNode& n, int dtype) {
  if (!reducible(dtype))
    return comm_node_error(n, fmt::format("cannot reduce {} tensors", exec::dtype_label(dtype)));
  return {};
}

Status check_divisible(const CommNode& n, const CommTensor& x, int axis, int p) {
  const std::vector<std::int64_t> dims(x.dims.begin(), x.dims.end());
  if (x.dims[static_cast<std::size_t>(axis)] % p != 0)
    return comm_node_error(
        n, fmt::format("dim {} of {} (size {}) is not divisible by the group size {}", axis,
                       exec::dims_label(dims), x.dims[static_cast<std::size_t>(axis)], p));
  return {};
}

// The wire form of a reduction: avg is a sum divided afterwards.
ReduceOp wire_op(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }

}  // namespace

TransportCommOps::TransportCommOps(Transport& transport) : t_(transport) {}
TransportCommOps::~TransportCommOps() = default;

bool TransportCommOps::handles(const std::string& op) const {
  for (std::string_view k : {domain::kAllReduce, domain::kAllGather, domain::kReduceScatter,
                             domain::kAllToAll, domain::kCollectivePermute, domain::kSend,
                             domain::kRecv, domain::kDispatch, domain::kCombine})
    if (op == k) return true;
  return false;
}

Expected<const CommPlan*> TransportCommOps::plan_for(const CommNode& n) {
  auto it = plans_.find(&n);
  // The address is only a hint (a temporary node may reuse another's): the plan must match the
  // node.
  if (it != plans_.end() && it->second->op_type == n.op_type && it->second->attrs == n.attrs)
    return static_cast<const CommPlan*>(it->second.get());
  HP_ASSIGN_OR_RETURN(auto p, make_comm_plan(n, t_.rank(), t_.size()));
  if (plans_.size() > 4096)
    plans_.clear();  // callers that build a node per call: keep the cache bounded
  auto& slot = plans_[&n];
  slot = std::make_unique<CommPlan>(std::move(p));
  return static_cast<const CommPlan*>(slot.get());
}

Status TransportCommOps::run(const CommNode& n, const std::vector<const HostTensor*>& in,
                             std::vector<HostTensor>& out) {
  std::vector<CommTensor> views;
  views.reserve(in.size());
  for (const HostTensor* h : in)
    views.push_back(h ? CommTensor{h->dtype, h->dims, h->data.data(), h->data.size()}
                      : CommTensor{});
  auto alloc = [&](std::size_t k, int dtype, std::span<const std::int64_t> dims,
                   int) -> Expected<void*> {
    if (k >= out.size()) return comm_node_error(n, "the node has no output");
    HostTensor& y = out[k];
    y.name = k < n.outputs.size() ? n.outputs[k] : std::string();
    y.dtype = dtype;
    y.dims.assign(dims.begin(), dims.end());
    y.data.resize(static_cast<std::size_t>(y.numel() * exec::dtype_size(dtype)));
    return static_cast<void*>(y.data.data());
  };
  return run_into(n, views, alloc);
}

Status TransportCommOps::run_into(const CommNode& n, const std::vector<CommTensor>& in,
                                  const CommAlloc& alloc) {
  HP_ASSIGN_OR_RETURN(const CommPlan* planned, plan_for(n));
  const CommPlan& pl = *planned;
  if (pl.kind == CommKind::dispatch || pl.kind == CommKind::combine) return route(pl, n, in, alloc);
  const bool takes_input = pl.kind != CommKind::recv;
  if (takes_input && (in.empty() || in.front().dtype < 0))
    return comm_node_error(n, "the node has no input tensor");
  if (pl.kind != CommKind::send && n.outputs.empty())
    return comm_node_error(n, "the node has no output");
  const CommTensor* x = takes_input ? &in.front() : nullptr;
  const int esize = x ? exec::dtype_size(x->dtype) : 0;
  if (x && esize == 0)
    return comm_node_error(
        n, fmt::format("cannot communicate {} tensors", exec::dtype_label(x->dtype)));
  const int p = static_cast<int>(pl.group.size());
  auto output = [&](int dtype, std::span<const std::int64_t> dims,
                    int reuse = -1) -> Expected<unsigned char*> {
    auto y = alloc(0, dtype, dims, reuse);
    if (!y) return std::move(y).error();
    return static_cast<unsigned char*>(*y);
  };
  auto bytes_of = [](std::span<const std::int64_t> dims, int esz) {
    std::int64_t b = esz;
    for (std::int64_t d : dims) b *= d;
    return b;
  };

  switch (pl.kind) {
    case CommKind::send:
      return t_.send(pl.peer, micro_batch_ * 4096 + pl.tag, x->data,
                     static_cast<std::int64_t>(x->bytes));
    case CommKind::recv: {
      auto y = output(pl.recv_dtype, pl.recv_shape);
      if (!y) return std::move(y).error();
      return t_.recv(pl.peer, micro_batch_ * 4096 + pl.tag, *y,
                     bytes_of(pl.recv_shape, exec::dtype_size(pl.recv_dtype)));
    }
    case CommKind::permute: {
      auto y = output(x->dtype, x->dims);
      if (!y) return std::move(y).error();
      const int me = t_.rank();
      if (pl.permute_src == me && pl.permute_dst == me) {
        if (x->bytes) std::memcpy(*y, x->data, x->bytes);
        return {};
      }
      if (pl.permute_src < 0 && x->bytes) std::memset(*y, 0, x->bytes);  // nobody sends here: zeros
      return t_.sendrecv(pl.permute_dst, x->data, pl.permute_src, *y,
                         static_cast<std::int64_t>(x->bytes), 4095);
    }
    case CommKind::all_reduce: {
      HP_TRY(check_reducible(n, x->dtype));
      // In place when the caller donates the input (the transport sees in == out).
      auto y = output(x->dtype, x->dims, x->donatable ? 0 : -1);
      if (!y) return std::move(y).error();
      HP_TRY(t_.allreduce(pl.group, x->data, *y, x->numel(), x->dtype, wire_op(pl.op)));
      if (pl.op == ReduceOp::avg) divide(*y, x->dtype, x->numel(), p);
      return {};
    }
    default: break;
  }
  if (x->dims.empty())
    return comm_node_error(n, "a scalar cannot be split or gathered along an axis");
  const auto* src = static_cast<const unsigned char*>(x->data);

  if (pl.kind == CommKind::all_gather) {
    auto axis = resolve_axis(n, domain::kAttrAxis, pl.axis, x->dims.size());
    if (!axis) return std::move(axis).error();
    std::vector<std::int64_t> dims(x->dims.begin(), x->dims.end());
    dims[static_cast<std::size_t>(*axis)] *= p;
    auto y = output(x->dtype, dims);
    if (!y) return std::move(y).error();
    const Geometry g = geometry(x->dims, *axis, esize);
    const auto bytes = static_cast<std::int64_t>(x->bytes);
    if (g.outer == 1)
      return t_.allgather(pl.group, src, *y, bytes);  // member blocks are the result
    pack_.resize(x->bytes * static_cast<std::size_t>(p));
    HP_TRY(t_.allgather(pl.group, src, pack_.data(), bytes));
    concat_chunks(pack_.data(), g, p, *y);
    return {};
  }
  if (pl.kind == CommKind::reduce_scatter) {
    auto axis = resolve_axis(n, domain::kAttrAxis, pl.axis, x->dims.size());
    if (!axis) return std::move(axis).error();
    HP_TRY(check_reducible(n, x->dtype));
    HP_TRY(check_divisible(n, *x, *axis, p));
    std::vector<std::int64_t> dims(x->dims.begin(), x->dims.end());
    dims[static_cast<std::size_t>(*axis)] /= p;
    auto y = output(x->dtype, dims);
    if (!y) return std::move(y).error();
    const Geometry g = geometry(x->dims, *axis, esize);
    const unsigned char* blocks = src;  // outermost axis: the chunks are the blocks already
    if (g.outer != 1) {
      pack_.resize(x->bytes);
      pack_chunks(src, g, p, pack_.data());
      blocks = pack_.data();
    }
    const std::int64_t count = x->numel() / p;
    HP_TRY(t_.reduce_scatter(pl.group, blocks, *y, count, x->dtype, wire_op(pl.op)));
    if (pl.op == ReduceOp::avg) divide(*y, x->dtype, count, p);
    return {};
  }
  // AllToAll
  auto split = resolve_axis(n, domain::kAttrSplitAxis, pl.split_axis, x->dims.size());
  if (!split) return std::move(split).error();
  auto concat = resolve_axis(n, domain::kAttrConcatAxis, pl.concat_axis, x->dims.size());
  if (!concat) return std::move(concat).error();
  HP_TRY(check_divisible(n, *x, *split, p));
  std::vector<std::int64_t> chunk(x->dims.begin(), x->dims.end());
  chunk[static_cast<std::size_t>(*split)] /= p;
  std::vector<std::int64_t> dims = chunk;
  dims[static_cast<std::size_t>(*concat)] *= p;
  auto y = output(x->dtype, dims);
  if (!y) return std::move(y).error();
  const Geometry gs = geometry(x->dims, *split, esize), gc = geometry(chunk, *concat, esize);
  const unsigned char* blocks = src;
  if (gs.outer != 1) {
    pack_.resize(x->bytes);
    pack_chunks(src, gs, p, pack_.data());
    blocks = pack_.data();
  }
  const auto block = static_cast<std::int64_t>(x->bytes) / p;
  if (gc.outer == 1) return t_.alltoall(pl.group, blocks, *y, block);
  got_.resize(x->bytes);
  HP_TRY(t_.alltoall(pl.group, blocks, got_.data(), block));
  concat_chunks(got_.data(), gc, p, *y);
  return {};
}

}  // namespace hp::comm
