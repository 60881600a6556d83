// The redistribution property test (docs/shard.md, "Proofs"): for every pair of layouts — every
// tensor_map, tuples in every order, partial(sum) sources — of small 2-D and 3-D tensors on meshes
// of up to 8 ranks, with default and permuted rank_lists, the planner's plan is run by the
// simulator and every rank must end with exactly its target slice. Then random larger cases: 4-D
// meshes of up to 16 ranks, 3-D tensors, partial sources of every op, some partial axes kept, some
// created. Together they must exercise every kind of step.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <set>

#include "hp/shard/redistribute.h"
#include "hp/shard/simulate.h"

using namespace hp::shard;

namespace {

/// Every layout of a rank-`rank` tensor on `naxes` mesh axes: each axis unused, partial (when
/// allowed) or inserted at any position of any dim's list, so every tuple order appears exactly
/// once.
std::vector<Sharding> all_layouts(int naxes, int rank, bool partial) {
  std::vector<Sharding> out;
  std::function<void(int, Sharding&)> place = [&](int a, Sharding& s) {
    if (a == naxes) {
      out.push_back(s);
      return;
    }
    place(a + 1, s);
    if (partial) {
      s.partial.push_back({a, ReduceOp::sum});
      place(a + 1, s);
      s.partial.pop_back();
    }
    for (auto& dim : s.dims)
      for (std::size_t pos = 0; pos <= dim.size(); ++pos) {
        dim.insert(dim.begin() + static_cast<std::ptrdiff_t>(pos), a);
        place(a + 1, s);
        dim.erase(dim.begin() + static_cast<std::ptrdiff_t>(pos));
      }
  };
  Sharding s = Sharding::replicated(static_cast<std::size_t>(rank));
  place(0, s);
  return out;
}

/// The smallest interesting shape both layouts divide (dims differ so transposes are visible).
std::vector<std::int64_t> shape_for(const Mesh& m, const Sharding& a, const Sharding& b,
                                    const std::vector<std::int64_t>& scale) {
  std::vector<std::int64_t> ca = shard_counts(m, a), cb = shard_counts(m, b), shape;
  for (std::size_t d = 0; d < ca.size(); ++d)
    shape.push_back(std::lcm(ca[d], cb[d]) * scale[d % scale.size()]);
  return shape;
}

struct Tally {
  std::set<StepKind> kinds;
  int plans = 0, remats = 0;
};

/// `s` without its size-1 mesh axes: steps over them move nothing, so the planner drops them.
Sharding effective(const Mesh& m, Sharding s) {
  for (auto& dim : s.dims)
    dim.erase(std::remove_if(dim.begin(), dim.end(),
                             [&](int a) { return m.dims[static_cast<std::size_t>(a)] == 1; }),
              dim.end());
  s.partial.erase(std::remove_if(s.partial.begin(), s.partial.end(),
                                 [&](const PartialAxis& p) {
                                   return m.dims[static_cast<std::size_t>(p.axis)] == 1;
                                 }),
                  s.partial.end());
  std::sort(s.partial.begin(), s.partial.end(),
            [](const PartialAxis& x, const PartialAxis& y) { return x.axis < y.axis; });
  return s;
}

/// Plans, proves and checks the step chain is consistent (each step's before is the previous
/// after).
void prove(const Mesh& m, const Sharding& from, const Sharding& to,
           const std::vector<std::int64_t>& shape, Tally& tally, std::uint64_t seed) {
  auto p = plan_redistribution(m, from, to, shape, 2);
  if (!p.ok())
    FAIL(format_sharding(m, from) << " -> " << format_sharding(m, to) << ": "
                                  << p.error().message());
  auto proof = prove_plan(m, shape, from, to, *p, seed);
  if (!proof.ok())
    FAIL(format_sharding(m, from) << " -> " << format_sharding(m, to) << " on mesh of " << m.size()
                                  << " ranks: " << proof.error().message() << "\n"
                                  << p->describe(m));
  Sharding at = from;
  for (const RedistStep& s : p->steps) {
    if (!(effective(m, s.before) == effective(m, at)))
      FAIL("step chain broken: " << p->describe(m));
    at = s.after;
    tally.kinds.insert(s.kind);
  }
  // The end of the chain is the target up to partials made by relabelling (avg/max/min created from
  // replicated values need no step when no step precedes them).
  Sharding end = effective(m, at), want = effective(m, to);
  bool partial_ok = std::all_of(end.partial.begin(), end.partial.end(), [&](const PartialAxis& x) {
    return std::find(want.partial.begin(), want.partial.end(), x) != want.partial.end();
  });
  if (end.dims != want.dims || !partial_ok)
    FAIL("plan does not end at the target: " << p->describe(m));
  ++tally.plans;
  tally.remats += p->full_rematerialization ? 1 : 0;
}

std::vector<std::int64_t> shuffled(std::int64_t n, std::mt19937_64& rng) {
  std::vector<std::int64_t> r(static_cast<std::size_t>(n));
  std::iota(r.begin(), r.end(), 0);
  std::shuffle(r.begin(), r.end(), rng);
  return r;
}

}  // namespace

TEST_CASE("redistribute: every layout pair on meshes of up to 8 ranks is proven",
          "[shard][redistribute][property]") {
  const std::vector<std::vector<std::int64_t>> meshes{{2},    {4},       {2, 2}, {2, 4},
                                                      {4, 2}, {2, 2, 2}, {8}};
  const std::vector<std::string> names{"a", "b", "c"};
  std::mt19937_64 rng(2026);
  Tally tally;
  for (const auto& dims : meshes) {
    std::vector<std::string> axes(names.begin(),
                                  names.begin() + static_cast<std::ptrdiff_t>(dims.size()));
    auto base = Mesh::make(dims, axes);
    REQUIRE(base.ok());
    std::vector<std::int64_t> reversed(base->rank_list.rbegin(), base->rank_list.rend());
    for (const auto& ranks : {base->rank_list, reversed, shuffled(base->size(), rng)}) {
      auto m = Mesh::make(dims, axes, ranks);
      REQUIRE(m.ok());
      for (int rank : {2, 3}) {
        std::vector<Sharding> sources = all_layouts(static_cast<int>(dims.size()), rank, true);
        std::vector<Sharding> targets = all_layouts(static_cast<int>(dims.size()), rank, false);
        for (const Sharding& from : sources)
          for (const Sharding& to : targets)
            prove(*m, from, to, shape_for(*m, from, to, {1, 2, 1}), tally, 5);
      }
    }
  }
  // (2,2,2) alone has 176 sources x 106 targets of a 3-D tensor.
  CHECK(tally.plans > 50000);
  CHECK(tally.kinds.size() == 6);
  WARN("proved " << tally.plans << " plans, " << tally.remats << " with a full rematerialization");
}

TEST_CASE("redistribute: random 4-D meshes of up to 16 ranks and 3-D tensors are proven",
          "[shard][redistribute][property]") {
  std::mt19937_64 rng(20261121);
  const std::vector<ReduceOp> ops{ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min,
                                  ReduceOp::prod};
  Tally tally;
  auto pick = [&](std::int64_t n) {
    return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n));
  };
  for (int c = 0; c < 600; ++c) {
    std::vector<std::int64_t> dims;
    std::int64_t size = 1;
    for (int a = 0; a < 4; ++a) {
      std::int64_t d = std::vector<std::int64_t>{1, 2, 2, 4}[static_cast<std::size_t>(pick(4))];
      if (size * d > 16) d = 1;
      dims.push_back(d);
      size *= d;
    }
    auto m = Mesh::make(dims, {"w", "x", "y", "z"}, shuffled(size, rng));
    REQUIRE(m.ok());
    ReduceOp op = ops[static_cast<std::size_t>(pick(5))];
    // Source: each axis unused, partial or appended to a random dim; target likewise without
    // partial, except that a source partial axis is sometimes kept.
    Sharding from = Sharding::replicated(3), to = Sharding::replicated(3);
    for (int a = 0; a < 4; ++a) {
      std::int64_t k = pick(5);
      if (k == 4)
        from.partial.push_back({a, op});
      else if (k < 3)
        from.dims[static_cast<std::size_t>(k)].push_back(a);
    }
    std::shuffle(from.dims[0].begin(), from.dims[0].end(), rng);
    for (int a = 0; a < 4; ++a) {
      bool was_partial = std::any_of(from.partial.begin(), from.partial.end(),
                                     [&](auto p) { return p.axis == a; });
      if (was_partial && pick(3) == 0) {
        to.partial.push_back({a, op});
        continue;
      }
      std::int64_t k = pick(5);
      if (k < 3) to.dims[static_cast<std::size_t>(k)].push_back(a);
      if (k == 4 && op != ReduceOp::prod)
        to.partial.push_back({a, op});  // created from replicated values
    }
    std::shuffle(to.dims[1].begin(), to.dims[1].end(), rng);
    std::vector<std::int64_t> scale{1 + pick(3), 1 + pick(2), 1 + pick(3)};
    prove(*m, from, to, shape_for(*m, from, to, scale), tally, rng());
  }
  CHECK(tally.plans == 600);
  CHECK(tally.kinds.size() == 6);
}
