// The training run a recipe with [train] asks for (hp/job/train_run.h): how the recipe and the
// command line become hp::train::TrainOptions, and what is refused before anything is loaded.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>

#include "hp/core/fs.h"
#include "hp/job/train_run.h"

using namespace hp::job;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("hp_train_run_test_" + std::to_string(::getpid()));
    fs::create_directories(path / "sub");
    REQUIRE(hp::write_file_atomic(path / "sub" / "m.onnx", "not read by train_options"));
    REQUIRE(hp::write_file_atomic(path / "tokens.bin", std::string(64, '\0')));
  }
  ~TempDir() { fs::remove_all(path); }
};

// A one-rank recipe (unless `parallel` says otherwise) of sub/m.onnx with two stages' worth of
// recompute choices and the given [train] and extra tables.
Job job_of(const TempDir& d, const std::string& train, const std::string& more = "",
           const std::string& parallel = "dp = 1\ntp = 1\npp = 1\n") {
  const fs::path p = d.path / "r.toml";
  REQUIRE(hp::write_file_atomic(p,
                                "[recipe]\nversion = 1\nname = \"t\"\nmodel = \"sub/m.onnx\"\n"
                                "cluster = \"local-cpu\"\n" +
                                    more + "[parallel]\n" + parallel +
                                    "[[stages]]\nindex = 0\nlayers = \"0-5\"\n"
                                    "recompute = \"selective\"\n"
                                    "recompute_layers = { none = \"1-2\", full = \"5\" }\n"
                                    "[train]\n" +
                                    train));
  auto job = load_job(p, {});
  if (!job) FAIL(job.error().str());
  return std::move(*job);
}

}  // namespace

TEST_CASE("train_run: the recipe's [train], stages and workload make the options", "[job]") {
  TempDir d;
  Job job = job_of(d,
                   "loss = \"mse\"\nlogits = \"y\"\nlabels = \"t\"\nfrozen = [\"rope*\"]\n"
                   "optimizer = \"sgd\"\nlr = 0.5\nmomentum = 0.8\nweight_decay = 0.0\n"
                   "clip_norm = 2.0\nlr_schedule = \"cosine\"\nwarmup_steps = 4\nmin_lr = 0.01\n"
                   "steps = 30\nseed = 9\nbetas = [0.8, 0.9]\neps = 1e-6\n",
                   "[model]\ndims = { batch = 99, seq = 99 }\n"
                   "[workload]\nglobal_batch = 1\nseq = 16\n");
  LaunchOptions o;
  o.target = job.recipe_path;
  o.data = d.path / "tokens.bin";
  o.threads = 3;
  o.plugin_paths = {"/p"};
  auto t = train_options(job, o);
  if (!t) FAIL(t.error().str());
  CHECK(t->model == d.path / "sub" / "m.onnx");  // relative to the recipe
  CHECK(t->grad.loss == hp::train::LossKind::mse);
  CHECK(t->grad.logits == "y");
  CHECK(t->grad.labels == "t");
  CHECK(t->grad.frozen == std::vector<std::string>{"rope*"});
  // Layers 0-5 are selective except 1-2 (none) and 5 (full): every one but 1 and 2 recomputes.
  CHECK(t->grad.recompute_blocks == std::vector<std::int64_t>{0, 3, 4, 5});
  CHECK(t->steps == 30);
  CHECK(t->seed == 9);
  const auto& c = t->optimizer;
  CHECK(c.kind == hp::train::OptimizerKind::sgd);
  CHECK(c.lr == 0.5);
  CHECK(c.momentum == 0.8);
  CHECK(c.weight_decay == 0.0);
  CHECK(c.clip_norm == 2.0);
  CHECK(c.schedule == hp::train::LrSchedule::cosine);
  CHECK(c.warmup_steps == 4);
  CHECK(c.total_steps == 30);
  CHECK(c.min_lr == 0.01);
  CHECK(c.beta1 == 0.8);
  CHECK(c.beta2 == 0.9);
  CHECK(c.eps == 1e-6);
  // The workload's batch and seq win over the dims.
  CHECK(t->batch == 1);
  CHECK(t->seq == 16);
  CHECK(t->data_file == d.path / "tokens.bin");
  CHECK(t->inputs_dir.empty());
  CHECK(t->token_bytes == 2);
  CHECK(t->threads == 3);
  CHECK(t->plugin_paths == std::vector<std::string>{"/p"});
  CHECK(t->log_every == 1);

  SECTION("the command line overrides steps and seed; the schedule keeps the recipe's length") {
    o.steps = 7;
    o.seed = 0;
    o.token_bytes = 4;
    o.log_every = 5;
    auto u = train_options(job, o);
    REQUIRE(u);
    CHECK(u->steps == 7);
    CHECK(u->optimizer.total_steps == 30);  // a resumed run continues the same schedule
    CHECK(u->seed == 0);
    CHECK(u->token_bytes == 4);
    CHECK(u->log_every == 5);
    CHECK(format_train_options(*u).find("for 7 step(s)") != std::string::npos);
  }
}

TEST_CASE("train_run: batch and seq fall back to the dims; none is an error with --data", "[job]") {
  TempDir d;
  LaunchOptions o;
  o.data = d.path / "tokens.bin";
  Job dims = job_of(d, "", "[model]\ndims = { batch = 4, seq = 32 }\n");
  auto t = train_options(dims, o);
  REQUIRE(t);
  CHECK(t->batch == 4);
  CHECK(t->seq == 32);
  CHECK(t->optimizer.kind == hp::train::OptimizerKind::adamw);  // [train] defaults
  CHECK(t->steps == 100);
  CHECK(t->grad.logits == "output");

  Job none = job_of(d, "");
  auto e = train_options(none, o);
  REQUIRE(!e);
  CHECK(e.error().code == hp::Errc::bad_input);
  CHECK_THAT(e.error().message(), Catch::Contains("needs the batch and the sequence length"));
  // One batch from --inputs carries its own shapes.
  o.data.clear();
  o.inputs = d.path / "sub";
  auto in = train_options(none, o);
  REQUIRE(in);
  CHECK(in->inputs_dir == d.path / "sub");
}

TEST_CASE("train_run: what is refused before training", "[job]") {
  TempDir d;
  Job job = job_of(d, "steps = 2\n", "[model]\ndims = { batch = 4, seq = 32 }\n");
  LaunchOptions o;
  o.data = d.path / "tokens.bin";
  auto code = [&](const LaunchOptions& x) {
    auto t = train_options(job, x);
    return t ? std::string("ok") : std::string(hp::errc_name(t.error().code));
  };
  REQUIRE(code(o) == "ok");
  LaunchOptions both = o;
  both.inputs = d.path;
  CHECK(code(both) == "usage");
  LaunchOptions neither = o;
  neither.data.clear();
  CHECK(code(neither) == "usage");
  LaunchOptions missing = o;
  missing.data = d.path / "nope.bin";
  CHECK(code(missing) == "bad input");
  LaunchOptions not_dir = o;
  not_dir.data.clear();
  not_dir.inputs = d.path / "tokens.bin";
  CHECK(code(not_dir) == "bad input");
  LaunchOptions resume = o;
  resume.resume_dir = d.path / "no-checkpoint";
  CHECK(code(resume) == "bad input");
  resume.resume_dir = d.path / "sub";
  CHECK(code(resume) == "ok");
  LaunchOptions every = o;
  every.checkpoint_every = 5;
  CHECK(code(every) == "usage");  // without --checkpoint
  every.checkpoint_dir = d.path / "ckpt";
  CHECK(code(every) == "ok");
  LaunchOptions bytes = o;
  bytes.token_bytes = 3;
  CHECK(code(bytes) == "usage");
  for (auto set : std::vector<void (*)(LaunchOptions&)>{
           [](LaunchOptions& x) { x.outputs = "out"; }, [](LaunchOptions& x) { x.shard_dir = "s"; },
           [](LaunchOptions& x) { x.hostfile = "h"; },
           [](LaunchOptions& x) { x.launcher = "slurm"; },
           [](LaunchOptions& x) { x.timeout_s = 5; }, [](LaunchOptions& x) { x.run_dir = "r"; },
           [](LaunchOptions& x) { x.simulate = true; }}) {
    LaunchOptions x = o;
    set(x);
    CHECK(code(x) == "usage");
  }
  // Data parallelism trains; the job's options then apply, a forward job's do not.
  Job two = job_of(d, "", "[model]\ndims = { batch = 4, seq = 32 }\n", "dp = 2\ntp = 1\npp = 1\n");
  CHECK(train_options(two, o));
  for (auto set : std::vector<void (*)(LaunchOptions&)>{
           [](LaunchOptions& x) { x.hostfile = "h"; }, [](LaunchOptions& x) { x.timeout_s = 5; },
           [](LaunchOptions& x) { x.run_dir = "r"; },
           [](LaunchOptions& x) { x.simulate = true; }}) {
    LaunchOptions x = o;
    set(x);
    CHECK(train_options(two, x));
  }
  LaunchOptions outputs = o;
  outputs.outputs = "out";
  CHECK(!train_options(two, outputs));
  // Tensor parallelism: hp shard partitions the recipe up front, so a model file that is no model
  // is named here (tests/train/run_distributed.py trains real exports).
  Job tp = job_of(d, "", "[model]\ndims = { batch = 4, seq = 32 }\n", "dp = 1\ntp = 2\npp = 1\n");
  auto tpo = train_options(tp, o);
  REQUIRE(!tpo);
  CHECK(tpo.error().code == hp::Errc::bad_input);
  CHECK_THAT(tpo.error().where(), Catch::Contains("m.onnx"));
  // Expert parallelism beside data (and pipeline) parallelism, ZeRO and HSDP trains; with tp not
  // yet (pipelines: tests/train/run_pipeline.py).
  Job ep = job_of(d, "", "", "dp = 2\ntp = 1\npp = 1\nexpert_parallel = 2\n");
  auto e = train_options(ep, o);  // refused, if at all, for what this test leaves out, not ep
  CHECK((e || e.error().code != hp::Errc::not_implemented));
  Job ep_tp = job_of(d, "", "", "dp = 2\ntp = 2\npp = 1\nexpert_parallel = 2\n");
  auto t = train_options(ep_tp, o);
  REQUIRE(!t);
  CHECK(t.error().code == hp::Errc::not_implemented);
  CHECK_THAT(t.error().message(), Catch::Contains("expert_parallel = 2 and tp = 2"));
  CHECK_THAT(t.error().where(), Catch::Contains("r.toml:"));
  Job ep_zero =
      job_of(d, "", "", "dp = 2\ntp = 1\npp = 1\nexpert_parallel = 2\noptimizer_shard = 1\n");
  auto z = train_options(ep_zero, o);
  CHECK((z || z.error().code != hp::Errc::not_implemented));
  Job ep_hsdp = job_of(d, "", "",
                       "dp = 4\ntp = 1\npp = 1\nexpert_parallel = 2\noptimizer_shard = 2\n"
                       "shard_group = 2\n");
  auto h = train_options(ep_hsdp, o);
  CHECK((h || h.error().code != hp::Errc::not_implemented));
  // HSDP needs each expert's holders split evenly by the shard groups.
  Job ep_uneven = job_of(d, "", "",
                         "dp = 12\ntp = 1\npp = 1\nexpert_parallel = 4\noptimizer_shard = 2\n"
                         "shard_group = 6\n");
  auto u = train_options(ep_uneven, o);
  REQUIRE(!u);
  CHECK(u.error().code == hp::Errc::bad_input);
  CHECK_THAT(u.error().message(),
             Catch::Contains("shard_group = 6 must be a multiple or a divisor"));
}

TEST_CASE("train_run: training options are named when given", "[job]") {
  LaunchOptions o;
  CHECK(training_option_given(o).empty());
  o.steps = 5;  // shared with sharded runs
  o.inputs = "in";
  CHECK(training_option_given(o).empty());
  o.checkpoint_every = 3;
  CHECK(training_option_given(o) == "--checkpoint-every");
  o.data = "d.bin";
  CHECK(training_option_given(o) == "--data");
}
