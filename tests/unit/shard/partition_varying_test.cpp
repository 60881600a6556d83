// RankPartition::varying (hp/shard/partition.h), the tensors whose values differ across the
// tensor-parallel members, which training reads to find where parallel regions begin
// (hp/train/autodiff.h, GradSpec::tp): on the MLP at tp=2 (hp shard makes its Gemms column- then
// row-parallel pairs) the split weights and what is computed from them vary, the all-reduced sums
// and the graph inputs do not; data and pipeline parallelism alone vary nothing, and a batch split
// over dp beside tp does not make the inputs vary.
#include <catch2/catch.hpp>

#include <fmt/core.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "hp/model/model.h"
#include "shard_test_util.h"

using namespace hp;
using namespace hp::shard;
using namespace shard_test;
namespace fs = std::filesystem;

namespace {

struct Part {
  RankPartition rp;
  onnx::ModelProto m;
  std::set<std::string> varying;
};

std::vector<Part> partitions(const std::string& recipe) {
  auto p = prepare(recipe);
  INFO(recipe << (p ? std::string() : ": " + p.error().str()));
  REQUIRE(p);
  std::vector<Part> out;
  for (const auto& st : (*p)->plan.stages)
    for (std::size_t pos = 0; pos < st.ranks.size(); ++pos) {
      auto rp = build_partition((*p)->plan, st.index, static_cast<std::int64_t>(pos));
      REQUIRE(rp);
      Part part;
      REQUIRE(part.m.ParseFromString(rp->onnx));
      part.varying.insert(rp->varying.begin(), rp->varying.end());
      part.rp = std::move(*rp);
      out.push_back(std::move(part));
    }
  return out;
}

}  // namespace

TEST_CASE("at tp=2 the split weights and their products vary, all-reduced sums do not",
          "[shard][partition]") {
  auto p = prepare(recipe_file("mlp-tp2"));
  REQUIRE(p);
  const Prepared& P = **p;
  const auto parts = partitions(recipe_file("mlp-tp2"));
  REQUIRE(parts.size() == 2);
  for (const auto& part : parts) {
    INFO("position " << part.rp.position);
    const auto& v = part.varying;
    // The first Gemm is column-parallel: its weight's rows (output features) are split, and so
    // are its output and the Relu of that.
    const int w = P.graph.find_tensor("inp.weight");
    REQUIRE(w >= 0);
    REQUIRE(P.prop.layout[static_cast<std::size_t>(w)].dims[0].size() == 1);
    CHECK(v.count("inp.weight"));
    CHECK(v.count("/inp/Gemm_output_0"));
    CHECK(v.count("/Relu_output_0"));
    // The graph's inputs are the same on every member, and so is its output.
    for (const auto& in : part.m.graph().input()) CHECK_FALSE(v.count(in.name()));
    for (const auto& out : part.m.graph().output()) CHECK_FALSE(v.count(out.name()));
    // Every all-reduce sums varying parts into a value every member holds.
    int reduces = 0;
    for (const auto& n : part.m.graph().node())
      if (n.domain() == "hp" && n.op_type() == "AllReduce") {
        ++reduces;
        INFO(n.input(0) << " -> " << n.output(0));
        CHECK(v.count(n.input(0)));
        CHECK_FALSE(v.count(n.output(0)));
      }
    CHECK(reduces >= 2);
    // A weight varies exactly when its layout splits it over tp or leaves it a partial addend.
    int weights = 0;
    for (const auto& init : part.m.graph().initializer()) {
      const int t = P.graph.find_tensor(init.name());
      if (t < 0) continue;  // hp's own constants
      const Sharding& s = P.prop.layout[static_cast<std::size_t>(t)];
      bool split = !s.partial.empty();
      for (const auto& d : s.dims) split = split || !d.empty();
      INFO(init.name());
      CHECK(static_cast<bool>(v.count(init.name())) == split);
      ++weights;
    }
    CHECK(weights == 12);
    // Both members list the same tensors: what varies is a property of the program.
    CHECK(part.varying == parts[0].varying);
  }
}

TEST_CASE("run at tp=2, the members agree on every tensor not listed as varying",
          "[shard][partition]") {
  // Every float tensor the partitions compute becomes a graph output; both members run on the same
  // input (tp alone does not split the batch).
  auto parts = partitions(recipe_file("mlp-tp2"));
  REQUIRE(parts.size() == 2);
  auto backends = exec::open_backends("cpu", 1, {});
  REQUIRE(backends);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  HostTensor x;
  x.dtype = HP_F32;
  x.dims = {3, 32};
  x.data.resize(3 * 32 * 4);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = nd(rng);
  World world;
  std::vector<std::string> names;
  std::vector<std::vector<HostTensor>> outs(2);
  std::vector<std::string> errors(2);
  std::vector<std::unique_ptr<Comm>> comms;
  std::vector<std::unique_ptr<exec::Executor>> execs;
  for (auto& part : parts) {
    auto& g = *part.m.mutable_graph();
    std::set<std::string> declared;
    for (const auto& o : g.output()) declared.insert(o.name());
    names.clear();
    for (const auto& n : g.node())
      for (const auto& o : n.output())
        if (!declared.count(o)) {
          auto* vi = g.add_output();
          vi->set_name(o);
          vi->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
        }
    for (const auto& o : g.output()) names.push_back(o.name());
    model::Model m;
    m.path = "partition.onnx";
    m.proto = std::make_shared<onnx::ModelProto>(part.m);
    for (const auto& o : part.m.opset_import()) m.opsets[o.domain()] = o.version();
    m.ir_version = part.m.ir_version();
    comms.push_back(std::make_unique<Comm>(world, part.rp.rank));
    auto ex = exec::Executor::create(m, {backends->primary, backends->cpu, comms.back().get()});
    INFO((ex ? std::string() : ex.error().str()));
    REQUIRE(ex);
    execs.push_back(std::move(*ex));
  }
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < 2; ++k)
    threads.emplace_back([&, k] {
      auto r = execs[k]->run({x});
      if (r)
        outs[k] = std::move(*r);
      else
        errors[k] = r.error().str();
    });
  for (auto& t : threads) t.join();
  REQUIRE(errors == std::vector<std::string>(2));
  int same = 0, differ = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    const bool equal = outs[0][i].dims == outs[1][i].dims && outs[0][i].data == outs[1][i].data;
    CHECK(equal != static_cast<bool>(parts[0].varying.count(names[i])));
    (equal ? same : differ)++;
  }
  CHECK(same >= 4);  // the all-reduced sums, their Relus, the output
  CHECK(differ >= 8);
}

TEST_CASE("data and pipeline parallelism alone vary nothing", "[shard][partition]") {
  // The MLP over dp=2 (each rank a half of the batch, the weights whole).
  const fs::path dir = fs::temp_directory_path() / fmt::format("hp-varying-{}", ::getpid());
  fs::create_directories(dir);
  const fs::path recipe = dir / "mlp-dp2.toml";
  {
    std::ofstream f(recipe);
    f << "[recipe]\nversion = 1\nname = \"mlp-dp2\"\nmodel = \"" << HP_SOURCE_DIR
      << "/tests/data/models/tiny-mlp.onnx\"\ncluster = \"local-cpu\"\nnodes = 2\n\n"
         "[model]\ndims = { batch = 4 }\n\n[parallel]\ndp = 2\ntp = 1\npp = 1\n";
  }
  const auto dp = partitions(recipe.string());
  fs::remove_all(dir);
  REQUIRE(dp.size() == 2);
  for (const auto& part : dp) {
    INFO("dp position " << part.rp.position);
    CHECK(part.rp.varying.empty());
  }
  // GPT-2 over dp=2 and pp=2: no stage's partition varies.
  const auto pp = partitions(recipe_file("gpt2-dp2-pp2-mb2"));
  REQUIRE(pp.size() == 4);
  for (const auto& part : pp) {
    INFO("rank " << part.rp.rank);
    CHECK(part.rp.varying.empty());
  }
  // With tp beside dp, the inputs split over dp still do not vary over tp.
  const auto both = partitions(recipe_file("gpt2-dp2-tp2-pp2"));
  REQUIRE(both.size() == 8);
  for (const auto& part : both) {
    INFO("rank " << part.rp.rank);
    CHECK_FALSE(part.varying.empty());
    for (const auto& in : part.m.graph().input()) CHECK_FALSE(part.varying.count(in.name()));
  }
}
