// The MPMD launch plan: one app context per group with every -x repeated, oversubscription by core
// count, container defaults, the app file and the srun --multi-prog file, and bad groups.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>

#include "hp/job/launcher.h"
#include "hp/recipe/recipe.h"

using namespace hp::job;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("hp_launcher_test_" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

hp::recipe::Recipe recipe_of(const std::string& groups) {
  std::string text = R"([recipe]
version = 1
name = "t"
model = "m.onnx"
cluster = "local-cpu"
[parallel]
dp = 1
tp = 2
pp = 1
)" + groups;
  auto doc = hp::recipe::parse_recipe(text, "t.toml");
  REQUIRE(doc.problems.empty());
  return doc.recipe;
}

const char* kTwoGroups = R"(
[[groups]]
name = "enc"
ranks = "0-1"
module = "a.onnx"
env = { FOO = "bar" }
[[groups]]
name = "sched"
ranks = "2"
module = "b.onnx"
)";

JobOptions options(const TempDir& d) {
  for (const char* f : {"a.onnx", "b.onnx", "m.onnx"}) std::ofstream(d.path / f) << "x";
  JobOptions o;
  o.recipe = d.path / "t.toml";
  o.worker = "/opt/hp/bin/hp";
  o.run_dir = d.path / "run";
  return o;
}

// The Job hp launch would build from the recipe, as if read from d/t.toml.
Job job_of(const hp::recipe::Recipe& r, const TempDir& d) {
  Job job;
  job.recipe = r;
  job.recipe_path = d.path / "t.toml";
  job.base_dir = d.path;
  job.kind = job_kind_of(r);
  return job;
}

int count(const std::vector<std::string>& v, const std::string& s) {
  return static_cast<int>(std::count(v.begin(), v.end(), s));
}

}  // namespace

TEST_CASE("launcher: one app context per group, -x repeated in each", "[launcher]") {
  TempDir d;
  auto plan = plan_job(job_of(recipe_of(kTwoGroups), d), options(d), HostInfo{8, false});
  REQUIRE(plan);
  REQUIRE(plan->contexts.size() == 2);
  CHECK(plan->total_ranks == 3);
  CHECK(plan->contexts[1].first_rank == 2);
  CHECK(plan->group_of(1) == "enc");
  CHECK(plan->group_of(2) == "sched");
  const auto& a = plan->argv;
  CHECK(a.front() == "mpirun");
  CHECK(count(a, ":") == 1);
  CHECK(count(a, "HP_GROUP_INDEX=0") == 1);
  CHECK(count(a, "HP_GROUP_INDEX=1") == 1);
  CHECK(count(a, "-x") == 9);  // 4 per context + FOO in the first
  CHECK(count(a, "FOO=bar") == 1);
  CHECK(count(a, "--oversubscribe") == 0);  // 3 ranks on 8 cores
  CHECK(count(a, "--bind-to") == 1);
  CHECK(count(a, "--worker") == 2);
  // Each context: -n N, its -x list, then the worker; the second context after the colon.
  auto colon = std::find(a.begin(), a.end(), ":");
  CHECK(*(colon + 1) == "-n");
  CHECK(*(colon + 2) == "1");
  CHECK(std::find(colon, a.end(), "HP_GROUP=sched") != a.end());
  CHECK(std::find(colon, a.end(), "FOO=bar") == a.end());
  // The app file repeats everything per line.
  CHECK(plan->app_file.find("-n 2 -x HP_GROUP=enc -x HP_GROUP_INDEX=0") != std::string::npos);
  CHECK(plan->app_file.find("-n 1 -x HP_GROUP=sched -x HP_GROUP_INDEX=1") != std::string::npos);
  const std::string dry = format_dry_run(*plan);
  CHECK(dry.find("OMPI_MCA_btl_vader_single_copy_mechanism=none") != std::string::npos);
  CHECK(dry.find("# 3 rank(s) in 2 group(s); nothing was started") != std::string::npos);
}

TEST_CASE("launcher: oversubscribe past the core count, hostfile on every app file line",
          "[launcher]") {
  TempDir d;
  auto o = options(d);
  auto plan = plan_job(job_of(recipe_of(kTwoGroups), d), o, HostInfo{2, false});
  REQUIRE(plan);
  CHECK(count(plan->argv, "--oversubscribe") == 1);
  std::ofstream(d.path / "hosts") << "node01 slots=4\n";
  o.hostfile = d.path / "hosts";
  o.timeout_s = 2.5;
  auto cluster = plan_job(job_of(recipe_of(kTwoGroups), d), o, HostInfo{2, false});
  REQUIRE(cluster);
  CHECK(count(cluster->argv, "--oversubscribe") == 0);
  CHECK(count(cluster->argv, "--hostfile") == 1);
  CHECK(count(cluster->argv, "3") >= 1);  // --timeout rounded up
  auto t = std::find(cluster->argv.begin(), cluster->argv.end(), "--timeout");
  REQUIRE(t != cluster->argv.end());
  CHECK(*(t + 1) == "3");
  for (const auto& [k, v] : cluster->launcher_env)
    CHECK(k != "OMPI_MCA_plm");  // isolated is single-host only
  std::size_t lines = 0, pos = 0;
  while ((pos = cluster->app_file.find("--hostfile " + fs::absolute(o.hostfile).string(), pos)) !=
         std::string::npos) {
    ++lines;
    ++pos;
  }
  CHECK(lines == 2);
}

TEST_CASE("launcher: slurm multi-prog lines carry rank ranges and the environment", "[launcher]") {
  TempDir d;
  auto o = options(d);
  o.launcher = "slurm";
  auto plan = plan_job(job_of(recipe_of(kTwoGroups), d), o, HostInfo{8, false});
  REQUIRE(plan);
  CHECK(plan->argv.front() == "srun");
  CHECK(count(plan->argv, "--multi-prog") == 1);
  CHECK(plan->app_file.find("\n0-1 env HP_GROUP=enc HP_GROUP_INDEX=0") != std::string::npos);
  CHECK(plan->app_file.find("\n2 env HP_GROUP=sched HP_GROUP_INDEX=1") != std::string::npos);
}

TEST_CASE("launcher: implicit single group and root notes", "[launcher]") {
  TempDir d;
  auto plan = plan_job(job_of(recipe_of(""), d), options(d), HostInfo{1, true});
  REQUIRE(plan);
  REQUIRE(plan->contexts.size() == 1);
  CHECK(plan->contexts[0].group == "main");
  CHECK(plan->contexts[0].ranks == 2);
  const bool opted_in =
      std::getenv("OMPI_ALLOW_RUN_AS_ROOT") && std::getenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM");
  bool root_note = false;
  for (const auto& n : plan->notes) root_note |= n.find("root") != std::string::npos;
  CHECK(root_note == !opted_in);
  auto o = options(d);
  o.allow_run_as_root = true;
  auto allowed = plan_job(job_of(recipe_of(""), d), o, HostInfo{1, true});
  REQUIRE(allowed);
  CHECK(count(allowed->argv, "--allow-run-as-root") == 1);
}

TEST_CASE("launcher: missing and non-ONNX modules are bad input, all listed", "[launcher]") {
  TempDir d;
  auto o = options(d);
  fs::remove(d.path / "a.onnx");
  auto r = recipe_of(kTwoGroups);
  r.groups[1].module =
      "encoder.py";  // ("scheduler" is the one module that is no ONNX file: group_flow.h)
  auto plan = plan_job(job_of(r, d), o, HostInfo{8, false});
  REQUIRE_FALSE(plan);
  CHECK(plan.error().code == hp::Errc::bad_input);
  auto all = plan.error().all();
  REQUIRE(all.size() == 2);
  CHECK(all[0].message.find("module 'a.onnx' does not exist") != std::string::npos);
  CHECK(all[1].message == "module 'encoder.py' is not an ONNX file");
  o.launcher = "pbs";
  CHECK(plan_job(job_of(recipe_of(kTwoGroups), d), o, HostInfo{8, false}).error().code ==
        hp::Errc::usage);
}

TEST_CASE("launcher: shell quoting for the printed command", "[launcher]") {
  CHECK(shell_quote("/a/b.toml") == "/a/b.toml");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("") == "''");
}

TEST_CASE("launcher: --mpi-args split as a shell would", "[launcher]") {
  using V = std::vector<std::string>;
  CHECK(*split_words("", "x") == V{});
  CHECK(*split_words("  \t ", "x") == V{});
  CHECK(*split_words("--mca btl tcp,self", "x") == V{"--mca", "btl", "tcp,self"});
  CHECK(*split_words("-x 'A=b c'  -x \"B=\\\"q\\\" \\\\\"", "x") ==
        V{"-x", "A=b c", "-x", "B=\"q\" \\"});
  CHECK(*split_words("a\\ b 'it'\\''s' \"\\n\"", "x") == V{"a b", "it's", "\\n"});
  CHECK(*split_words("''", "x") == V{""});  // an empty quoted word is a word
  CHECK(*split_words("pre'fix'\"ed\"", "x") == V{"prefixed"});
  // Malformed: unterminated quotes and a trailing backslash are usage errors naming the option.
  for (const char* bad : {"'open", "a \"open", "\"esc\\\"", "end\\"}) {
    auto w = split_words(bad, "--mpi-args");
    REQUIRE_FALSE(w);
    CHECK(w.error().code == hp::Errc::usage);
    CHECK(w.error().what.message.rfind("--mpi-args: ", 0) == 0);
  }
}

TEST_CASE("launcher: launcher args follow hp's global options, before the contexts", "[launcher]") {
  TempDir d;
  auto o = options(d);
  o.launcher_args = {"--mca", "btl", "tcp,self"};
  auto plan = plan_job(job_of(recipe_of(kTwoGroups), d), o, HostInfo{8, false});
  REQUIRE(plan);
  const auto& a = plan->argv;
  auto mca = std::find(a.begin(), a.end(), "--mca");
  REQUIRE(mca != a.end());
  CHECK(*(mca + 2) == "tcp,self");
  CHECK(mca > std::find(a.begin(), a.end(), "--tag-output"));
  CHECK(mca < std::find(a.begin(), a.end(), "-n"));
  o.launcher = "slurm";
  auto slurm = plan_job(job_of(recipe_of(kTwoGroups), d), o, HostInfo{8, false});
  REQUIRE(slurm);
  const auto& s = slurm->argv;
  CHECK(std::find(s.begin(), s.end(), "--mca") < std::find(s.begin(), s.end(), "--multi-prog"));
}

namespace {

// A stand-in for mpirun: rank 1 prints its hp error (and records its exit code when `recorded`),
// then the launcher itself dies by SIGSEGV, as mpirun may while tearing a failed job down.
JobPlan crashing_launcher(const fs::path& run_dir, bool recorded, bool hang = false) {
  JobPlan p;
  p.total_ranks = 2;
  p.run_dir = run_dir;
  p.app_file_name = "app.txt";
  AppContext c;
  c.argv = {"/bin/sh"};
  p.contexts = {c};
  std::string script = "echo '[7,1]<stderr>:hp: error: in: the requests lack audio' >&2; ";
  if (recorded)
    script += "mkdir -p '" + (run_dir / "exits").string() + "' && echo 3 > '" +
              (run_dir / "exits" / "rank-1.code").string() + "'; ";
  script += hang ? "exec sleep 60"  // a teardown that never ends, the pipes held open
                 : "echo '[7,0]<stderr>:hp: error: interrupted by SIGTERM' >&2; kill -SEGV $$";
  p.argv = {"/bin/sh", "-c", script};
  return p;
}

}  // namespace

TEST_CASE("launcher: the failing rank's recorded exit code outranks mpirun's crash", "[launcher]") {
  TempDir d;
  auto o = options(d);
  o.allow_run_as_root = true;
  std::vector<std::string> lines;
  auto sink = [&](bool, const std::string& l) { lines.push_back(l); };
  // Recorded: the rank's own code (3: bad input) and its message, not the launcher's signal.
  auto r = run_job(crashing_launcher(d.path / "run", true), o, sink);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == hp::Errc::bad_input);
  CHECK(r.error().what.message.find("rank 1 (group") != std::string::npos);
  CHECK(r.error().what.message.find("failed first (exit code 3): in: the requests lack audio") !=
        std::string::npos);
  // A rerun in the same run directory forgets the old record: the signal is all there is.
  auto again = run_job(crashing_launcher(d.path / "run", false), o, sink);
  REQUIRE_FALSE(again);
  CHECK(again.error().code == hp::Errc::runtime);
  CHECK(again.error().what.message.find("failed first (killed by signal 11)") != std::string::npos);
}

TEST_CASE("a failing job whose teardown hangs is ended soon after the first error", "[launcher]") {
  TempDir d;
  auto o = options(d);
  o.allow_run_as_root = true;
  o.timeout_s = 120;
  const auto t0 = std::chrono::steady_clock::now();
  auto r =
      run_job(crashing_launcher(d.path / "run", true, true), o, [](bool, const std::string&) {});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_FALSE(r);
  CHECK(took < 30);  // the first error's grace, not the 120 s timeout
  CHECK(r.error().code == hp::Errc::bad_input);
  CHECK(r.error().what.message.find("failed first (exit code 3)") != std::string::npos);
  CHECK(r.error().what.message.find("timeout") == std::string::npos);
}
