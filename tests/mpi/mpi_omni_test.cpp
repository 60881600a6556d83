// The omni-modal example end to end: `hp launch recipes/omni-modal.toml` starts 7 real MPI ranks in
// 5 groups (text x2, image x2, audio, fusion, scheduler), the tensors flow between the groups, and
// the scheduler's collected logits equal PyTorch's (recipes/omni-modal/expected, written by
// gen_omni_modal.py) within 1e-4. Faults: a group whose module lacks an input its flow names is
// refused before any rank starts (bad input, exit 3, the recipe line named); requests lacking a
// tensor the scheduler sends stop the whole running job with exit 3 and leave no rank behind.
#include <catch2/catch.hpp>

#include "mpi_test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "hp/exec/tensor.h"

namespace fs = std::filesystem;
using namespace hp::exec;

namespace {

using mpi_test::no_rank_left;
using mpi_test::Run;
using mpi_test::run_hp;

// This file's temporary directories: hp_mpi_omni_<name>_<pid>.
struct TempDir : mpi_test::TempDir {
  explicit TempDir(const std::string& name) : mpi_test::TempDir("omni", name) {}
};

const fs::path kSource = HP_SOURCE_DIR;
const fs::path kRecipe = kSource / "recipes" / "omni-modal.toml";
const fs::path kRequests = kSource / "recipes" / "omni-modal" / "requests";

// The bundled recipe's text with `from` replaced by `to` (modules made absolute), written to
// `file`.
void write_variant(const fs::path& file, const std::string& from, const std::string& to) {
  std::ifstream in(kRecipe);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (std::size_t at = 0; (at = text.find("\"omni-modal/", at)) != std::string::npos;)
    text.replace(at, 12, "\"" + (kSource / "recipes" / "omni-modal").string() + "/");
  if (!from.empty()) {
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
  }
  std::ofstream(file) << text;
}

}  // namespace

TEST_CASE("mpi omni-modal: 7 ranks in 5 groups give PyTorch's logits", "[mpi][omni]") {
  TempDir d("run");
  Run r = run_hp("launch " + kRecipe.string() + " --inputs " + kRequests.string() + " --outputs " +
                 (d.path / "out").string() + " --run-dir " + (d.path / "run").string() +
                 " --threads 1 --timeout 120");
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("job of 7 rank(s) in 5 group(s)") != std::string::npos);
  CHECK(r.out.find("[text:1] rank 1 of 7 (group 'text'): 1 forward(s)") != std::string::npos);
  CHECK(r.out.find("[audio:4] rank 4 of 7 (group 'audio'): 1 forward(s)") != std::string::npos);
  CHECK(r.out.find("[scheduler:6] rank 6 of 7 (group 'scheduler'): 0 forward(s)") !=
        std::string::npos);
  auto got = read_tensor_file(d.path / "out" / "output_0.pb");
  auto want = read_tensor_file(kSource / "recipes" / "omni-modal" / "expected" / "output_0.pb");
  REQUIRE(got.ok());
  REQUIRE(want.ok());
  CHECK(got->name == "logits");
  REQUIRE(got->dims == want->dims);
  REQUIRE(got->dims == std::vector<std::int64_t>{4, 10});
  double diff = 0;
  for (std::int64_t i = 0; i < want->numel(); ++i)
    diff = std::max(diff, std::fabs(double(got->as<float>()[i]) - want->as<float>()[i]));
  CHECK(diff <= 1e-4);
  CHECK_FALSE(fs::exists(d.path / "out" / "output_1.pb"));
}

TEST_CASE("mpi omni-modal: --dry-run shows one app context per group", "[mpi][omni]") {
  TempDir d("dry");
  Run r =
      run_hp("launch " + kRecipe.string() + " --dry-run --run-dir " + (d.path / "run").string());
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("# 7 rank(s) in 5 group(s); nothing was started") != std::string::npos);
  CHECK(r.out.find("#   group 'scheduler': ranks 6") != std::string::npos);
  CHECK(r.out.find("HP_GROUP=fusion") != std::string::npos);
}

TEST_CASE("mpi omni-modal: a module missing an input its flow needs is refused before launch",
          "[mpi][omni][fault]") {
  TempDir d("missing");
  // The fusion group runs the audio encoder, which has no text_emb / image_emb / audio_emb inputs.
  write_variant(d.path / "omni.toml", "omni-modal/fusion.onnx", "omni-modal/audio.onnx");
  Run r = run_hp("launch " + (d.path / "omni.toml").string() + " --inputs " + kRequests.string() +
                 " --outputs " + (d.path / "out").string() + " --run-dir " +
                 (d.path / "run").string() + " --timeout 60");
  INFO(r.out);
  CHECK(r.rc == 3);
  CHECK(r.out.find("omni.toml:") != std::string::npos);
  CHECK(r.out.find("group 'fusion' lists input 'text_emb' but its module") != std::string::npos);
  CHECK(r.out.find("has no graph input of that name (it has: audio)") != std::string::npos);
  CHECK_FALSE(fs::exists(d.path / "run" / "logs"));
  CHECK_FALSE(fs::exists(d.path / "out"));
}

TEST_CASE("mpi omni-modal: requests lacking a tensor stop the whole job", "[mpi][omni][fault]") {
  TempDir d("requests");
  fs::create_directories(d.path / "in");
  fs::copy_file(kRequests / "input_0.pb", d.path / "in" / "input_0.pb");  // tokens
  fs::copy_file(kRequests / "input_1.pb", d.path / "in" / "input_1.pb");  // image; no audio
  Run r = run_hp("launch " + kRecipe.string() + " --inputs " + (d.path / "in").string() +
                 " --outputs " + (d.path / "out").string() + " --run-dir " +
                 (d.path / "run").string() + " --threads 1 --timeout 60");
  INFO(r.out);
  CHECK(r.rc == 3);
  CHECK(r.out.find("rank 6 (group 'scheduler') failed first") != std::string::npos);
  CHECK(r.out.find("the scheduler sends 'audio' but the requests have no tensor of that name") !=
        std::string::npos);
  CHECK(r.seconds < 60);
  CHECK(no_rank_left(d.path / "run"));
  CHECK_FALSE(fs::exists(d.path / "out"));
}
