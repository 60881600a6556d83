// Redistribution planning (docs/shard.md, "Redistribution"), after Shardy's CollectiveInserter. The
// planner keeps the current layout and only ever moves it toward the target along the target's axis
// order:
//   1. partial axes are resolved first: ReduceScatter where the target splits a dim over that axis
//      (appended as the dim's minor axis), else AllReduce;
//   2. then, until the layouts agree, the first rule that applies:
//      all-slice    a dim whose axes are a prefix of its target's takes the next target axes that
//      no
//                   dim uses (free), locally — slicing before gathering keeps memory low;
//      permute      a dim with the same shard count but other axes (or order) gets them by one
//                   collective-permute, when the new axes are free and the old ones wanted nowhere
//                   else;
//      all-to-all   the LAST axis of a dim that must lose it moves to a dim whose target continues
//      with
//                   it (only the minor axis can leave while blocks stay contiguous);
//      all-gather   the shortest suffix of a dim's wrong axes that lets an all-to-all or slice go
//      on.
// Each rule leaves every dim either unchanged, closer to a prefix of its target, or equal to it, so
// the loop ends; the simulator (simulate.h) proves each plan in the tests.
#include "hp/shard/redistribute.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <algorithm>
#include <map>
#include <optional>

namespace hp::shard {
namespace {

using Axes = std::vector<int>;

bool is_prefix(const Axes& a, const Axes& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

bool contains(const Axes& axes, int a) {
  return std::find(axes.begin(), axes.end(), a) != axes.end();
}

RedistStep make_step(StepKind kind, Axes axes, int dim = -1, int concat_dim = -1,
                     ReduceOp op = ReduceOp::sum) {
  RedistStep s;
  s.kind = kind;
  s.axes = std::move(axes);
  s.dim = dim;
  s.concat_dim = concat_dim;
  s.op = op;
  return s;
}

Axes appended(Axes axes, int a) {
  axes.push_back(a);
  return axes;
}

struct Planner {
  const Mesh& mesh;
  const std::vector<std::int64_t>& shape;
  int elem_bytes;
  Sharding cur;
  const Sharding& tgt;
  RedistPlan plan;

  std::int64_t axes_size(const Axes& axes) const {
    std::int64_t n = 1;
    for (int a : axes) n *= mesh.dims[static_cast<std::size_t>(a)];
    return n;
  }
  std::int64_t local_bytes() const {
    std::int64_t n = elem_bytes;
    for (std::size_t d = 0; d < shape.size(); ++d) n *= shape[d] / axes_size(cur.dims[d]);
    return n;
  }
  /// Used by a dim of `s` or holding partial values: not available for a new split.
  static bool busy(const Sharding& s, int a) {
    for (const Axes& axes : s.dims)
      if (contains(axes, a)) return true;
    return std::any_of(s.partial.begin(), s.partial.end(),
                       [&](const PartialAxis& p) { return p.axis == a; });
  }
  bool busy(int a) const { return busy(cur, a); }
  /// Some dim other than `d` could take `a` next as its minor axis.
  bool wanted_next_elsewhere(int a, std::size_t d) const {
    for (std::size_t e = 0; e < cur.dims.size(); ++e)
      if (e != d && is_prefix(appended(cur.dims[e], a), tgt.dims[e])) return true;
    return false;
  }

  /// Records a step from `cur` to `next`. A step over a one-rank group moves nothing and is
  /// dropped.
  void emit(RedistStep step, Sharding next) {
    step.before = cur;
    step.after = next;
    cur = std::move(next);
    if (step.kind != StepKind::permute) {
      if (axes_size(step.axes) == 1) return;
      step.groups = mesh.groups(step.axes);
    } else if (step.pairs.size() == step.groups[0].size() &&
               std::all_of(step.pairs.begin(), step.pairs.end(),
                           [](auto p) { return p.first == p.second; })) {
      return;  // every member keeps its own block
    }
    bool gathered = step.kind == StepKind::all_gather;
    plan.steps.push_back(std::move(step));
    auto whole = [&](const Sharding& s) {
      return std::all_of(s.dims.begin(), s.dims.end(),
                         [&](const Axes& a) { return axes_size(a) == 1; });
    };
    if (gathered && whole(cur) && !whole(tgt)) plan.full_rematerialization = true;
  }

  void resolve_partials();
  void create_partials();
  bool try_slice();
  bool try_permute();
  std::optional<Axes> permute_target(const Sharding& state, std::size_t d) const;
  bool try_all_to_all();
  bool try_gather();
  void permute_to(Sharding next);
};

void Planner::resolve_partials() {
  std::vector<PartialAxis> pending;
  for (const PartialAxis& p : cur.partial)
    if (std::find(tgt.partial.begin(), tgt.partial.end(), p) == tgt.partial.end())
      pending.push_back(p);
  // ReduceScatters, in the order the axes appear in the target's entries (outer tuple position
  // first).
  for (std::size_t d = 0; d < tgt.dims.size(); ++d) {
    for (std::size_t i = 0; i < tgt.dims[d].size(); ++i) {
      int a = tgt.dims[d][i];
      auto it = std::find_if(pending.begin(), pending.end(),
                             [&](const PartialAxis& p) { return p.axis == a; });
      if (it == pending.end()) continue;
      // Where the target puts free axes before `a`, slice them first (slicing addends is exact), so
      // the scatter lands at a's place in the target's order and no gather is needed later.
      Axes before(tgt.dims[d].begin(), tgt.dims[d].begin() + static_cast<std::ptrdiff_t>(i));
      if (is_prefix(cur.dims[d], before) && cur.dims[d].size() < before.size() &&
          std::none_of(before.begin() + static_cast<std::ptrdiff_t>(cur.dims[d].size()),
                       before.end(), [&](int b) { return busy(b); })) {
        Axes run(before.begin() + static_cast<std::ptrdiff_t>(cur.dims[d].size()), before.end());
        Sharding sliced = cur;
        sliced.dims[d] = before;
        emit(make_step(StepKind::local_slice, run, static_cast<int>(d)), std::move(sliced));
      }
      std::int64_t local = shape[d] / axes_size(cur.dims[d]);
      if (local % axes_size({a}) != 0) continue;  // cannot scatter evenly here: all-reduce below
      Sharding next = cur;
      next.dims[d].push_back(a);
      next.partial.erase(std::find(next.partial.begin(), next.partial.end(), *it));
      RedistStep step = make_step(StepKind::reduce_scatter, {a}, static_cast<int>(d), -1, it->op);
      step.bytes = local_bytes();
      pending.erase(it);
      emit(std::move(step), std::move(next));
    }
  }
  // AllReduces, right-most mesh axis first.
  std::sort(pending.begin(), pending.end(),
            [](const PartialAxis& x, const PartialAxis& y) { return x.axis > y.axis; });
  for (const PartialAxis& p : pending) {
    Sharding next = cur;
    next.partial.erase(std::find(next.partial.begin(), next.partial.end(), p));
    RedistStep step = make_step(StepKind::all_reduce, {p.axis}, -1, -1, p.op);
    step.bytes = local_bytes();
    emit(std::move(step), std::move(next));
  }
}

/// Partial axes the target has and the current layout lacks (the axis is free by now: a target's
/// partial axis shards none of its dims). avg, max and min of equal copies are the copy, so those
/// are a relabelling; sum keeps the value at coordinate 0 of the axis and zeros the other copies,
/// which is a collective-permute whose only pairs are those ranks to themselves (a rank without a
/// source gets zeros, hp_domain.h). No data crosses the network.
void Planner::create_partials() {
  for (const PartialAxis& p : tgt.partial) {
    if (std::find(cur.partial.begin(), cur.partial.end(), p) != cur.partial.end()) continue;
    Sharding next = cur;
    next.partial.push_back(p);
    if (p.op != ReduceOp::sum) {
      cur = std::move(next);
      if (!plan.steps.empty())
        plan.steps.back().after = cur;  // the last step's result reads as partial
      continue;
    }
    RedistStep step = make_step(StepKind::permute, {p.axis});
    step.groups = {mesh.rank_list};
    for (std::int64_t r : mesh.rank_list)
      if (mesh.coords(r)[static_cast<std::size_t>(p.axis)] == 0) step.pairs.emplace_back(r, r);
    emit(std::move(step), std::move(next));
  }
}

bool Planner::try_slice() {
  bool progress = false;
  for (std::size_t d = 0; d < cur.dims.size(); ++d) {
    if (!is_prefix(cur.dims[d], tgt.dims[d])) continue;
    Axes run;
    for (std::size_t i = cur.dims[d].size(); i < tgt.dims[d].size() && !busy(tgt.dims[d][i]); ++i)
      run.push_back(tgt.dims[d][i]);
    if (run.empty()) continue;
    Sharding next = cur;
    next.dims[d].insert(next.dims[d].end(), run.begin(), run.end());
    emit(make_step(StepKind::local_slice, run, static_cast<int>(d)), std::move(next));
    progress = true;
  }
  return progress;
}

/// The target prefix dim `d` of `state` can be permuted to: the longest tgt[d][0:k] with the same
/// shard count as the dim now (and different axes), whose new axes are free in `state`, and whose
/// dropped axes no other dim's target wants (those are moved by an all-to-all instead). Empty when
/// none.
std::optional<Axes> Planner::permute_target(const Sharding& state, std::size_t d) const {
  const Axes& from = state.dims[d];
  const Axes& to = tgt.dims[d];
  for (std::size_t k = to.size() + 1; k-- > 0;) {
    Axes prefix(to.begin(), to.begin() + static_cast<std::ptrdiff_t>(k));
    if (prefix == from || axes_size(prefix) != axes_size(from)) continue;
    bool ok = std::all_of(prefix.begin(), prefix.end(),
                          [&](int a) { return contains(from, a) || !busy(state, a); });
    for (int a : from)
      for (std::size_t e = 0; e < tgt.dims.size() && ok; ++e)
        if (e != d && !contains(prefix, a) && contains(tgt.dims[e], a)) ok = false;
    if (ok) return prefix;
  }
  return std::nullopt;
}

bool Planner::try_permute() {
  for (std::size_t d = 0; d < cur.dims.size(); ++d) {
    if (is_prefix(cur.dims[d], tgt.dims[d])) continue;
    std::optional<Axes> to = permute_target(cur, d);
    if (!to) continue;
    Sharding next = cur;
    next.dims[d] = *to;
    permute_to(std::move(next));
    return true;
  }
  return false;
}

/// One collective-permute from `cur` to `next` (same shard count per dim): each rank receives the
/// block it needs from a rank holding it, itself when possible, else the holder used least so far.
/// Partial values stay put: the source must also sit at the same coordinates on the partial axes,
/// or one addend would arrive twice and another never.
void Planner::permute_to(Sharding next) {
  auto block_of = [&](const Sharding& s, std::int64_t r) {
    std::vector<std::int64_t> id;
    for (const Range& range : slice_of(mesh, s, shape, r)) id.push_back(range.begin);
    std::vector<std::int64_t> c = mesh.coords(r);
    for (const PartialAxis& p : cur.partial) id.push_back(c[static_cast<std::size_t>(p.axis)]);
    return id;
  };
  std::map<std::vector<std::int64_t>, std::vector<std::int64_t>> holders;
  for (std::int64_t r : mesh.rank_list) holders[block_of(cur, r)].push_back(r);
  std::map<std::int64_t, int> load;
  RedistStep step = make_step(StepKind::permute, {});
  step.groups = {mesh.rank_list};
  for (std::int64_t dst : mesh.rank_list) {
    const auto& h = holders[block_of(next, dst)];
    std::int64_t src = h.front();
    if (std::find(h.begin(), h.end(), dst) != h.end())
      src = dst;
    else
      for (std::int64_t r : h)
        if (load[r] < load[src]) src = r;
    ++load[src];
    step.pairs.emplace_back(src, dst);
  }
  step.bytes = local_bytes();
  emit(std::move(step), std::move(next));
}

bool Planner::try_all_to_all() {
  for (std::size_t s = 0; s < cur.dims.size(); ++s) {
    if (cur.dims[s].empty() || is_prefix(cur.dims[s], tgt.dims[s])) continue;
    int a = cur.dims[s].back();
    for (std::size_t t = 0; t < cur.dims.size(); ++t) {
      if (t == s || !is_prefix(appended(cur.dims[t], a), tgt.dims[t])) continue;
      Sharding next = cur;
      next.dims[s].pop_back();
      next.dims[t].push_back(a);
      RedistStep step =
          make_step(StepKind::all_to_all, {a}, static_cast<int>(t), static_cast<int>(s));
      step.bytes = local_bytes();
      emit(std::move(step), std::move(next));
      return true;
    }
  }
  return false;
}

bool Planner::try_gather() {
  for (std::size_t d = 0; d < cur.dims.size(); ++d) {
    const Axes& axes = cur.dims[d];
    if (is_prefix(axes, tgt.dims[d])) continue;
    std::size_t keep = 0;  // common prefix with the target: never gathered
    while (keep < axes.size() && keep < tgt.dims[d].size() && axes[keep] == tgt.dims[d][keep])
      ++keep;
    // Gather only the shortest suffix that lets the rest go on without a gather: an all-to-all of
    // the new last axis to another dim, or a permute of what is left to a prefix of the target.
    std::size_t from = axes.size();
    while (from > keep) {
      Sharding left = cur;
      left.dims[d].resize(from);
      if (from < axes.size() && permute_target(left, d)) break;
      if (wanted_next_elsewhere(axes[from - 1], d)) break;
      --from;
    }
    if (from == axes.size())
      from = keep;  // cannot happen after try_all_to_all; gather all wrong axes
    Axes gathered(axes.begin() + static_cast<std::ptrdiff_t>(from), axes.end());
    Sharding next = cur;
    next.dims[d].resize(from);
    RedistStep step = make_step(StepKind::all_gather, gathered, static_cast<int>(d));
    step.bytes = local_bytes() * axes_size(gathered);
    emit(std::move(step), std::move(next));
    return true;
  }
  return false;
}

Status check_partials(const Mesh& mesh, const Sharding& from, const Sharding& to) {
  for (const PartialAxis& p : to.partial)
    if (p.op == ReduceOp::prod &&
        std::find(from.partial.begin(), from.partial.end(), p) == from.partial.end())
      return Error(
          Errc::bad_input,
          fmt::format(
              "redistribute: cannot create partial(prod) over '{}'; only sum, avg, max and min "
              "partials can be made from replicated values",
              mesh.axes[static_cast<std::size_t>(p.axis)]));
  for (const Sharding* s : {&from, &to})
    for (const PartialAxis& p : s->partial)
      if (p.op != s->partial[0].op)
        return Error(Errc::bad_input,
                     fmt::format("redistribute: partial axes mix {} and {}; the order of the "
                                 "reductions would be ambiguous",
                                 reduce_op_name(s->partial[0].op), reduce_op_name(p.op)));
  return {};
}

}  // namespace

const char* step_kind_name(StepKind k) {
  switch (k) {
    case StepKind::local_slice: return "local_slice";
    case StepKind::all_gather: return "all_gather";
    case StepKind::reduce_scatter: return "reduce_scatter";
    case StepKind::all_reduce: return "all_reduce";
    case StepKind::all_to_all: return "all_to_all";
    case StepKind::permute: return "permute";
  }
  return "?";
}

Expected<RedistPlan> plan_redistribution(const Mesh& mesh, const Sharding& from, const Sharding& to,
                                         const std::vector<std::int64_t>& shape, int elem_bytes) {
  if (elem_bytes <= 0)
    return Error(Errc::bad_input,
                 fmt::format("redistribute: element size {} is not positive", elem_bytes));
  HP_TRY(check_shape(mesh, from, shape, "source"));
  HP_TRY(check_shape(mesh, to, shape, "target"));
  HP_TRY(check_partials(mesh, from, to));
  Planner p{mesh, shape, elem_bytes, from, to, {}};
  p.resolve_partials();
  // Each pass either finishes a dim or shortens/extends one toward its target; the bound only
  // guards against a planner bug turning into an endless loop.
  for (int pass = 0; p.cur.dims != to.dims; ++pass) {
    if (pass > 64 || !(p.try_slice() || p.try_permute() || p.try_all_to_all() || p.try_gather()))
      return Error(Errc::internal,
                   fmt::format("redistribute: no plan from {} to {}", format_sharding(mesh, from),
                               format_sharding(mesh, to)));
  }
  p.create_partials();
  return std::move(p.plan);
}

std::string RedistPlan::describe(const Mesh& mesh) const {
  if (steps.empty()) return "no communication: the layouts agree\n";
  auto names = [&](const std::vector<int>& axes) {
    std::vector<std::string> n;
    for (int a : axes) n.push_back(mesh.axes[static_cast<std::size_t>(a)]);
    return fmt::format("{}", fmt::join(n, ","));
  };
  std::string out;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const RedistStep& s = steps[i];
    std::string what;
    switch (s.kind) {
      case StepKind::all_to_all:
        what =
            fmt::format("over {}: split dim {}, concat dim {}", names(s.axes), s.dim, s.concat_dim);
        break;
      case StepKind::all_reduce:
        what = fmt::format("({}) over {}", reduce_op_name(s.op), names(s.axes));
        break;
      case StepKind::reduce_scatter:
        what = fmt::format("({}) over {} on dim {}", reduce_op_name(s.op), names(s.axes), s.dim);
        break;
      case StepKind::permute: what = ""; break;
      default: what = fmt::format("over {} on dim {}", names(s.axes), s.dim); break;
    }
    std::string members;
    if (s.kind == StepKind::permute) {
      std::vector<std::string> moves;
      for (auto [src, dst] : s.pairs)
        if (src != dst) moves.push_back(fmt::format("{}->{}", src, dst));
      members = moves.empty() ? std::string("no transfers, ranks without a pair zero their copy")
                              : fmt::format("pairs {}", fmt::join(moves, " "));
    } else {
      std::vector<std::string> gs;
      for (const auto& g : s.groups) gs.push_back(fmt::format("[{}]", fmt::join(g, ",")));
      members = fmt::format("groups {}", fmt::join(gs, " "));
    }
    out += fmt::format("{}. {}{}{}: {} -> {}; {}; {} B per rank\n", i + 1, step_kind_name(s.kind),
                       what.empty() ? "" : " ", what, format_sharding(mesh, s.before),
                       format_sharding(mesh, s.after), members, s.bytes);
  }
  if (full_rematerialization)
    out += "note: the plan replicates the whole tensor before slicing it again\n";
  return out;
}

}  // namespace hp::shard
