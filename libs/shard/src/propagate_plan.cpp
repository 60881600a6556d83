// The redistributions propagation inserts, as plans of collectives (docs/shard.md,
// "Redistribution"): partial axes first (ReduceScatter onto a dim the target splits with that axis
// as its minor axis, else AllReduce), then every dim drops the axes the target does not keep, minor
// axis first (AllGather; group order is chunk order because the remaining major axes are fixed
// within a group), and only then adds the target's extra axes by local slicing (which needs no
// communication).
#include <fmt/core.h>

#include <algorithm>

#include "hp/shard/propagate.h"

namespace hp::shard {
namespace {

std::int64_t local_bytes(const Mesh& m, const Sharding& s, const std::vector<std::int64_t>& shape,
                         int elem) {
  auto ls = local_shape(m, s, shape, m.rank_list.empty() ? 0 : m.rank_list.front());
  std::int64_t n = elem;
  for (auto d : ls) n *= d;
  return n;
}

}  // namespace

Expected<RedistPlan> plan_steps(const Mesh& mesh, const Sharding& from, const Sharding& to,
                                const std::vector<std::int64_t>& shape, int elem_bytes) {
  if (from.dims.size() != to.dims.size() || from.dims.size() != shape.size())
    return Error(
        Errc::internal,
        fmt::format("redistribution between layouts of rank {} and {} for a rank-{} tensor",
                    from.dims.size(), to.dims.size(), shape.size()));
  HP_TRY(check_shape(mesh, from, shape, "redistribution source"));
  HP_TRY(check_shape(mesh, to, shape, "redistribution target"));
  RedistPlan plan;
  Sharding cur = from;
  auto push = [&](StepKind kind, std::vector<int> axes, int dim, ReduceOp op,
                  const Sharding& after) {
    RedistStep s;
    s.kind = kind;
    s.axes = axes;
    s.dim = dim;
    s.op = op;
    s.groups = mesh.groups(axes);
    s.before = cur;
    s.after = after;
    s.bytes = local_bytes(mesh, cur, shape, elem_bytes);
    plan.steps.push_back(std::move(s));
    cur = after;
  };
  // 1. Partial axes the target does not keep.
  for (const auto& pa : from.partial) {
    bool kept = std::any_of(to.partial.begin(), to.partial.end(),
                            [&](const PartialAxis& q) { return q.axis == pa.axis; });
    if (kept) continue;
    Sharding after = cur;
    after.partial.erase(std::remove(after.partial.begin(), after.partial.end(), pa),
                        after.partial.end());
    int rs_dim = -1;
    for (std::size_t d = 0; d < to.dims.size() && rs_dim < 0; ++d) {
      std::vector<int> want = cur.dims[d];
      want.push_back(pa.axis);
      if (to.dims[d].size() >= want.size() &&
          std::equal(want.begin(), want.end(), to.dims[d].begin()) &&
          shape[d] % (std::max<std::int64_t>(1, shard_counts(mesh, cur)[d]) *
                      mesh.dims[static_cast<std::size_t>(pa.axis)]) ==
              0)
        rs_dim = static_cast<int>(d);
    }
    if (rs_dim >= 0) {
      after.dims[static_cast<std::size_t>(rs_dim)].push_back(pa.axis);
      push(StepKind::reduce_scatter, {pa.axis}, rs_dim, pa.op, after);
    } else {
      push(StepKind::all_reduce, {pa.axis}, -1, pa.op, after);
    }
  }
  // 2. Gathers: each dim keeps only the prefix it shares with the target.
  for (std::size_t d = 0; d < cur.dims.size(); ++d) {
    const std::vector<int>& t = to.dims[d];
    std::size_t common = 0;
    while (common < cur.dims[d].size() && common < t.size() && cur.dims[d][common] == t[common])
      ++common;
    while (cur.dims[d].size() > common) {
      Sharding after = cur;
      int axis = after.dims[d].back();
      after.dims[d].pop_back();
      push(StepKind::all_gather, {axis}, static_cast<int>(d), ReduceOp::sum, after);
    }
  }
  // 3. Local slices for the axes the target adds.
  for (std::size_t d = 0; d < cur.dims.size(); ++d) {
    if (cur.dims[d] == to.dims[d]) continue;
    Sharding after = cur;
    after.dims[d] = to.dims[d];
    std::vector<int> added(to.dims[d].begin() + static_cast<std::ptrdiff_t>(cur.dims[d].size()),
                           to.dims[d].end());
    push(StepKind::local_slice, added, static_cast<int>(d), ReduceOp::sum, after);
  }
  if (cur.partial != to.partial)
    return Error(Errc::internal,
                 fmt::format("cannot create partial state {} from {}", format_sharding(mesh, to),
                             format_sharding(mesh, from)));
  return plan;
}

std::string describe_plan(const Mesh& mesh, const RedistPlan& plan) {
  std::string s;
  for (const auto& st : plan.steps) {
    std::string axes;
    for (int a : st.axes)
      axes += (axes.empty() ? "" : ",") + mesh.axes[static_cast<std::size_t>(a)];
    s += fmt::format("{}", step_kind_name(st.kind));
    if (st.dim >= 0) s += fmt::format(" dim {}", st.dim);
    s += fmt::format(" over {}", axes);
    if (st.kind == StepKind::all_reduce || st.kind == StepKind::reduce_scatter)
      s += fmt::format(" ({})", reduce_op_name(st.op));
    s += fmt::format(": {} -> {}, {} bytes per rank\n", format_sharding(mesh, st.before),
                     format_sharding(mesh, st.after), st.bytes);
  }
  return s;
}

}  // namespace hp::shard
