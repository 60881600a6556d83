// TensorParallelSync (hp/train/tensor_parallel.h) on two in-process members: weights split on rows,
// on columns, on the minor part of a fused dim (each member's piece of every block), replicated and
// partial ones. The members' slices are cut here element by element, independently of the library's
// block copies, and gather, slice, the global norm and the partial addends' scaling are checked
// against the whole tensors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>

#include "hp/plugin/hp_plugin.h"
#include "hp/train/tensor_parallel.h"

using hp::exec::HostTensor;
using namespace hp::train;

namespace {

HostTensor random(const std::string& name, std::vector<std::int64_t> dims, std::uint32_t seed) {
  HostTensor t;
  t.name = name;
  t.dtype = HP_F32;
  t.dims = std::move(dims);
  t.data.resize(static_cast<std::size_t>(t.numel()) * 4);
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = d(gen);
  return t;
}

// The elements of `whole` (flat index order) that `keep` selects, as a tensor shaped `dims`.
HostTensor pick(const HostTensor& whole, std::vector<std::int64_t> dims,
                const std::function<bool(std::int64_t)>& keep) {
  HostTensor s;
  s.name = whole.name;
  s.dtype = HP_F32;
  s.dims = std::move(dims);
  std::vector<float> v;
  for (std::int64_t i = 0; i < whole.numel(); ++i)
    if (keep(i)) v.push_back(whole.as<float>()[i]);
  s.data.resize(v.size() * 4);
  std::memcpy(s.data.data(), v.data(), s.data.size());
  return s;
}

// The model: "rows" [4, 3] split on dim 0, "cols" [3, 4] split on dim 1, "fused" [24] seen as
// [3, 8] with the 8 split (member m holds elements 4m..4m+3 of each block of 8), "rep" [5] whole
// on both, "part" [3] an addend of a sum over the 2 members.
std::map<std::string, ParamCut> model_cuts() {
  std::map<std::string, ParamCut> c;
  c["rows"] = ParamCut{{4, 3}, {4, 3}, {{{0, 2}, {0, 3}}, {{2, 4}, {0, 3}}}};
  c["cols"] = ParamCut{{3, 4}, {3, 4}, {{{0, 3}, {0, 2}}, {{0, 3}, {2, 4}}}};
  c["fused"] = ParamCut{{24}, {3, 8}, {{{0, 3}, {0, 4}}, {{0, 3}, {4, 8}}}};
  ParamCut part;
  part.shape = {3};
  part.partial = 2;
  c["part"] = part;
  return c;
}

// Whole tensors of the model (seeded by `seed`), in parameter order.
std::vector<HostTensor> wholes(std::uint32_t seed) {
  return {random("rows", {4, 3}, seed), random("cols", {3, 4}, seed + 1),
          random("fused", {24}, seed + 2), random("rep", {5}, seed + 3),
          random("part", {3}, seed + 4)};
}

// Member m's slices of `w` (wholes() order), cut independently of the library.
std::vector<HostTensor> slices(const std::vector<HostTensor>& w, std::int64_t m) {
  return {pick(w[0], {2, 3}, [&](std::int64_t i) { return i / 3 / 2 == m; }),
          pick(w[1], {3, 2}, [&](std::int64_t i) { return i % 4 / 2 == m; }),
          pick(w[2], {12}, [&](std::int64_t i) { return i % 8 / 4 == m; }), w[3], w[4]};
}

bool same(const HostTensor& a, const HostTensor& b) {
  return a.dims == b.dims && a.dtype == b.dtype && a.data == b.data;
}

double squares(const HostTensor& t) {
  double s = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) s += double(t.as<float>()[i]) * t.as<float>()[i];
  return s;
}

hp::Status fail(const std::string& what) { return hp::Error(hp::Errc::runtime, what); }

}  // namespace

TEST_CASE("tensor-parallel gather, slice, norm and partial addends over two members",
          "[train][tp]") {
  const auto cuts = model_cuts();
  const auto weights = wholes(1), grads = wholes(50);
  // The whole model's gradient norm: every tensor counted once.
  double want_sq = 0;
  for (const auto& g : grads) want_sq += squares(g);
  std::mutex mu;
  std::vector<double> norms(2);
  auto st = hp::comm::run_in_process(2, [&](int rank, hp::comm::Transport& t) -> hp::Status {
    TensorParallel tp;
    tp.transport = &t;
    tp.group = {0, 1};
    if (!tp.active() || tp.index() != rank) return fail("index");
    auto mine = slices(weights, rank);
    HP_ASSIGN_OR_RETURN(auto sync, TensorParallelSync::create(tp, cuts, mine));
    if (!sync->split(0) || !sync->split(1) || !sync->split(2) || sync->split(3) || sync->split(4))
      return fail("split() does not follow the cuts");
    HP_ASSIGN_OR_RETURN(auto gathered, sync->gather(mine));
    if (gathered.size() != weights.size()) return fail("gather's count");
    for (std::size_t k = 0; k < weights.size(); ++k) {
      if (!same(gathered[k], weights[k])) return fail("gather of '" + weights[k].name + "'");
      HP_ASSIGN_OR_RETURN(auto s, sync->slice(k, weights[k]));
      if (!same(s, mine[k])) return fail("slice of '" + weights[k].name + "'");
    }
    // Optimizer state shaped like the parameters gathers the same way.
    auto gslices = slices(grads, rank);
    HP_ASSIGN_OR_RETURN(auto ggathered, sync->gather(gslices));
    for (std::size_t k = 0; k < grads.size(); ++k)
      if (!same(ggathered[k], grads[k])) return fail("gather of gradient " + grads[k].name);
    HP_ASSIGN_OR_RETURN(double norm, sync->global_norm(gslices));
    // Partial addends: trained = stored * 2, and stored() gives the executor its share back.
    auto trained = mine;
    sync->to_trained(trained);
    for (std::size_t k = 0; k < mine.size(); ++k) {
      const float scale = k == 4 ? 2.0f : 1.0f;
      for (std::int64_t i = 0; i < mine[k].numel(); ++i)
        if (trained[k].as<float>()[i] != scale * mine[k].as<float>()[i])
          return fail("to_trained of '" + mine[k].name + "'");
      if (!same(sync->stored(k, trained[k]), mine[k]))
        return fail("stored of '" + mine[k].name + "'");
    }
    // slice() refuses a whole tensor of another shape.
    auto wrong = sync->slice(0, weights[1]);
    if (wrong || wrong.error().code != hp::Errc::bad_input)
      return fail("a [3, 4] tensor was sliced as a [4, 3] one");
    std::lock_guard<std::mutex> lock(mu);
    norms[static_cast<std::size_t>(rank)] = norm;
    return {};
  });
  INFO((st ? std::string() : st.error().str()));
  REQUIRE(st);
  for (double n : norms) CHECK(n == Approx(std::sqrt(want_sq)).epsilon(1e-12));
  // Had the split gradients been counted per member only, or the replicated ones twice, the norm
  // would differ.
  CHECK(std::fabs(std::sqrt(want_sq + squares(grads[3]) + squares(grads[4])) - norms[0]) > 1e-3);
}

TEST_CASE("tensor-parallel cuts that do not fit the partition are refused", "[train][tp]") {
  auto st = hp::comm::run_in_process(2, [&](int rank, hp::comm::Transport& t) -> hp::Status {
    TensorParallel tp;
    tp.transport = &t;
    tp.group = {0, 1};
    const auto whole = wholes(3);
    auto expect_bad = [&](const std::string& what, const std::map<std::string, ParamCut>& cuts,
                          const std::vector<HostTensor>& params) -> hp::Status {
      auto s = TensorParallelSync::create(tp, cuts, params);
      if (s || s.error().code != hp::Errc::bad_input) return fail(what + " was accepted");
      return {};
    };
    // The partition's "rows" is [3, 3] where its cut gives the member 2 x 3 elements.
    auto mine = slices(whole, rank);
    mine[0] = random("rows", {3, 3}, 9);
    HP_TRY(expect_bad("a slice of the wrong size", model_cuts(), mine));
    // A cut with ranges for one member of two.
    auto cuts = model_cuts();
    cuts["cols"].ranges.pop_back();
    HP_TRY(expect_bad("a cut for one member", cuts, slices(whole, rank)));
    // A whole (replicated) parameter that is not float32.
    auto f64 = slices(whole, rank);
    f64[3].dtype = HP_F64;
    HP_TRY(expect_bad("a float64 replicated parameter", model_cuts(), f64));
    // A split one of another type, whose bytes the norm and the gathers would read as float32.
    auto split_f64 = slices(whole, rank);
    split_f64[1].dtype = HP_F64;
    HP_TRY(expect_bad("a float64 split parameter", model_cuts(), split_f64));
    // A rank outside the group.
    TensorParallel other = tp;
    other.group = {rank == 0 ? 1 : 0, 7};
    auto s = TensorParallelSync::create(other, model_cuts(), slices(whole, rank));
    if (s || s.error().code != hp::Errc::bad_input) return fail("a rank outside its group");
    if (other.index() != -1) return fail("index() outside the group");
    return {};
  });
  INFO((st ? std::string() : st.error().str()));
  REQUIRE(st);
}
