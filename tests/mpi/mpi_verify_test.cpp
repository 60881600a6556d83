// `hp verify RECIPE.toml` and `hp launch RECIPE.toml` on sharded models, end to end through the hp
// executable and real Open MPI jobs (2-8 ranks on this machine):
//   - the GPT-2-style, Llama-style (GQA), MoE, ViT and MLP test models with TP=2, PP=2, DP=2 and
//   their
//     combinations: the sharded job's outputs equal the unsharded model's within 1e-4 (abs) / 1e-5;
//   - 1F1B, GPipe and interleaved (two model chunks per rank) over several micro-batches;
//   - a corrupted shard (one weight element of one rank changed) fails with the mismatch code (6),
//     over MPI and with --simulate;
//   - hp launch --outputs gives the PyTorch reference outputs of the model
//   (tests/data/models/*.io);
//   - the recipe's [offload] schedule under a device budget the cpu plugin enforces gives the same
//     outputs; with nothing allowed to move, the budget is refused (exit 4).
#include <catch2/catch.hpp>

#include "mpi_test_util.h"

#include <onnx/onnx_pb.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "hp/exec/tensor.h"

namespace fs = std::filesystem;

namespace {

using mpi_test::max_abs_diff;
using mpi_test::Run;
using mpi_test::run_hp;

// This file's temporary directories: hp_mpi_verify_<name>_<pid>.
struct TempDir : mpi_test::TempDir {
  explicit TempDir(const std::string& name) : mpi_test::TempDir("verify", name) {}
};

const std::string kData = std::string(HP_SOURCE_DIR) + "/tests/data";

std::string recipe(const std::string& name) { return kData + "/recipes/shard/" + name + ".toml"; }

// A copy of a test recipe in `dir` with the model path made absolute and `edits` (key line -> new
// line) applied.
fs::path recipe_copy(const fs::path& dir, const std::string& name,
                     const std::vector<std::pair<std::string, std::string>>& edits) {
  std::ifstream in(recipe(name));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const std::string rel = "model = \"../../models/";
  text.replace(text.find(rel), rel.size(), "model = \"" + kData + "/models/");
  for (const auto& [from, to] : edits) {
    auto at = text.find(from);
    if (at == std::string::npos)
      text += "\n" + to + "\n";  // a [parallel] key: it is the last table
    else
      text.replace(at, from.size(), to);
  }
  fs::path p = dir / (name + ".toml");
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST_CASE("sharded jobs over MPI give the unsharded outputs", "[mpi][verify]") {
  for (const char* name : {"mlp-tp2", "gpt2-dp2-tp2-pp2", "llama-dp2-tp2-pp2", "moe-dp2-tp2-pp2",
                           "vit-dp2-tp2", "gpt2-dp2-pp2-mb2", "llama-tp4"}) {
    Run r = run_hp("verify " + recipe(name) + " --timeout 120 --atol 1e-5 --rtol 1e-4");
    INFO(name << ":\n" << r.out);
    CHECK(r.rc == 0);
    CHECK(r.out.find("mpirun, ") != std::string::npos);
    CHECK(r.out.find(": ok") != std::string::npos);
    CHECK(r.out.find("MISMATCH") == std::string::npos);
  }
}

TEST_CASE("GPipe, 1F1B and interleaved (2 chunks per rank) over four micro-batches",
          "[mpi][verify]") {
  TempDir d("schedules");
  for (const char* sched : {"gpipe", "1f1b", "interleaved"}) {
    const std::string name = std::string(sched) == "interleaved"
                                 ? "schedule = \"interleaved\"\nvirtual_stages = 2"
                                 : std::string("schedule = \"") + sched + "\"";
    auto p = recipe_copy(d.path, "gpt2-dp2-pp2-mb2",
                         {{"dims = { batch = 4, seq = 12 }", "dims = { batch = 8, seq = 12 }"},
                          {"micro_batches = 2", "micro_batches = 4"},
                          {"schedule = \"1f1b\"", name}});
    Run r = run_hp("verify " + p.string() + " --timeout 120");
    INFO(sched << ":\n" << r.out);
    CHECK(r.rc == 0);
    CHECK(r.out.find(std::string(sched) + ", p=2, m=4") != std::string::npos);
    CHECK(r.out.find("pipeline bubble measured") != std::string::npos);
    CHECK(r.out.find("MISMATCH") == std::string::npos);
  }
  // Interleaved with tensor and data parallelism: 8 ranks, each holding 2 model chunks.
  auto p = recipe_copy(
      d.path, "gpt2-dp2-tp2-pp2",
      {{"dims = { batch = 2, seq = 12 }", "dims = { batch = 4, seq = 12 }"},
       {"pp = 2", "pp = 2\nmicro_batches = 2\nschedule = \"interleaved\"\nvirtual_stages = 2"}});
  Run r = run_hp("verify " + p.string() + " --timeout 120");
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK(r.out.find("interleaved, p=2, m=2, v=2") != std::string::npos);
}

TEST_CASE("a corrupted shard makes hp verify fail with the mismatch code", "[mpi][verify]") {
  TempDir d("corrupt");
  const fs::path parts = d.path / "parts";
  Run s = run_hp("shard " + recipe("mlp-tp2") + " -o " + parts.string());
  REQUIRE(s.rc == 0);
  // Intact partitions verify.
  Run ok =
      run_hp("verify " + recipe("mlp-tp2") + " --shard-dir " + parts.string() + " --timeout 60");
  INFO(ok.out);
  CHECK(ok.rc == 0);

  // One element of rank 1's first float weight changed by 0.5.
  onnx::ModelProto m;
  {
    std::ifstream in(parts / "rank1.onnx", std::ios::binary);
    REQUIRE(m.ParseFromIstream(&in));
  }
  bool changed = false;
  for (auto& t : *m.mutable_graph()->mutable_initializer()) {
    if (t.data_type() != onnx::TensorProto::FLOAT || t.raw_data().size() < 4) continue;
    std::string raw = t.raw_data();
    float v;
    std::memcpy(&v, raw.data(), 4);
    v += 0.5f;
    std::memcpy(raw.data(), &v, 4);
    t.set_raw_data(raw);
    changed = true;
    break;
  }
  REQUIRE(changed);
  {
    std::ofstream out(parts / "rank1.onnx", std::ios::binary | std::ios::trunc);
    REQUIRE(m.SerializeToOstream(&out));
  }
  for (const char* mode : {"", " --simulate"}) {
    Run r = run_hp("verify " + recipe("mlp-tp2") + " --shard-dir " + parts.string() +
                   " --timeout 60" + mode);
    INFO(mode << ":\n" << r.out);
    CHECK(r.rc == 6);
    CHECK(r.out.find("MISMATCH") != std::string::npos);
    CHECK(r.out.find("hp: error:") != std::string::npos);
  }
}

TEST_CASE("hp launch of a sharded recipe writes the model's reference outputs", "[mpi][launch]") {
  TempDir d("launch");
  Run r = run_hp("launch " + recipe("gpt2-dp2-tp2-pp2") + " --inputs " + kData +
                 "/models/tiny-gpt2.io/test_data_set_0 --outputs " + (d.path / "out").string() +
                 " --run-dir " + (d.path / "run").string() + " --timeout 120");
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("[main:7]") != std::string::npos);
  CHECK(r.out.find("pipeline bubble measured") != std::string::npos);
  CHECK(r.out.find("plan's prediction: 0.") !=
        std::string::npos);  // a number of seconds, not "none (...)"
  // 8 ranks: on a machine with fewer cores they share them, and the report says so.
  const bool shared = std::thread::hardware_concurrency() < 8;
  CHECK((r.out.find("8 ranks share") != std::string::npos) == shared);
  CHECK(max_abs_diff(d.path / "out" / "output_0.pb",
                     kData + "/models/tiny-gpt2.io/test_data_set_0/output_0.pb") < 1e-4);
  // Wrongly shaped inputs are refused before any rank starts.
  Run bad = run_hp("launch " + recipe("gpt2-dp2-pp2-mb2") + " --inputs " + kData +
                   "/models/tiny-gpt2.io/test_data_set_0 --run-dir " + (d.path / "run2").string());
  INFO(bad.out);
  CHECK(bad.rc == 3);
  CHECK(bad.out.find("2 micro-batches of [2,12]") != std::string::npos);
  CHECK(!fs::exists(d.path / "run2" / "logs"));
}

TEST_CASE(
    "offload under an enforced device budget gives the same outputs; without it the budget is "
    "refused",
    "[mpi][launch][offload]") {
  TempDir d("offload");
  const std::string io = kData + "/models/tiny-gpt2.io/test_data_set_0";
  auto write = [&](const std::string& name, const std::string& targets) {
    auto p = recipe_copy(d.path, "gpt2-tp2", {});
    fs::path q = d.path / (name + ".toml");
    fs::rename(p, q);
    std::ofstream(q, std::ios::app)
        << "\n[offload]\nenabled = true\ntargets = [" << targets << "]\ndevice_budget = 60000\n";
    return q;
  };
  // Weights in the host pool, fetched ahead of use: each rank's device memory stays under 60000
  // bytes (the cpu plugin refuses any allocation past it), and the outputs are PyTorch's.
  auto off = write("off", "\"parameters\"");
  Run r = run_hp("launch " + off.string() + " --inputs " + io + " --outputs " +
                 (d.path / "out").string() + " --run-dir " + (d.path / "run").string() +
                 " --timeout 120");
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("offload: ") != std::string::npos);
  CHECK(r.out.find(" fetches") != std::string::npos);
  CHECK(max_abs_diff(d.path / "out" / "output_0.pb", io + "/output_0.pb") < 1e-4);
  // Nothing may move: the same budget cannot hold the weights. The job ends with "infeasible" (4)
  // when the offload planner sees it first, or with the cpu plugin's refusal (5) when an allocation
  // does.
  auto none = write("none", "");
  Run bad = run_hp("launch " + none.string() + " --inputs " + io + " --run-dir " +
                   (d.path / "run2").string() + " --timeout 120");
  INFO(bad.out);
  CHECK((bad.rc == 4 || bad.rc == 5));
  CHECK(bad.out.find("device budget") != std::string::npos);
}
