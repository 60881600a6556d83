// The cuts tensor-parallel training reads from hp shard's layouts (libs/job/src/train_tensor.cpp):
// for GPT-2 and the MLP at tp=2 every member's part holds, for each cut weight, exactly the
// elements its cut gives it, and TensorParallelSync gathers the members' initializers back into the
// exported weights bit for bit: row- and column-split weights, the fused q|k|v projection whose
// members hold a piece of each block, and the partial biases of row-parallel layers (stored
// halved).
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "hp/job/train_run.h"
#include "hp/plugin/hp_plugin.h"
#include "hp/train/tensor_parallel.h"

using namespace hp;
using exec::HostTensor;

namespace {

std::string source(const std::string& rel) { return std::string(HP_SOURCE_DIR) + "/" + rel; }

onnx::ModelProto read_model(const std::string& bytes) {
  onnx::ModelProto m;
  REQUIRE(m.ParseFromString(bytes));
  return m;
}

// The float32 initializers of `m` by name, as host tensors.
std::map<std::string, HostTensor> floats(const onnx::ModelProto& m) {
  std::map<std::string, HostTensor> out;
  for (const auto& t : m.graph().initializer()) {
    if (t.data_type() != onnx::TensorProto::FLOAT) continue;
    HostTensor h;
    h.name = t.name();
    h.dtype = HP_F32;
    h.dims.assign(t.dims().begin(), t.dims().end());
    h.data.resize(static_cast<std::size_t>(h.numel()) * 4);
    if (t.has_raw_data()) {
      REQUIRE(t.raw_data().size() == h.data.size());
      std::memcpy(h.data.data(), t.raw_data().data(), h.data.size());
    } else {
      REQUIRE(t.float_data_size() == h.numel());
      std::memcpy(h.data.data(), t.float_data().data(), h.data.size());
    }
    out.emplace(t.name(), std::move(h));
  }
  return out;
}

std::int64_t count(const std::vector<std::pair<std::int64_t, std::int64_t>>& r) {
  std::int64_t n = 1;
  for (auto [b, e] : r) n *= e - b;
  return n;
}

// Checks the cuts of `recipe` (tp=2) against its partitions and `model`'s weights; returns them.
std::map<std::string, train::ParamCut> check_cuts(const std::string& recipe,
                                                  const std::string& model) {
  auto job = job::load_job(source("tests/data/recipes/shard/" + recipe + ".toml"));
  INFO((job ? std::string() : job.error().str()));
  REQUIRE(job);
  train::TrainOptions to;
  auto made = job::tensor_parallel_options(*job, to);
  INFO((made ? std::string() : made.error().str()));
  REQUIRE(made);
  REQUIRE(to.tp.grid == std::vector<std::vector<int>>{{0, 1}});
  std::ifstream f(source("tests/data/models/" + model + ".onnx"), std::ios::binary);
  std::stringstream bytes;
  bytes << f.rdbuf();
  const auto exported = floats(read_model(bytes.str()));
  // Each member's part: its float weights, in file order, and the cuts.
  std::vector<std::vector<HostTensor>> params(2);
  std::map<std::string, train::ParamCut> cuts;
  for (int m = 0; m < 2; ++m) {
    auto part = to.tp.partition(0, m, {});
    INFO((part ? std::string() : part.error().str()));
    REQUIRE(part);
    CHECK_FALSE(part->varying.empty());
    cuts = part->cuts;
    const onnx::ModelProto pm = read_model(part->onnx);
    const auto held = floats(pm);
    for (const auto& t : pm.graph().initializer()) {
      if (!held.count(t.name()) || !exported.count(t.name())) continue;  // hp's constants
      const HostTensor& h = held.at(t.name());
      auto c = cuts.find(t.name());
      INFO("member " << m << ": " << t.name());
      if (c == cuts.end() || c->second.partial > 1) {
        CHECK(h.dims == exported.at(t.name()).dims);
      } else {
        CHECK(c->second.shape == exported.at(t.name()).dims);
        REQUIRE(c->second.ranges.size() == 2);
        CHECK(count(c->second.ranges[static_cast<std::size_t>(m)]) == h.numel());
        CHECK(count(c->second.ranges[static_cast<std::size_t>(m)]) * 2 ==
              exported.at(t.name()).numel());
      }
      params[static_cast<std::size_t>(m)].push_back(h);
    }
  }
  // The members' weights gathered (partial ones scaled back) are the export's.
  std::mutex mu;
  std::vector<std::string> differ;
  std::size_t compared = 0;
  auto st = comm::run_in_process(2, [&](int rank, comm::Transport& t) -> Status {
    train::TensorParallel tp = to.tp;
    tp.transport = &t;
    tp.group = to.tp.grid[0];
    auto mine = params[static_cast<std::size_t>(rank)];
    HP_ASSIGN_OR_RETURN(auto sync, train::TensorParallelSync::create(tp, cuts, mine));
    sync->to_trained(mine);
    HP_ASSIGN_OR_RETURN(auto whole, sync->gather(mine));
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& w : whole) {
      ++compared;
      const HostTensor& e = exported.at(w.name);
      if (w.dims != e.dims || w.data != e.data) differ.push_back(w.name);
    }
    return {};
  });
  INFO((st ? std::string() : st.error().str()));
  REQUIRE(st);
  CHECK(differ.empty());
  CHECK(compared == 2 * exported.size());
  return cuts;
}

}  // namespace

TEST_CASE("GPT-2's tp=2 cuts match its partitions and gather back into the export", "[job][tp]") {
  const auto cuts = check_cuts("gpt2-tp2", "tiny-gpt2");
  // q|k|v fused in c_attn's output rows: each member holds a piece of each of the 3 blocks.
  REQUIRE(cuts.count("h.0.c_attn.weight"));
  const auto& qkv = cuts.at("h.0.c_attn.weight");
  CHECK(qkv.view.size() == 3);
  CHECK(qkv.view[0] == 3);
  CHECK(qkv.ranges[0][0] == std::make_pair<std::int64_t, std::int64_t>(0, 3));
  CHECK_FALSE(cuts.count("h.0.ln_1.weight"));
}

TEST_CASE("the MLP's tp=2 cuts: split Gemm weights and partial biases", "[job][tp]") {
  const auto cuts = check_cuts("mlp-tp2", "tiny-mlp");
  // Column-parallel first layer (its output rows split), row-parallel second whose bias every
  // member stores halved, added into the all-reduce.
  REQUIRE(cuts.count("inp.weight"));
  CHECK(cuts.at("inp.weight").ranges[1][0] == std::make_pair<std::int64_t, std::int64_t>(32, 64));
  REQUIRE(cuts.count("layers.0.bias"));
  CHECK(cuts.at("layers.0.bias").partial == 2);
  REQUIRE(cuts.count("out.bias"));
  CHECK(cuts.at("out.bias").partial == 2);
}
