// Propagation beyond plain column/row parallelism (docs/shard.md, "Propagation"): fused q|k|v
// projections split Megatron's blocked way (attention head-parallel, no gather before the Split),
// GQA with fewer kv heads than tp ranks (k/v projections replicated, no gather), and a split moving
// between dims costing one all-to-all instead of a gather and a slice. Numerics of the same recipes
// against PyTorch are in partition_test.cpp; here the structure: which weights are blocked, which
// collectives each transformer block runs, and the all-to-all case run rank by rank.
#include <catch2/catch.hpp>

#include <fmt/core.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "hp/shard/simulate.h"
#include "shard_test_util.h"

using namespace hp;
using namespace hp::shard;
using namespace shard_test;
namespace fs = std::filesystem;

namespace {

struct BlockComm {
  int all_gather = 0, all_reduce = 0, reduce_scatter = 0, all_to_all = 0;
};

// Collective steps of the redistributions whose consumer lies in each repeated block; a tensor
// redistributed the same way for two consumers counts once (the partition reuses the result).
std::vector<BlockComm> per_block(const Prepared& P) {
  std::vector<BlockComm> out(P.layering.blocks.size());
  std::vector<std::pair<int, Sharding>> seen;
  for (const auto& r : P.prop.redistributions) {
    if (r.node < 0) continue;
    std::pair<int, Sharding> key{r.tensor, r.to};
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    for (std::size_t b = 0; b < P.layering.blocks.size(); ++b) {
      const auto& nodes = P.layering.blocks[b].nodes;
      if (std::find(nodes.begin(), nodes.end(), r.node) == nodes.end()) continue;
      for (const auto& s : r.plan.steps) {
        out[b].all_gather += s.kind == StepKind::all_gather;
        out[b].all_reduce += s.kind == StepKind::all_reduce;
        out[b].reduce_scatter += s.kind == StepKind::reduce_scatter;
        out[b].all_to_all += s.kind == StepKind::all_to_all;
      }
    }
  }
  return out;
}

int count_origin_prefix(const Prepared& p, const std::string& prefix) {
  int n = 0;
  for (std::size_t t = 0; t < p.graph.tensors.size(); ++t)
    if (p.graph.tensors[t].kind == model::TensorKind::initializer &&
        p.prop.origin[t].rfind(prefix, 0) == 0)
      ++n;
  return n;
}

// hp-domain ops in one rank's partition, by op type.
std::map<std::string, int> comm_ops(const Prepared& P, int stage, std::int64_t pos) {
  auto part = build_partition(P.plan, stage, pos);
  REQUIRE(part.ok());
  onnx::ModelProto m;
  REQUIRE(m.ParseFromString(part->onnx));
  std::map<std::string, int> n;
  for (const auto& node : m.graph().node())
    if (node.domain() == "hp") ++n[node.op_type()];
  return n;
}

struct TpRun {
  double worst = 0;                     // max |partitioned - PyTorch| over every rank's output
  std::map<std::string, int> by_op;     // collective calls (all ranks)
  std::map<std::string, int> hp_nodes;  // hp-domain nodes in the partitions (all ranks)
};

// Runs a dp = 1, pp = 1 recipe's ranks in threads (each gets the whole input and returns the whole
// output) and compares with the model's PyTorch outputs.
TpRun run_tp_world(const Prepared& P, const std::string& model_name, const fs::path& dir) {
  TpRun run;
  World world;
  auto backends = exec::open_backends("cpu", 1, {});
  REQUIRE(backends.ok());
  std::string io =
      std::string(HP_SOURCE_DIR) + "/tests/data/models/" + model_name + ".io/test_data_set_0";
  auto inputs = exec::read_tensor_dir(io, "input");
  REQUIRE(inputs.ok());
  auto expected = exec::read_tensor_dir(io, "output");
  REQUIRE(expected.ok());
  REQUIRE(P.plan.stages.size() == 1);
  auto n = static_cast<std::int64_t>(P.plan.stages[0].ranks.size());
  std::vector<std::unique_ptr<Comm>> comms;
  std::vector<std::unique_ptr<exec::Executor>> execs;
  for (std::int64_t pos = 0; pos < n; ++pos) {
    auto part = build_partition(P.plan, 0, pos);
    REQUIRE(part.ok());
    onnx::ModelProto mp;
    REQUIRE(mp.ParseFromString(part->onnx));
    for (const auto& node : mp.graph().node())
      if (node.domain() == "hp") ++run.hp_nodes[node.op_type()];
    fs::path f = dir / fmt::format("rank{}.onnx", part->rank);
    std::ofstream(f, std::ios::binary) << part->onnx;
    auto model = model::load_model(f, {model::LoadMode::require_data});
    REQUIRE(model.ok());
    comms.push_back(std::make_unique<Comm>(world, part->rank));
    auto ex =
        exec::Executor::create(*model, {backends->primary, backends->cpu, comms.back().get()});
    REQUIRE(ex.ok());
    execs.push_back(std::move(*ex));
  }
  std::vector<std::vector<HostTensor>> outs(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < outs.size(); ++k)
    threads.emplace_back([&, k] {
      auto out = execs[k]->run(*inputs);
      if (!out)
        errors[k] = out.error().str();
      else
        outs[k] = std::move(*out);
    });
  for (auto& t : threads) t.join();
  for (std::size_t k = 0; k < outs.size(); ++k) {
    INFO("rank " << k << ": " << errors[k]);
    REQUIRE(errors[k].empty());
    const auto& want = (*expected)[0];
    const auto& got = outs[k][0];
    REQUIRE(got.dims == want.dims);
    for (std::int64_t i = 0; i < want.numel(); ++i)
      run.worst = std::max(
          run.worst, static_cast<double>(std::fabs(want.as<float>()[i] - got.as<float>()[i])));
  }
  run.by_op = world.by_op;
  return run;
}

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("hp_shard_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

const char* kGpt2Head = "[recipe]\nversion = 1\nname = \"t\"\nmodel = \"" HP_SOURCE_DIR
                        "/tests/data/models/tiny-gpt2.onnx\"\n"
                        "cluster = \"local-cpu\"\n[model]\ndims = { batch = 2, seq = 12 }\n";

}  // namespace

TEST_CASE(
    "a fusion whose bias the recipe fixes whole is undone; the rest stay blocked and match PyTorch",
    "[shard][fused][numerics]") {
  // h.0's bias declared replicated cannot be cut into blocks: propagation runs again without fusing
  // h.0.c_attn (gathered before its Split, as before), the other three blocks stay fused.
  fs::path d = temp_dir("unfuse");
  std::ofstream(d / "r.toml") << kGpt2Head
                              << "[parallel]\ndp = 1\ntp = 2\npp = 1\n"
                                 "[layouts.\"h.0.c_attn.bias\"]\ndevice_matrix = [1, 2]\n"
                                 "alias_name = [\"dp\", \"tp\"]\ntensor_map = [\"None\"]\n";
  auto p = prepare(d / "r.toml");
  REQUIRE(p.ok());
  const Prepared& P = **p;
  int w0 = P.graph.find_tensor("h.0.c_attn.weight"), w1 = P.graph.find_tensor("h.1.c_attn.weight");
  REQUIRE(w0 >= 0);
  REQUIRE(w1 >= 0);
  CHECK(P.prop.blocked.count(w0) == 0);
  CHECK(P.prop.origin[static_cast<std::size_t>(w0)] == "column-parallel");
  CHECK(P.prop.blocked.count(w1) == 1);
  auto comm = per_block(P);
  CHECK(comm[0].all_gather >= 1);
  CHECK(comm[1].all_gather == 0);
  auto run = run_tp_world(P, "tiny-gpt2", d);
  std::printf("gpt2 tp=2, h.0 unfused: max |partitioned - pytorch| = %.3g\n", run.worst);
  CHECK(run.worst < 1e-4);
  fs::remove_all(d);
}

TEST_CASE("fused q|k|v projections are split blocked: no gather before the head split",
          "[shard][fused]") {
  auto name = GENERATE(as<std::string>{}, "gpt2-tp2", "gpt2-dp2-tp2-pp2", "vit-dp2-tp2");
  INFO(name);
  auto p = prepare(recipe_file(name));
  REQUIRE(p.ok());
  const Prepared& P = **p;
  const auto nblocks = static_cast<int>(P.layering.blocks.size());
  REQUIRE(nblocks >= 3);
  // The fused weight and its bias, cut into 3 blocks on their output dim, one pair per block.
  CHECK(count_origin_prefix(P, "column-parallel (blocked: 3 blocks on dim 0)") ==
        nblocks);  // [3h, h] weight
  CHECK(count_origin_prefix(P, "propagated (blocked: 3 blocks on dim 0)") == nblocks);  // [3h] bias
  for (const auto& [t, b] : P.prop.blocked) {
    CHECK(b.blocks == 3);
    // A blocked tensor is never redistributed (its order is not the tensor's).
    for (const auto& r : P.prop.redistributions) CHECK(r.tensor != t);
  }
  // Every block: one AllReduce after the attention output projection, one after the MLP, nothing
  // else. Before: the fused output was gathered before the Split, the output projection became
  // column-parallel, and the residual stream was gathered again for the next LayerNorm
  // (3 AllGather + 1 AllReduce per block, gpt2 and ViT alike). ViT's first block gathers the
  // residual stream once: the patch embedding (a Conv over output channels) leaves it split.
  auto comm = per_block(P);
  for (int b = 0; b < nblocks; ++b) {
    INFO("block " << b);
    CHECK(comm[static_cast<std::size_t>(b)].all_gather ==
          (b == 0 && name == "vit-dp2-tp2" ? 1 : 0));
    CHECK(comm[static_cast<std::size_t>(b)].all_reduce == 2);
    CHECK(comm[static_cast<std::size_t>(b)].reduce_scatter == 0);
  }
  // The Split / head Reshape reads its input as produced, each part split on the heads.
  int head_parallel = 0;
  for (std::size_t i = 0; i < P.graph.nodes.size(); ++i) {
    const auto& n = P.graph.nodes[i];
    if (n.op_type != "Softmax") continue;
    const auto& s = P.prop.layout[static_cast<std::size_t>(n.outputs[0])];
    REQUIRE(s.dims.size() == 4);
    head_parallel += s.dims[1] == std::vector<int>{P.tp_axis};
  }
  CHECK(head_parallel == nblocks);
}

TEST_CASE("gpt2 tp=2: rank partitions hold 2 AllReduce per block and no AllGather but the logits'",
          "[shard][fused]") {
  auto p = prepare(recipe_file("gpt2-tp2"));
  REQUIRE(p.ok());
  const Prepared& P = **p;
  auto n = static_cast<int>(P.layering.blocks.size());
  for (std::int64_t pos = 0; pos < 2; ++pos) {
    auto ops = comm_ops(P, 0, pos);
    // + 1 AllReduce for the vocabulary-parallel embedding, + 1 AllGather for the column-parallel
    // logits.
    CHECK(ops["AllReduce"] == 2 * n + 1);
    CHECK(ops["AllGather"] == 1);
  }
}

TEST_CASE("held_view: a blocked dim is [k, n/k] with the split on the minor", "[shard][fused]") {
  // held_view: the blocked dim becomes [k, n/k] with the split on the minor.
  auto m = Mesh::make({1, 2}, {"dp", "tp"});
  REQUIRE(m.ok());
  Sharding s{{{}, {1}}, {}};
  BlockedDim b{1, 3};
  auto v = held_view({4, 12}, s, &b);
  CHECK(v.shape == std::vector<std::int64_t>{4, 3, 4});
  CHECK(v.layout.dims == std::vector<std::vector<int>>{{}, {}, {1}});
  // Rank 1 holds columns 2-3 of each block of 4: 2, 3, 6, 7, 10, 11.
  auto r = slice_of(*m, v.layout, v.shape, 1);
  CHECK(r[1] == Range{0, 3});
  CHECK(r[2] == Range{2, 4});
  CHECK(held_view({4, 12}, s, nullptr).shape == std::vector<std::int64_t>{4, 12});
}

TEST_CASE("GQA: kv heads fewer than tp ranks replicate the k/v projections, no gather",
          "[shard][fused][gqa]") {
  auto p = prepare(recipe_file("llama-tp4"));
  REQUIRE(p.ok());
  const Prepared& P = **p;
  const auto nblocks = static_cast<int>(P.layering.blocks.size());
  // k_proj and v_proj of every layer: 2 kv heads cannot split over tp = 4 without cutting a head.
  CHECK(count_origin_prefix(P, "replicated (its column split would cut a head)") == 2 * nblocks);
  int notes = 0;
  for (const auto& n : P.prop.notes)
    notes += n.find("fewer heads than tp ranks") != std::string::npos;
  CHECK(notes == 2 * nblocks);
  // q (4 heads) stays column-parallel; nothing is gathered inside a block.
  auto comm = per_block(P);
  for (int b = 0; b < nblocks; ++b) {
    INFO("block " << b);
    CHECK(comm[static_cast<std::size_t>(b)].all_gather == 0);
    // + the vocabulary-parallel embedding's AllReduce, which block 0's first norm resolves.
    CHECK(comm[static_cast<std::size_t>(b)].all_reduce == (b == 0 ? 3 : 2));
  }
  // With tp = 2 (kv heads = tp) k/v stay column-parallel.
  auto q = prepare(recipe_file("llama-dp2-tp2-pp2"));
  REQUIRE(q.ok());
  CHECK(count_origin_prefix(**q, "replicated (its column split") == 0);
}

TEST_CASE("propagation moves a split between dims with one all-to-all", "[shard][alltoall]") {
  auto m = Mesh::make({1, 2}, {"dp", "tp"});
  REQUIRE(m.ok());
  Sharding seq{{{}, {1}, {}}, {}}, hidden{{{}, {}, {1}}, {}};
  auto plan = plan_for_consumer(*m, seq, hidden, {2, 12, 32}, 4);
  REQUIRE(plan.ok());
  REQUIRE(plan->steps.size() == 1);
  CHECK(plan->steps[0].kind == StepKind::all_to_all);
  CHECK(plan->steps[0].dim == 2);
  CHECK(plan->steps[0].concat_dim == 1);
  CHECK(prove_plan(*m, {2, 12, 32}, seq, hidden, *plan).ok());
  // The gather-then-slice plan the propagation used to insert is two steps and moves twice the
  // bytes.
  auto old = plan_steps(*m, seq, hidden, {2, 12, 32}, 4);
  REQUIRE(old.ok());
  CHECK(old->steps.size() == 2);
  CHECK(old->steps[0].kind == StepKind::all_gather);
  // Nothing moves between dims: the plain plan.
  auto same = plan_for_consumer(*m, seq, Sharding::replicated(3), {2, 12, 32}, 4);
  REQUIRE(same.ok());
  CHECK(same->steps.size() == 1);
  CHECK(same->steps[0].kind == StepKind::all_gather);
}

TEST_CASE(
    "a [layouts] override that moves a split from seq to hidden runs with an AllToAll and matches "
    "PyTorch",
    "[shard][alltoall][numerics]") {
  // Sequence parallelism leaves ln_2's output split on seq; declaring c_fc row-parallel (split on
  // its input dim) makes the MatMul read it split on hidden: seq -> hidden is one all-to-all over
  // tp.
  fs::path d = temp_dir("a2a");
  std::ofstream(d / "r.toml") << kGpt2Head
                              << "[parallel]\ndp = 1\ntp = 2\npp = 1\nsequence_parallel = true\n"
                                 "[layouts.\"h.1.c_fc.weight\"]\ndevice_matrix = [1, 2]\n"
                                 "alias_name = [\"dp\", \"tp\"]\ntensor_map = [\"None\", \"tp\"]\n";
  auto p = prepare(d / "r.toml");
  REQUIRE(p.ok());
  const Prepared& P = **p;
  int a2a = 0;
  for (const auto& r : P.prop.redistributions)
    for (const auto& s : r.plan.steps)
      if (s.kind == StepKind::all_to_all) {
        ++a2a;
        INFO(P.graph.tensor(r.tensor).name << ": " << describe_plan(P.prop.mesh, r.plan));
        CHECK(r.plan.steps.size() == 1);
        CHECK(prove_plan(P.prop.mesh, global_shape(P.graph.tensor(r.tensor)), r.from, r.to, r.plan)
                  .ok());
      }
  CHECK(a2a == 1);
  auto run = run_tp_world(P, "tiny-gpt2", d);
  std::printf("seq -> hidden via AllToAll: max |partitioned - pytorch| = %.3g, %d AllToAll calls\n",
              run.worst, run.by_op["AllToAll"]);
  CHECK(run.worst < 1e-4);
  CHECK(run.hp_nodes["AllToAll"] == 2);
  CHECK(run.by_op["AllToAll"] == 2);
  fs::remove_all(d);
}
