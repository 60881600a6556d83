// Real MPMD jobs through `hp launch RECIPE.toml` (mpirun underneath, 2 ranks, as root in CI
// containers via OMPI_ALLOW_RUN_AS_ROOT*, set by tests/mpi/CMakeLists.txt):
//   - hand-built partitions written here: a TP=2 MLP (column- then row-parallel, hp.AllReduce over
//   a
//     non-ascending group) and a PP=2 pipeline (hp.Send / hp.Recv, 1F1B and GPipe over
//     micro-batches) give the unsharded model's outputs (run by `hp launch MODEL.onnx`) within
//     1e-5;
//   - faults: a crashing rank, a rank hanging past --timeout, a missing plugin on one group's
//   backend:
//     each ends the whole job within seconds with a clear message and the documented exit code, and
//     leaves no rank process behind;
//   - interrupts: SIGTERM to hp stops mpirun and the ranks and exits 5 with the reason (forward and
//     training jobs, whose ranks all record their PIDs); SIGKILL of hp leaves no process of the job
//     alive 10 s later (mpirun's PR_SET_PDEATHSIG).
#include <catch2/catch.hpp>

#include "mpi_test_util.h"

#include <onnx/onnx_pb.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "hp/exec/tensor.h"
#include "hp/plugin/hp_plugin.h"
#include "hp_model.h"

namespace fs = std::filesystem;
using namespace hp::exec;

namespace {

using mpi_test::max_abs_diff;
using mpi_test::no_rank_left;
using mpi_test::Run;
using mpi_test::run_hp;

// This file's temporary directories: hp_mpi_launch_<name>_<pid>.
struct TempDir : mpi_test::TempDir {
  explicit TempDir(const std::string& name) : mpi_test::TempDir("launch", name) {}
};

struct Matrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<float> v;
};

Matrix random_matrix(std::int64_t rows, std::int64_t cols, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  Matrix m{rows, cols, {}};
  for (std::int64_t i = 0; i < rows * cols; ++i) m.v.push_back(d(gen));
  return m;
}

// Columns [c0, c1) or rows [r0, r1) of a matrix; a bias is a 1 x n matrix.
Matrix cols_of(const Matrix& m, std::int64_t c0, std::int64_t c1) {
  Matrix s{m.rows, c1 - c0, {}};
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t j = c0; j < c1; ++j)
      s.v.push_back(m.v[static_cast<std::size_t>(i * m.cols + j)]);
  return s;
}
Matrix rows_of(const Matrix& m, std::int64_t r0, std::int64_t r1) {
  Matrix s{r1 - r0, m.cols, {}};
  s.v.assign(m.v.begin() + r0 * m.cols, m.v.begin() + r1 * m.cols);
  return s;
}

struct Graph {
  onnx::ModelProto m = hp_domain_model();
  onnx::GraphProto* g;
  Graph() {
    g = m.mutable_graph();
    g->set_name("part");
  }
  void io(bool input, const std::string& name, std::vector<std::int64_t> dims) {
    auto* v = input ? g->add_input() : g->add_output();
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    for (auto d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
  }
  void weight(const std::string& name, const Matrix& w, bool vector = false) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    if (!vector) t->add_dims(w.rows);
    t->add_dims(w.cols);
    for (float f : w.v) t->add_float_data(f);
  }
  onnx::NodeProto* node(const std::string& op, std::vector<std::string> in,
                        std::vector<std::string> out, const std::string& domain = "") {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + std::to_string(g->node_size()));
    n->set_domain(domain);
    for (auto& s : in) n->add_input(s);
    for (auto& s : out) n->add_output(s);
    return n;
  }
  static void attr(onnx::NodeProto* n, const std::string& name, std::vector<std::int64_t> v,
                   bool list) {
    auto* a = n->add_attribute();
    a->set_name(name);
    if (list) {
      a->set_type(onnx::AttributeProto::INTS);
      for (auto x : v) a->add_ints(x);
    } else {
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(v.at(0));
    }
  }
  void save(const fs::path& p) { std::ofstream(p, std::ios::binary) << m.SerializeAsString(); }
};

constexpr std::int64_t kBatch = 4, kIn = 8, kHidden = 16, kOut = 6;

struct Mlp {
  Matrix w1 = random_matrix(kIn, kHidden, 1), b1 = random_matrix(1, kHidden, 2),
         w2 = random_matrix(kHidden, kOut, 3), b2 = random_matrix(1, kOut, 4);
};

// y = Relu(x W1 + b1) W2 + b2, unsharded.
void write_full(const Mlp& p, const fs::path& file) {
  Graph g;
  g.io(true, "x", {kBatch, kIn});
  g.io(false, "y", {kBatch, kOut});
  g.weight("W1", p.w1);
  g.weight("b1", p.b1, true);
  g.weight("W2", p.w2);
  g.weight("b2", p.b2, true);
  g.node("MatMul", {"x", "W1"}, {"a"});
  g.node("Add", {"a", "b1"}, {"b"});
  g.node("Relu", {"b"}, {"h"});
  g.node("MatMul", {"h", "W2"}, {"c"});
  g.node("Add", {"c", "b2"}, {"y"});
  g.save(file);
}

// Rank r of TP=2: W1 split by columns, W2 by rows, partial products summed by hp.AllReduce.
void write_tp(const Mlp& p, int r, const fs::path& file) {
  const std::int64_t h0 = r * kHidden / 2, h1 = (r + 1) * kHidden / 2;
  Graph g;
  g.io(true, "x", {kBatch, kIn});
  g.io(false, "y", {kBatch, kOut});
  g.weight("W1", cols_of(p.w1, h0, h1));
  g.weight("b1", cols_of(p.b1, h0, h1), true);
  g.weight("W2", rows_of(p.w2, h0, h1));
  g.weight("b2", p.b2, true);
  g.node("MatMul", {"x", "W1"}, {"a"});
  g.node("Add", {"a", "b1"}, {"b"});
  g.node("Relu", {"b"}, {"h"});
  g.node("MatMul", {"h", "W2"}, {"c"});
  auto* ar = g.node("AllReduce", {"c"}, {"s"}, "hp");
  Graph::attr(ar, "group", {1, 0}, true);
  auto* op = ar->add_attribute();
  op->set_name("op");
  op->set_type(onnx::AttributeProto::STRING);
  op->set_s("sum");
  g.node("Add", {"s", "b2"}, {"y"});
  g.save(file);
}

// PP=2 over micro-batches of `mb_rows` rows: stage 0 computes h and sends it, stage 1 receives it.
void write_pp(const Mlp& p, int stage, std::int64_t mb_rows, const fs::path& file) {
  Graph g;
  if (stage == 0) {
    g.io(true, "x", {mb_rows, kIn});
    g.weight("W1", p.w1);
    g.weight("b1", p.b1, true);
    g.node("MatMul", {"x", "W1"}, {"a"});
    g.node("Add", {"a", "b1"}, {"b"});
    g.node("Relu", {"b"}, {"h"});
    g.io(false, "h",
         {mb_rows, kHidden});  // ONNX graphs need an output; the job's output is y (recipe)
    auto* s = g.node("Send", {"h"}, {}, "hp");
    Graph::attr(s, "peer", {1}, false);
    Graph::attr(s, "tag", {0}, false);
  } else {
    g.io(false, "y", {mb_rows, kOut});
    g.weight("W2", p.w2);
    g.weight("b2", p.b2, true);
    auto* r = g.node("Recv", {}, {"h"}, "hp");
    Graph::attr(r, "peer", {0}, false);
    Graph::attr(r, "tag", {0}, false);
    Graph::attr(r, "dtype", {onnx::TensorProto::FLOAT}, false);
    Graph::attr(r, "shape", {mb_rows, kHidden}, true);
    g.node("MatMul", {"h", "W2"}, {"c"});
    g.node("Add", {"c", "b2"}, {"y"});
  }
  g.save(file);
}

void write_input(const fs::path& dir) {
  fs::create_directories(dir);
  Matrix x = random_matrix(kBatch, kIn, 7);
  HostTensor t;
  t.name = "x";
  t.dtype = HP_F32;
  t.dims = {kBatch, kIn};
  t.data.resize(x.v.size() * 4);
  std::memcpy(t.data.data(), x.v.data(), t.data.size());
  REQUIRE(write_tensor_file(dir / "input_0.pb", t).ok());
}

// A recipe with two one-rank groups running `m0` and `m1`, both declaring the job output y (the
// launcher gathers it from the first group that has it); `parallel` goes into [parallel], `env1`
// and `backend1` into the second group.
void write_recipe(const fs::path& file, const std::string& parallel, const std::string& m0,
                  const std::string& m1, const std::string& env1 = "",
                  const std::string& backend1 = "") {
  std::ofstream f(file);
  f << "[recipe]\nversion = 1\nname = \"t\"\nmodel = \"full.onnx\"\ncluster = "
       "\"local-cpu\"\nnodes = 2\n\n[parallel]\n"
    << parallel << "\n\n[[groups]]\nname = \"g0\"\nranks = \"0\"\nmodule = \"" << m0
    << "\"\nbackend = \"cpu\"\noutputs = [\"y\"]\n"
    << "\n[[groups]]\nname = \"g1\"\nranks = \"1\"\nmodule = \"" << m1 << "\"\nbackend = \""
    << (backend1.empty() ? "cpu" : backend1) << "\"\noutputs = [\"y\"]\n";
  if (!env1.empty()) f << "env = { " << env1 << " }\n";
}

struct Fixture {
  TempDir d;
  Mlp p;
  explicit Fixture(const std::string& name) : d(name) {
    write_full(p, d.path / "full.onnx");
    write_input(d.path / "in");
    Run ref = run_hp("launch " + (d.path / "full.onnx").string() + " --inputs " +
                     (d.path / "in").string() + " --outputs " + (d.path / "ref").string());
    INFO(ref.out);
    REQUIRE(ref.rc == 0);
  }
  std::string launch(const std::string& recipe, const std::string& extra = "") {
    return "launch " + (d.path / recipe).string() + " --inputs " + (d.path / "in").string() +
           " --outputs " + (d.path / "out").string() + " --run-dir " + (d.path / "run").string() +
           " --threads 1 " + extra;
  }
};

}  // namespace

TEST_CASE("mpi launch: a TP=2 MLP equals the unsharded model", "[mpi]") {
  Fixture f("tp");
  write_tp(f.p, 0, f.d.path / "tp0.onnx");
  write_tp(f.p, 1, f.d.path / "tp1.onnx");
  write_recipe(f.d.path / "tp.toml", "dp = 1\ntp = 2\npp = 1", "tp0.onnx", "tp1.onnx");
  Run r = run_hp(f.launch("tp.toml", "--timeout 60"));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("[g0:0] rank 0 of 2 (group 'g0'): 1 forward(s)") != std::string::npos);
  CHECK(r.out.find("[g1:1] rank 1 of 2 (group 'g1')") != std::string::npos);
  // Each rank says where its time went; a TP rank's AllReduce is among its op types.
  CHECK(r.out.find("last forward's costliest ops: ") != std::string::npos);
  CHECK(r.out.find("hp.AllReduce ") != std::string::npos);
  CHECK(fs::exists(f.d.path / "run" / "logs" / "rank-1.log"));
  CHECK(max_abs_diff(f.d.path / "out" / "output_0.pb", f.d.path / "ref" / "output_0.pb") <= 1e-5);
}

TEST_CASE("mpi launch: a PP=2 pipeline over micro-batches equals the unsharded model", "[mpi]") {
  Fixture f("pp");
  for (auto [schedule, m] : std::vector<std::pair<std::string, int>>{{"1f1b", 2}, {"gpipe", 4}}) {
    const std::int64_t rows = kBatch / m;
    write_pp(f.p, 0, rows, f.d.path / "s0.onnx");
    write_pp(f.p, 1, rows, f.d.path / "s1.onnx");
    write_recipe(f.d.path / "pp.toml",
                 "dp = 1\ntp = 1\npp = 2\nmicro_batches = " + std::to_string(m) +
                     "\nschedule = \"" + schedule + "\"",
                 "s0.onnx", "s1.onnx");
    fs::remove_all(f.d.path / "run");
    Run r = run_hp(f.launch("pp.toml", "--timeout 60"));
    INFO(schedule << "\n" << r.out);
    REQUIRE(r.rc == 0);
    CHECK(r.out.find("[g1:1] rank 1 of 2 (group 'g1'): " + std::to_string(m) + " forward(s)") !=
          std::string::npos);
    CHECK(max_abs_diff(f.d.path / "out" / "output_0.pb", f.d.path / "ref" / "output_0.pb") <= 1e-5);
  }
}

TEST_CASE("mpi launch: a crashing rank ends the job with the runtime code and names the rank",
          "[mpi][fault]") {
  Fixture f("crash");
  write_tp(f.p, 0, f.d.path / "tp0.onnx");
  write_tp(f.p, 1, f.d.path / "tp1.onnx");
  // Under AddressSanitizer the SEGV would be caught and turned into exit 1; let the rank really
  // die.
  write_recipe(f.d.path / "tp.toml", "dp = 1\ntp = 2\npp = 1", "tp0.onnx", "tp1.onnx",
               "HP_TEST_FAULT = \"segv\", ASAN_OPTIONS = \"handle_segv=0:detect_leaks=0\"");
  Run r = run_hp(f.launch("tp.toml", "--timeout 60"));
  INFO(r.out);
  CHECK(r.rc == 5);
  CHECK(r.out.find("hp: error: ") != std::string::npos);
  CHECK(r.out.find("rank 1 (group 'g1') failed first (killed by signal 11)") != std::string::npos);
  CHECK(r.seconds < 30);
  CHECK(no_rank_left(f.d.path / "run"));
}

TEST_CASE("mpi launch: a rank hanging past --timeout is stopped, nothing left behind",
          "[mpi][fault]") {
  Fixture f("hang");
  write_tp(f.p, 0, f.d.path / "tp0.onnx");
  write_tp(f.p, 1, f.d.path / "tp1.onnx");
  write_recipe(f.d.path / "tp.toml", "dp = 1\ntp = 2\npp = 1", "tp0.onnx", "tp1.onnx",
               "HP_TEST_FAULT = \"hang\"");
  Run r = run_hp(f.launch("tp.toml", "--timeout 3"));
  INFO(r.out);
  CHECK(r.rc == 5);
  CHECK(r.out.find("the job ran past --timeout 3 s and was stopped") != std::string::npos);
  CHECK(r.seconds < 3 + 20);
  CHECK(no_rank_left(f.d.path / "run"));
}

TEST_CASE("mpi launch: a missing plugin on one group's backend stops the job as unavailable",
          "[mpi][fault]") {
  Fixture f("plugin");
  write_tp(f.p, 0, f.d.path / "tp0.onnx");
  write_tp(f.p, 1, f.d.path / "tp1.onnx");
  write_recipe(f.d.path / "tp.toml", "dp = 1\ntp = 2\npp = 1", "tp0.onnx", "tp1.onnx", "",
               "nosuch");
  Run r = run_hp(f.launch("tp.toml", "--timeout 60"));
  INFO(r.out);
  CHECK(r.rc == 7);
  CHECK(r.out.find("rank 1 (group 'g1') failed first (exit code 7): group 'g1': backend 'nosuch' "
                   "was not found") != std::string::npos);
  CHECK(r.out.find("last lines of") != std::string::npos);
  CHECK(r.seconds < 30);
  CHECK(no_rank_left(f.d.path / "run"));
}

namespace {

// Starts `hp ARGS` in the background with its output in `log`; returns hp's PID (the shell execs
// it).
pid_t start_hp(const std::string& args, const fs::path& log) {
  const std::string cmd =
      "exec " + std::string(HP_EXE) + " " + args + " >" + log.string() + " 2>&1 </dev/null";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// The live (not zombie) processes whose command line names `run`: mpirun (its app file lives
// there) and every rank (--run-dir).
std::vector<long> job_processes(const fs::path& run) {
  std::vector<long> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd(e.path() / "cmdline", std::ios::binary);
    std::string c((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (c.find(run.string()) == std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string s;
    std::getline(stat, s);
    const auto close = s.rfind(')');
    if (close != std::string::npos && s.substr(close + 2, 1) == "Z") continue;
    found.push_back(std::stol(name));
  }
  return found;
}

// Waits up to `seconds` for `pred`.
template <class F>
bool wait_for(double seconds, F pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    ::usleep(50 * 1000);
  }
  return pred();
}

// A TP=2 job whose ranks hang, started in the background; returns hp's PID once both ranks run.
pid_t start_hanging_job(Fixture& f, const fs::path& log) {
  write_tp(f.p, 0, f.d.path / "tp0.onnx");
  write_tp(f.p, 1, f.d.path / "tp1.onnx");
  write_recipe(f.d.path / "tp.toml", "dp = 1\ntp = 2\npp = 1", "tp0.onnx", "tp1.onnx",
               "HP_TEST_FAULT = \"hang\"");
  const pid_t pid = start_hp(f.launch("tp.toml", "--timeout 300"), log);
  const bool started = wait_for(60, [&] {
    std::error_code ec;
    int n = 0;
    for (const auto& e : fs::directory_iterator(f.d.path / "run" / "pids", ec)) n += e.exists();
    return n == 2 && job_processes(f.d.path / "run").size() >= 3;
  });
  REQUIRE(started);
  return pid;
}

// SIGTERM to hp (`pid`, output in `log`) running a two-rank job in `run`: hp exits 5 within 15 s
// saying it stopped both ranks and mpirun, and no process of the job is left 10 s later.
void sigterm_stops_two_ranks(pid_t pid, const fs::path& log, const fs::path& run) {
  ::kill(pid, SIGTERM);
  int st = 0;
  const bool exited = wait_for(15, [&] { return ::waitpid(pid, &st, WNOHANG) == pid; });
  if (!exited) ::kill(pid, SIGKILL);
  std::ifstream in(log);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(out);
  REQUIRE(exited);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 5);
  CHECK(out.find("hp: error: ") != std::string::npos);
  CHECK(out.find("interrupted by SIGTERM; stopped 2 ranks of 2 and mpirun") != std::string::npos);
  CHECK(wait_for(10, [&] { return job_processes(run).empty(); }));
}

}  // namespace

TEST_CASE("mpi launch: SIGTERM to hp stops mpirun and every rank, exit 5 with the reason",
          "[mpi][fault]") {
  Fixture f("sigterm");
  const fs::path log = f.d.path / "hp.log";
  sigterm_stops_two_ranks(start_hanging_job(f, log), log, f.d.path / "run");
}

TEST_CASE("mpi launch: SIGKILL of hp leaves no process of the job alive 10 s later",
          "[mpi][fault]") {
  Fixture f("sigkill");
  const pid_t pid = start_hanging_job(f, f.d.path / "hp.log");
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  CHECK(wait_for(10, [&] { return job_processes(f.d.path / "run").empty(); }));
}

TEST_CASE("mpi launch: SIGTERM to a training job stops its ranks and counts them", "[mpi][fault]") {
  // Training ranks record their PIDs as forward ranks do, so the interrupt names and stops them.
  TempDir d("sigterm_train");
  {
    std::ofstream r(d.path / "train.toml");
    r << "[recipe]\nversion = 1\nname = \"train\"\nmodel = \"" << HP_BUNDLED_MODEL
      << "\"\ncluster = \"local-cpu\"\nnodes = 2\n[model]\ndims = { batch = 2, seq = 8 }\n"
         "[parallel]\ndp = 2\ntp = 1\npp = 1\n[train]\nsteps = 1000000\n";
    std::ofstream tokens(d.path / "tokens.bin", std::ios::binary);
    tokens << std::string(4000, '\0');
  }
  const fs::path run = d.path / "run", log = d.path / "hp.log";
  const pid_t pid = start_hp("launch " + (d.path / "train.toml").string() + " --data " +
                                 (d.path / "tokens.bin").string() +
                                 " --token-bytes 2 --threads 1 --run-dir " + run.string(),
                             log);
  const bool started = wait_for(60, [&] {
    std::error_code ec;
    int n = 0;
    for (const auto& e : fs::directory_iterator(run / "pids", ec)) n += e.exists();
    return n == 2;
  });
  if (!started) ::kill(pid, SIGKILL);
  REQUIRE(started);
  sigterm_stops_two_ranks(pid, log, run);
}
