// DataParallelSync (hp/train/data_parallel.h) on in-process ranks: whatever the ZeRO level and the
// HSDP grouping, every rank ends a step with the parameters and the state one rank gets from the
// label-weighted mean gradient.
#include <catch2/catch.hpp>

#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>

#include "hp/plugin/hp_plugin.h"
#include "hp/train/data_parallel.h"

using hp::exec::HostTensor;
using namespace hp::train;

namespace {

HostTensor tensor(const std::string& name, std::vector<std::int64_t> dims, std::uint32_t seed) {
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

// Odd sizes, so shards cut through tensors and the flat vector needs padding.
std::vector<HostTensor> model_params() {
  return {tensor("w1", {7, 5}, 1), tensor("b1", {5}, 2), tensor("w2", {5, 3}, 3),
          tensor("b2", {3}, 4)};
}

std::vector<HostTensor> rank_grads(int rank, std::uint32_t step) {
  auto g = model_params();
  for (std::size_t k = 0; k < g.size(); ++k)
    g[k] = tensor(g[k].name, g[k].dims, 100 * step + 10 * rank + k);
  return g;
}

double max_diff(const HostTensor& a, const HostTensor& b) {
  double d = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, std::fabs(static_cast<double>(a.as<float>()[i]) - b.as<float>()[i]));
  return d;
}

struct Case {
  int ranks, zero, shard;
  bool overlap = false;  ///< hand the gradients over one by one, last first, as a backward does
  bool hold = false;     ///< ZeRO-3 holding the parameters, fetched bucket by bucket each step
};

// ZeRO-3: what the executor borrows, bucket by bucket (asked for ahead, as it asks), is the whole
// parameters gather_parameters gives, each divided by its DataParallel::divisor when given.
hp::Status check_fetches(DataParallelSync& sync, const std::vector<HostTensor>& params,
                         const std::vector<std::int64_t>& divisor = {}) {
  HP_ASSIGN_OR_RETURN(auto whole, sync.gather_parameters(params));
  for (std::size_t k = 0; k < divisor.size(); ++k)
    for (std::int64_t i = 0; i < whole[k].numel(); ++i)
      whole[k].as<float>()[i] /= static_cast<float>(divisor[k]);
  const auto groups = sync.weight_groups(params);
  for (std::size_t g = 0; g < groups.size(); ++g) sync.prefetch(g);
  std::size_t k = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::vector<std::vector<float>> got;
    std::vector<float*> dst;
    for (std::size_t j = 0; j < groups[g].size(); ++j)
      got.emplace_back(static_cast<std::size_t>(whole[k + j].numel()));
    for (auto& v : got) dst.push_back(v.data());
    HP_TRY(sync.fetch(g, dst));
    for (auto& v : got) {
      if (std::memcmp(v.data(), whole[k].data.data(), whole[k].data.size()) != 0)
        return hp::Error(hp::Errc::runtime, "a fetched parameter differs", whole[k].name);
      ++k;
    }
  }
  return {};
}

// `steps` updates with `ranks` ranks whose label counts differ (rank 1 has none at step 2), against
// one rank updating from sum_r (n_r / N) g_r.
void check_case(const Case& c, const OptimizerConfig& cfg) {
  const int steps = 3;
  auto counts = [](int rank, int step) -> std::int64_t {
    return rank == 1 && step == 2 ? 0 : 3 + rank + step;
  };
  // The single-rank reference.
  auto ref = model_params();
  OptimizerState ref_state;
  std::vector<double> ref_loss;
  for (int s = 1; s <= steps; ++s) {
    std::int64_t total = 0;
    for (int r = 0; r < c.ranks; ++r) total += counts(r, s);
    auto mean = model_params();
    double loss = 0;
    for (auto& m : mean) std::memset(m.data.data(), 0, m.data.size());
    for (int r = 0; r < c.ranks; ++r) {
      const double w = static_cast<double>(counts(r, s)) / total;
      if (counts(r, s) == 0) continue;
      auto g = rank_grads(r, s);
      for (std::size_t k = 0; k < g.size(); ++k)
        for (std::int64_t i = 0; i < g[k].numel(); ++i)
          mean[k].as<float>()[i] += static_cast<float>(w) * g[k].as<float>()[i];
      loss += w * (1.0 + r + s);
    }
    REQUIRE(optimizer_step(cfg, ref, mean, ref_state));
    ref_loss.push_back(loss);
  }
  std::mutex mu;
  std::vector<std::vector<HostTensor>> finals(static_cast<std::size_t>(c.ranks));
  std::vector<OptimizerState> gathered(static_cast<std::size_t>(c.ranks));
  auto st = hp::comm::run_in_process(c.ranks, [&](int rank, hp::comm::Transport& t) -> hp::Status {
    DataParallel dp;
    dp.transport = &t;
    for (int r = 0; r < c.ranks; ++r) dp.group.push_back(r);
    dp.zero = c.zero;
    dp.shard = c.shard;
    dp.bucket_bytes = 24;  // buckets of one or two parameters even on this small model
    auto params = model_params();
    HP_ASSIGN_OR_RETURN(auto sync, DataParallelSync::create(dp, params));
    if (c.hold) {
      HP_TRY(sync->hold_parameters(params));
      if (!params[0].data.empty()) return hp::Error(hp::Errc::runtime, "parameters still held");
    }
    OptimizerState state;
    for (int s = 1; s <= steps; ++s) {
      if (c.hold) HP_TRY(check_fetches(*sync, params));
      auto grads = rank_grads(rank, s);
      if (counts(rank, s) == 0)  // a rank without labels has NaN where torch divides 0 by 0
        for (auto& g : grads) g.as<float>()[0] = std::nanf("");
      double loss = 0;
      if (c.overlap) {
        HP_TRY(sync->begin_step(counts(rank, s)));
        for (std::size_t k = grads.size(); k-- > 1;) sync->gradient_ready(k, grads[k]);
        HP_ASSIGN_OR_RETURN(loss, sync->finish_step(1.0 + rank + s, grads));  // takes grads[0]
      } else {
        HP_ASSIGN_OR_RETURN(loss, sync->reduce(1.0 + rank + s, counts(rank, s), grads));
      }
      if (std::fabs(loss - ref_loss[static_cast<std::size_t>(s - 1)]) > 1e-12)
        return hp::Error(hp::Errc::runtime, "loss differs");
      HP_ASSIGN_OR_RETURN(auto info, sync->update(cfg, params, grads, state));
      (void)info;
    }
    if (c.hold) {
      // No whole gradient vector: only bucket buffers, never more than the buckets' sum.
      std::int64_t flat = 0;
      for (const auto& p : model_params()) flat += p.numel() + c.ranks;  // padding at most
      const std::int64_t staged = sync->gradient_bytes();
      if (staged <= 0 || staged > flat * 4)
        return hp::Error(hp::Errc::runtime, fmt::format("{} bytes of gradient buffers", staged));
      HP_ASSIGN_OR_RETURN(params, sync->gather_parameters(params));
    }
    HP_ASSIGN_OR_RETURN(auto whole, sync->gather_state(state, params));
    // slice_state inverts gather_state.
    auto again = sync->slice_state(whole);
    for (std::size_t k = 0; k < again.exp_avg.size(); ++k)
      if (again.exp_avg[k].data != state.exp_avg[k].data)
        return hp::Error(hp::Errc::runtime, "slice_state(gather_state) differs");
    std::lock_guard<std::mutex> lock(mu);
    finals[static_cast<std::size_t>(rank)] = std::move(params);
    gathered[static_cast<std::size_t>(rank)] = std::move(whole);
    return {};
  });
  INFO("ranks " << c.ranks << " zero " << c.zero << " shard " << c.shard << " overlap " << c.overlap
                << " hold " << c.hold);
  INFO((st ? std::string() : st.error().str()));
  REQUIRE(st);
  for (int r = 0; r < c.ranks; ++r) {
    for (std::size_t k = 0; k < ref.size(); ++k) {
      INFO("rank " << r << " tensor " << ref[k].name);
      CHECK(max_diff(finals[static_cast<std::size_t>(r)][k], ref[k]) < 1e-5);
      REQUIRE(gathered[static_cast<std::size_t>(r)].exp_avg.size() == ref_state.exp_avg.size());
      CHECK(max_diff(gathered[static_cast<std::size_t>(r)].exp_avg[k], ref_state.exp_avg[k]) <
            1e-6);
      if (!ref_state.exp_avg_sq.empty())
        CHECK(max_diff(gathered[static_cast<std::size_t>(r)].exp_avg_sq[k],
                       ref_state.exp_avg_sq[k]) < 1e-6);
    }
    CHECK(gathered[static_cast<std::size_t>(r)].step == steps);
  }
}

}  // namespace

TEST_CASE("data parallelism equals one rank at every ZeRO level and with HSDP", "[train][dp]") {
  OptimizerConfig adamw;
  adamw.lr = 0.01;
  adamw.clip_norm = 0.5;  // clipping reads the global norm of sharded gradients
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  for (const Case& c :
       {Case{2, 0, 0}, Case{2, 1, 0}, Case{2, 2, 0}, Case{2, 3, 0}, Case{3, 2, 0}, Case{4, 1, 2},
        Case{4, 2, 2}, Case{4, 3, 2}, Case{2, 0, 0, true}, Case{2, 2, 0, true}, Case{4, 2, 2, true},
        Case{2, 3, 0, true, true}, Case{4, 3, 2, true, true}, Case{3, 3, 0, false, true}}) {
    check_case(c, adamw);
    check_case(c, sgd);
  }
}

TEST_CASE("a model smaller than the shard count leaves ranks without pieces", "[train][dp]") {
  // 2 elements over 4 shards: ranks 2 and 3 own nothing, yet take part in every collective.
  for (const bool hold : {false, true}) {  // ZeRO-2, and ZeRO-3 holding the parameters
    auto st = hp::comm::run_in_process(4, [&](int rank, hp::comm::Transport& t) -> hp::Status {
      DataParallel dp{&t, {0, 1, 2, 3}, hold ? 3 : 2, 0};
      std::vector<HostTensor> params{tensor("p", {2}, 7)};
      HP_ASSIGN_OR_RETURN(auto sync, DataParallelSync::create(dp, params));
      if (hold) HP_TRY(sync->hold_parameters(params));
      if (rank >= 2 && !sync->pieces().empty()) return hp::Error(hp::Errc::runtime, "pieces");
      OptimizerState state;
      OptimizerConfig cfg;
      std::vector<HostTensor> grads{tensor("p", {2}, 8)};
      HP_ASSIGN_OR_RETURN(double loss, sync->reduce(1.0, 1, grads));
      (void)loss;
      HP_ASSIGN_OR_RETURN(auto info, sync->update(cfg, params, grads, state));
      (void)info;
      if (hold) {
        HP_ASSIGN_OR_RETURN(params, sync->gather_parameters(params));
        if (params.size() != 1 || params[0].numel() != 2)
          return hp::Error(hp::Errc::runtime, "gathered parameters");
      }
      HP_ASSIGN_OR_RETURN(auto whole, sync->gather_state(state, params));
      if (whole.exp_avg.size() != 1 || whole.exp_avg[0].numel() != 2)
        return hp::Error(hp::Errc::runtime, "gathered state");
      return {};
    });
    INFO("hold " << hold);
    REQUIRE(st);
  }
}

TEST_CASE("ZeRO-3 hands the executor partial addends divided", "[train][dp]") {
  // With tensor parallelism a row-parallel bias is trained whole and stored divided by the group
  // size (DataParallel::divisor): the held shards are the trained values, a fetch divides.
  auto st = hp::comm::run_in_process(2, [&](int, hp::comm::Transport& t) -> hp::Status {
    DataParallel dp{&t, {0, 1}, 3, 0};
    dp.divisor = {1, 2, 1, 4};
    auto params = model_params();
    const auto trained = model_params();
    HP_ASSIGN_OR_RETURN(auto sync, DataParallelSync::create(dp, params));
    HP_TRY(sync->hold_parameters(params));
    HP_TRY(check_fetches(*sync, params, dp.divisor));
    // What checkpoints get is the values trained, undivided.
    HP_ASSIGN_OR_RETURN(auto whole, sync->gather_parameters(params));
    for (std::size_t j = 0; j < whole.size(); ++j)
      if (max_diff(whole[j], trained[j]) != 0)
        return hp::Error(hp::Errc::runtime, "a gathered parameter differs", whole[j].name);
    return {};
  });
  REQUIRE(st);
}

TEST_CASE("data-parallel layouts that cannot work are refused", "[train][dp]") {
  auto st = hp::comm::run_in_process(4, [&](int, hp::comm::Transport& t) -> hp::Status {
    auto params = model_params();
    auto bad_shard = DataParallelSync::create(DataParallel{&t, {0, 1, 2, 3}, 2, 3}, params);
    if (bad_shard || bad_shard.error().code != hp::Errc::bad_input)
      return hp::Error(hp::Errc::runtime, "shard 3 of 4 accepted");
    auto bad_level = DataParallelSync::create(DataParallel{&t, {0, 1, 2, 3}, 4, 0}, params);
    if (bad_level) return hp::Error(hp::Errc::runtime, "level 4 accepted");
    auto f64 = params;
    f64[0].dtype = HP_F64;
    if (DataParallelSync::create(DataParallel{&t, {0, 1, 2, 3}, 1, 0}, f64))
      return hp::Error(hp::Errc::runtime, "f64 parameter accepted");
    // Only ZeRO-3 holds the parameters; nothing is lent before.
    HP_ASSIGN_OR_RETURN(auto level2,
                        DataParallelSync::create(DataParallel{&t, {0, 1, 2, 3}, 2, 0}, params));
    if (level2->hold_parameters(params) || params[0].data.empty())
      return hp::Error(hp::Errc::runtime, "level 2 took the parameters");
    float x = 0;
    float* dst[] = {&x};
    if (level2->fetch(0, dst)) return hp::Error(hp::Errc::runtime, "a fetch without parameters");
    return {};
  });
  REQUIRE(st);
  // Every rank without a label: nothing to average.
  auto none = hp::comm::run_in_process(2, [&](int, hp::comm::Transport& t) -> hp::Status {
    auto params = model_params();
    HP_ASSIGN_OR_RETURN(auto sync,
                        DataParallelSync::create(DataParallel{&t, {0, 1}, 0, 0}, params));
    auto grads = rank_grads(0, 1);
    auto loss = sync->reduce(1.0, 0, grads);
    if (loss || loss.error().code != hp::Errc::runtime)
      return hp::Error(hp::Errc::internal, "an all-ignored batch was averaged");
    return {};
  });
  REQUIRE(none);
}

TEST_CASE("a sync destroyed with a gather in flight gives up instead of waiting", "[train][dp]") {
  // Rank 0 asks for a bucket (its gathering thread starts the all-gather) and then stops, as a rank
  // does on an error mid-step; rank 1 never takes part. Destroying rank 0's sync must cancel the
  // gather rather than wait out the transport's 30 s bound.
  const auto t0 = std::chrono::steady_clock::now();
  auto st = hp::comm::run_in_process(
      2,
      [&](int rank, hp::comm::Transport& t) -> hp::Status {
        DataParallel dp{&t, {0, 1}, 3, 0};
        auto params = model_params();
        HP_ASSIGN_OR_RETURN(auto sync, DataParallelSync::create(dp, params));
        HP_TRY(sync->hold_parameters(params));
        if (rank == 0) sync->prefetch(0);
        return {};
      },
      30);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(st);
  CHECK(s < 10);
}
