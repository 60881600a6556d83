// The Job (hp/job/job.h): the job kind decided from the recipe alone, the recipe's schedule lowered
// and checked once, the cluster resolved at the recipe's node count, the partitions' manifest
// checked against the recipe, and located errors for recipes that cannot make a job.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "hp/core/fs.h"
#include "hp/job/job.h"
#include "hp/recipe/presets.h"
#include "hp/shard/manifest.h"

using namespace hp::job;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("hp_job_test_" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

const fs::path kRecipes = fs::path(HP_SOURCE_DIR) / "recipes";

std::vector<fs::path> presets() { return {kRecipes / "clusters"}; }

// A recipe with [parallel] dp, tp, pp (required keys) and `more` keys, then `groups`.
hp::recipe::Recipe parsed(int dp, int pp, const std::string& more, const std::string& groups = "") {
  auto doc = hp::recipe::parse_recipe(
      "[recipe]\nversion = 1\nname = \"t\"\nmodel = \"m.onnx\"\ncluster = "
      "\"local-cpu\"\n[parallel]\ndp = " +
          std::to_string(dp) + "\ntp = 1\npp = " + std::to_string(pp) + "\n" + more + groups,
      "t.toml");
  INFO((doc.problems.empty() ? std::string() : doc.problems.front().message));
  REQUIRE(doc.problems.empty());
  return doc.recipe;
}

}  // namespace

TEST_CASE("job: the kind is decided from the recipe alone", "[job]") {
  CHECK(job_kind_of(parsed(2, 1, "")) == JobKind::sharded_model);
  const std::string two =
      "[[groups]]\nname = \"a\"\nranks = \"0\"\nmodule = \"a.onnx\"\n"
      "[[groups]]\nname = \"b\"\nranks = \"1\"\nmodule = \"b.onnx\"\n";
  CHECK(job_kind_of(parsed(2, 1, "", two)) == JobKind::module_groups);
  const std::string flow =
      "[[groups]]\nname = \"a\"\nranks = \"0\"\nmodule = \"a.onnx\"\noutputs = [\"x\"]\n"
      "[[groups]]\nname = \"b\"\nranks = \"1\"\nmodule = \"b.onnx\"\ninputs = [\"x\"]\n";
  CHECK(job_kind_of(parsed(2, 1, "", flow)) == JobKind::flow_groups);
  CHECK(std::string(job_kind_name(JobKind::flow_groups)) == "flow groups");
}

TEST_CASE("job: the recipe's schedule is lowered and checked once", "[job]") {
  auto s = recipe_schedule(parsed(1, 2, "micro_batches = 4\nschedule = \"1f1b\"\n").parallel);
  REQUIRE(s);
  CHECK(s->lowered.kind == ScheduleKind::one_f_one_b);
  CHECK(s->lowered.ranks == 2);
  CHECK(s->lowered.micro_batches == 4);
  CHECK(s->check.ok);
  CHECK(s->check.bubble() == Approx(bubble_fraction(ScheduleKind::one_f_one_b, 2, 4, 1)));
  // SEND/RECV actions were inserted: rank 0 sends every forward to rank 1.
  int sends = 0;
  for (const auto& a : s->lowered.per_rank[0]) sends += a.kind == ActionKind::send_f;
  CHECK(sends == 4);
  // Without a pipeline hp shard does not cut micro-batches: one forward per step.
  auto flat = recipe_schedule(parsed(2, 1, "micro_batches = 4\n").parallel);
  REQUIRE(flat);
  CHECK(flat->lowered.micro_batches == 1);
  REQUIRE(flat->lowered.per_rank.size() == 1);
  CHECK(flat->lowered.per_rank[0].size() == 1);
  auto inter = recipe_schedule(
      parsed(1, 2, "micro_batches = 4\nschedule = \"interleaved\"\nvirtual_stages = 2\n").parallel);
  REQUIRE(inter);
  CHECK(inter->lowered.chunks == 2);
  CHECK(inter->lowered.stages() == 4);
}

TEST_CASE("job: load_job reads a bundled recipe, resolves its cluster and its paths", "[job]") {
  auto job = load_job(kRecipes / "cpu-pp2.toml", presets());
  REQUIRE(job);
  CHECK(job->kind == JobKind::sharded_model);
  CHECK(job->base_dir == fs::absolute(kRecipes).lexically_normal());
  CHECK(job->model_path() == job->base_dir / "models/tiny-gpt2.onnx");
  REQUIRE(job->cluster);
  CHECK(job->cluster->nodes == 2);  // scaled to the recipe's nodes
  CHECK(job->micro_batches() == 2);
  REQUIRE(job->groups().size() == 1);
  CHECK(job->groups()[0].ranks.size() == 2);
  // Without preset directories the cluster is not looked up (workers do not need it).
  auto worker = load_job(kRecipes / "cpu-pp2.toml");
  REQUIRE(worker);
  CHECK_FALSE(worker->cluster);
  // An unknown cluster does not stop the job: the reason is kept for the prediction line.
  TempDir d;
  std::ifstream in(kRecipes / "cpu-pp2.toml");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  text.replace(text.find("\"local-cpu\""), 11, "\"no-such-cluster\"");
  std::ofstream(d.path / "r.toml") << text;
  auto lost = load_job(d.path / "r.toml", presets());
  REQUIRE(lost);
  CHECK_FALSE(lost->cluster);
  CHECK(lost->cluster_problem.find("no-such-cluster") != std::string::npos);
}

TEST_CASE("job: malformed recipes are located errors, every problem at once", "[job]") {
  TempDir d;
  std::ofstream(d.path / "bad.toml")
      << "[recipe]\nversion = 1\nmodel = \"m.onnx\"\n[parallel]\ndp = 0\ntp = -1\n";
  auto job = load_job(d.path / "bad.toml");
  REQUIRE_FALSE(job);
  CHECK(job.error().code == hp::Errc::bad_input);
  CHECK(job.error().all().size() >= 2);
  CHECK(job.error().what.where.find("bad.toml:") != std::string::npos);
  std::ofstream(d.path / "syntax.toml") << "[recipe\nversion = ";
  CHECK(load_job(d.path / "syntax.toml").error().code == hp::Errc::bad_input);
  CHECK(load_job(d.path / "absent.toml").error().code != hp::Errc::internal);
}

TEST_CASE("job: partitions made for another recipe are refused by attach_manifest", "[job]") {
  TempDir d;
  auto job = load_job(kRecipes / "cpu-pp2.toml");
  REQUIRE(job);
  hp::shard::Manifest m;
  m.pp = 2;
  m.micro_batches = 2;
  m.ranks = {{0, 0, "rank0.onnx", 0, 0, 0}, {1, 1, "rank1.onnx", 0, 0, 1}};
  m.stages = {{0, {0, 1}, {0}}, {1, {2, 3}, {1}}};
  REQUIRE(hp::write_file_atomic(d.path / "manifest.toml", hp::shard::format_manifest(m)).ok());
  REQUIRE(attach_manifest(*job, d.path).ok());
  REQUIRE(job->manifest);
  CHECK(job->manifest->pp == 2);
  m.micro_batches = 4;  // cut for another schedule
  REQUIRE(hp::write_file_atomic(d.path / "manifest.toml", hp::shard::format_manifest(m)).ok());
  auto st = attach_manifest(*job, d.path);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().code == hp::Errc::bad_input);
  CHECK(st.error().what.message == "the partitions are for 4 micro-batches; the recipe has 2");
  CHECK(attach_manifest(*job, d.path / "nowhere").error().code != hp::Errc::internal);
}
