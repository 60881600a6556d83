// The redistribution simulator (see simulate.h): plain dense tensors and the literal collective
// semantics of hp_domain.h, written for obviousness rather than speed.
#include "hp/shard/simulate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <set>

namespace hp::shard {
namespace {

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

/// Strides of a row-major shape.
std::vector<std::int64_t> strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> s(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

/// Visits every multi-index of `shape` in row-major order.
template <class F>
void for_each_index(const std::vector<std::int64_t>& shape, F&& f) {
  if (numel(shape) == 0) return;
  std::vector<std::int64_t> idx(shape.size(), 0);
  while (true) {
    f(idx);
    std::size_t d = shape.size();
    while (d > 0) {
      --d;
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (shape.empty()) return;
  }
}

Error malformed(std::size_t step, const RedistStep& s, std::string what) {
  return Error(Errc::internal,
               fmt::format("simulate: step {} ({}): {}", step, step_kind_name(s.kind), what));
}

Expected<std::vector<SimTensor>> split(const SimTensor& t, int dim, std::int64_t parts) {
  if (dim < 0 || dim >= static_cast<int>(t.shape.size()))
    return Error(Errc::internal,
                 fmt::format("dim {} out of range for rank {}", dim, t.shape.size()));
  auto d = static_cast<std::size_t>(dim);
  if (t.shape[d] % parts != 0)
    return Error(Errc::internal,
                 fmt::format("dim {} of size {} does not split into {}", dim, t.shape[d], parts));
  std::int64_t len = t.shape[d] / parts;
  std::vector<SimTensor> out;
  for (std::int64_t k = 0; k < parts; ++k) {
    std::vector<Range> block;
    for (std::size_t i = 0; i < t.shape.size(); ++i)
      block.push_back(i == d ? Range{k * len, (k + 1) * len} : Range{0, t.shape[i]});
    out.push_back(slice_tensor(t, block));
  }
  return out;
}

SimTensor concat(const std::vector<SimTensor>& parts, int dim) {
  auto d = static_cast<std::size_t>(dim);
  SimTensor out{parts[0].shape, {}};
  out.shape[d] = 0;
  for (const SimTensor& p : parts) out.shape[d] += p.shape[d];
  out.values.assign(static_cast<std::size_t>(numel(out.shape)), 0.0);
  std::vector<std::int64_t> os = strides(out.shape);
  std::int64_t offset = 0;
  for (const SimTensor& p : parts) {
    std::size_t i = 0;
    for_each_index(p.shape, [&](const std::vector<std::int64_t>& idx) {
      std::int64_t flat = 0;
      for (std::size_t k = 0; k < idx.size(); ++k) flat += (idx[k] + (k == d ? offset : 0)) * os[k];
      out.values[static_cast<std::size_t>(flat)] = p.values[i++];
    });
    offset += p.shape[d];
  }
  return out;
}

/// Elementwise reduction in member order; avg is the sum divided by the member count.
SimTensor reduce(const std::vector<SimTensor>& parts, ReduceOp op) {
  SimTensor out = parts[0];
  for (std::size_t m = 1; m < parts.size(); ++m)
    for (std::size_t i = 0; i < out.values.size(); ++i) {
      double a = out.values[i], b = parts[m].values[i];
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg: out.values[i] = a + b; break;
        case ReduceOp::max: out.values[i] = std::max(a, b); break;
        case ReduceOp::min: out.values[i] = std::min(a, b); break;
        case ReduceOp::prod: out.values[i] = a * b; break;
      }
    }
  if (op == ReduceOp::avg)
    for (double& v : out.values) v /= static_cast<double>(parts.size());
  return out;
}

/// Collects each group's member tensors, checking that every rank of the state is in exactly one
/// group and that members agree on shape.
Expected<std::vector<std::vector<SimTensor>>> gather_groups(const RankTensors& state, std::size_t i,
                                                            const RedistStep& s) {
  std::set<std::int64_t> seen;
  std::vector<std::vector<SimTensor>> out;
  for (const auto& g : s.groups) {
    if (g.empty()) return malformed(i, s, "empty group");
    std::vector<SimTensor> members;
    for (std::int64_t r : g) {
      auto it = state.find(r);
      if (it == state.end()) return malformed(i, s, fmt::format("rank {} is not on the mesh", r));
      if (!seen.insert(r).second)
        return malformed(i, s, fmt::format("rank {} is in two groups", r));
      if (it->second.shape != state.at(g[0]).shape)
        return malformed(i, s,
                         fmt::format("rank {} holds a different shape than rank {}", r, g[0]));
      members.push_back(it->second);
    }
    out.push_back(std::move(members));
  }
  if (seen.size() != state.size()) return malformed(i, s, "some rank is in no group");
  return out;
}

Expected<RankTensors> run_step(const RankTensors& state, std::size_t i, const RedistStep& s) {
  RankTensors next;
  if (s.kind == StepKind::permute) {
    if (s.groups.size() != 1) return malformed(i, s, "a permute has exactly one group");
    next = state;
    std::map<std::int64_t, std::int64_t> src_of;
    for (auto [src, dst] : s.pairs) {
      if (!state.count(src) || !state.count(dst))
        return malformed(i, s, "a pair names a rank off the mesh");
      if (!src_of.emplace(dst, src).second)
        return malformed(i, s, fmt::format("rank {} receives twice", dst));
    }
    for (std::int64_t r : s.groups[0]) {
      if (!state.count(r)) return malformed(i, s, fmt::format("rank {} is not on the mesh", r));
      auto it = src_of.find(r);
      SimTensor& t = next[r];
      if (it == src_of.end())
        std::fill(t.values.begin(), t.values.end(), 0.0);  // no src: zeros
      else
        t = state.at(it->second);
    }
    return next;
  }
  HP_ASSIGN_OR_RETURN(auto groups, gather_groups(state, i, s));
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const auto& ranks = s.groups[g];
    const auto& in = groups[g];
    auto p = static_cast<std::int64_t>(ranks.size());
    for (std::size_t m = 0; m < ranks.size(); ++m) {
      switch (s.kind) {
        case StepKind::local_slice: {
          auto parts = split(in[m], s.dim, p);
          if (!parts.ok()) return malformed(i, s, parts.error().message());
          next[ranks[m]] = (*parts)[m];
          break;
        }
        case StepKind::all_gather: next[ranks[m]] = concat(in, s.dim); break;
        case StepKind::all_reduce: next[ranks[m]] = reduce(in, s.op); break;
        case StepKind::reduce_scatter: {
          auto parts = split(reduce(in, s.op), s.dim, p);
          if (!parts.ok()) return malformed(i, s, parts.error().message());
          next[ranks[m]] = (*parts)[m];
          break;
        }
        case StepKind::all_to_all: {
          if (s.concat_dim < 0 || s.concat_dim >= static_cast<int>(in[m].shape.size()))
            return malformed(i, s, "concat_dim out of range");
          std::vector<SimTensor> received;  // chunk m of every member, in member order
          for (const SimTensor& t : in) {
            auto parts = split(t, s.dim, p);
            if (!parts.ok()) return malformed(i, s, parts.error().message());
            received.push_back((*parts)[m]);
          }
          next[ranks[m]] = concat(received, s.concat_dim);
          break;
        }
        case StepKind::permute: break;
      }
    }
  }
  return next;
}

}  // namespace

SimTensor global_tensor(const std::vector<std::int64_t>& shape) {
  SimTensor t{shape, std::vector<double>(static_cast<std::size_t>(numel(shape)))};
  for (std::size_t i = 0; i < t.values.size(); ++i) t.values[i] = static_cast<double>(i + 1);
  return t;
}

SimTensor slice_tensor(const SimTensor& t, const std::vector<Range>& slice) {
  SimTensor out;
  for (const Range& r : slice) out.shape.push_back(r.size());
  std::vector<std::int64_t> ts = strides(t.shape);
  for_each_index(out.shape, [&](const std::vector<std::int64_t>& idx) {
    std::int64_t flat = 0;
    for (std::size_t k = 0; k < idx.size(); ++k) flat += (idx[k] + slice[k].begin) * ts[k];
    out.values.push_back(t.values[static_cast<std::size_t>(flat)]);
  });
  return out;
}

Expected<RankTensors> initial_state(const Mesh& mesh, const std::vector<std::int64_t>& shape,
                                    const Sharding& from, std::uint64_t seed) {
  HP_TRY(check_shape(mesh, from, shape, "simulated"));
  SimTensor global = global_tensor(shape);
  RankTensors state;
  for (std::int64_t r : mesh.rank_list)
    state[r] = slice_tensor(global, slice_of(mesh, from, shape, r));
  if (from.partial.empty()) return state;
  ReduceOp op = from.partial[0].op;
  std::vector<int> axes;
  for (const PartialAxis& p : from.partial) {
    if (p.op != op) return Error(Errc::bad_input, "simulate: partial axes with different ops");
    axes.push_back(p.axis);
  }
  std::sort(axes.begin(), axes.end());
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> small(-50, 50), exp2(-3, 3);
  for (const auto& group : mesh.groups(axes)) {
    auto n = group.size();
    const std::vector<double> truth = state[group[0]].values;
    for (std::size_t v = 0; v < truth.size(); ++v) {
      double rest = op == ReduceOp::avg ? truth[v] * static_cast<double>(n) : truth[v];
      const bool exact_split = op == ReduceOp::sum || op == ReduceOp::avg || op == ReduceOp::prod;
      if (exact_split) {
        // Members 0..n-2 get random addends (factors); the last gets what is left.
        for (std::size_t m = 0; m + 1 < n; ++m) {
          double x =
              op == ReduceOp::prod ? std::ldexp(1.0, exp2(rng)) : static_cast<double>(small(rng));
          rest = op == ReduceOp::prod ? rest / x : rest - x;
          state[group[m]].values[v] = x;
        }
        state[group[n - 1]].values[v] = rest;
        continue;
      }
      // max/min: one random member holds the true value, the others a value it dominates.
      std::size_t holder = static_cast<std::size_t>(rng() % n);
      for (std::size_t m = 0; m < n; ++m) {
        double d = m == holder ? 0.0 : static_cast<double>(1 + std::abs(small(rng)));
        state[group[m]].values[v] = op == ReduceOp::max ? truth[v] - d : truth[v] + d;
      }
    }
  }
  return state;
}

Expected<RankTensors> simulate_plan(const Mesh& mesh, RankTensors state, const RedistPlan& plan) {
  (void)mesh;
  for (std::size_t i = 0; i < plan.steps.size(); ++i) {
    HP_ASSIGN_OR_RETURN(state, run_step(state, i, plan.steps[i]));
  }
  return state;
}

Status prove_plan(const Mesh& mesh, const std::vector<std::int64_t>& shape, const Sharding& from,
                  const Sharding& to, const RedistPlan& plan, std::uint64_t seed) {
  HP_TRY(check_shape(mesh, to, shape, "simulated"));
  HP_ASSIGN_OR_RETURN(auto start, initial_state(mesh, shape, from, seed));
  HP_ASSIGN_OR_RETURN(auto end, simulate_plan(mesh, std::move(start), plan));
  SimTensor global = global_tensor(shape);
  std::vector<int> partial_axes;
  ReduceOp op = to.partial.empty() ? ReduceOp::sum : to.partial[0].op;
  for (const PartialAxis& p : to.partial) partial_axes.push_back(p.axis);
  std::sort(partial_axes.begin(), partial_axes.end());
  for (std::int64_t r : mesh.rank_list) {
    SimTensor want = slice_tensor(global, slice_of(mesh, to, shape, r));
    SimTensor got = end.at(r);
    if (!partial_axes.empty()) {
      std::vector<SimTensor> members;
      for (std::int64_t m : mesh.group(r, partial_axes)) members.push_back(end.at(m));
      if (members[0].shape != got.shape ||
          std::any_of(members.begin(), members.end(),
                      [&](const SimTensor& t) { return t.shape != got.shape; }))
        return Error(Errc::mismatch,
                     fmt::format("simulate: partial group of rank {} disagrees on shape", r));
      got = reduce(members, op);
    }
    if (got.shape != want.shape)
      return Error(Errc::mismatch,
                   fmt::format("simulate: rank {} ends with shape ({}) but should hold ({})", r,
                               fmt::join(got.shape, ","), fmt::join(want.shape, ",")));
    if (got.values != want.values)
      return Error(Errc::mismatch, fmt::format("simulate: rank {} ends with the wrong values", r));
  }
  return {};
}

}  // namespace hp::shard
