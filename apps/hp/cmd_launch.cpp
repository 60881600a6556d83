// hp launch MODEL.onnx --inputs DIR [--outputs DIR] [--steps N] [--backend B] [--threads N]: runs
// a model on one rank. hp launch RECIPE.toml with [train] (--data F | --inputs D) [--steps N]
// [--checkpoint D]...: trains on one rank (hp/job/train_run.h). hp launch RECIPE.toml [--dry-run]
// [--timeout S]
// [--hostfile F] [--launcher slurm]: one MPMD job over Open MPI, an app context per [[groups]]
// entry, or the recipe's model sharded over dp*tp*pp ranks when it has no groups (hp::job::launch).
// The ranks run the hidden `hp launch RECIPE.toml --worker`, which must end with MPI_Abort on any
// error. See hp-launch(1).
#include <fmt/core.h>

#include <cstdio>

#include "commands.h"
#include "hp/comm/comm.h"
#include "hp/core/fs.h"
#include "hp/job/launch.h"
#include "hp/recipe/presets.h"

namespace hp::cli {

void add_launch_command(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<job::LaunchOptions>();
  CLI::App* sub = app.add_subcommand("launch", "run a recipe (MPMD process groups) or a model");
  sub->add_option("target", opts->target, "RECIPE.toml or MODEL.onnx")->required();
  sub->add_option("--inputs", opts->inputs, "directory of input_K.pb tensors");
  sub->add_option("--outputs", opts->outputs,
                  "directory to write output_K.pb tensors (replaced atomically, only if it is "
                  "hp's own earlier output); MODEL.onnx without it: print each output's shape, "
                  "range and first values");
  sub->add_flag("--force", opts->force,
                "let --outputs (training: --checkpoint) replace a directory that is not hp's own "
                "earlier output (never the inputs or the working directory)");
  sub->add_option("--backend", opts->backend,
                  "cpu, cuda or ascend (default: best available; MODEL.onnx, or training: cpu)");
  sub->add_option("--threads", opts->threads,
                  "CPU threads (per rank for a recipe; default: the cores available)");
  sub->add_option("--dtype", opts->dtype,
                  "MODEL.onnx: f32 (default) or bf16, which runs MatMul, Gemm and Conv in bfloat16 "
                  "with float32 accumulation (CPUs with AVX512-BF16 or AMX)");
  sub->add_flag("--profile", opts->profile,
                "MODEL.onnx: print the last run's time per op type (see also --trace FILE)");
  sub->add_option("--plugin-path", opts->plugin_paths,
                  "extra plugin directory or file (repeatable)");
  sub->add_option("--hostfile", opts->hostfile, "Open MPI hostfile for a multi-node run");
  sub->add_option("--timeout", opts->timeout_s, "stop the job after this many seconds")
      ->check(timeout_seconds());
  sub->add_option("--run-dir", opts->run_dir,
                  "where rank logs and outputs go (default: $HP_RUNS_DIR or hp-runs, "
                  "/<recipe>-<time>-<pid>; the last $HP_KEEP_RUNS=10 are kept)");
  sub->add_option("--steps", opts->steps,
                  "run a model, or a sharded recipe's schedule, N times and report the median; "
                  "with [train]: optimizer steps (default [train].steps)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--shard-dir", opts->shard_dir,
                  "run these hp shard partitions instead of sharding afresh");
  sub->add_option("--launcher", opts->launcher, "mpirun (default) or slurm (srun --multi-prog)");
  sub->add_flag("--allow-run-as-root", opts->allow_run_as_root,
                "let Open MPI start ranks as root (containers)");
  sub->add_flag("--dry-run", opts->dry_run,
                "print the mpirun command and write its app file; start nothing");
  sub->add_option("--mpi-args", opts->mpi_args,
                  "extra mpirun (or srun) options, split as a shell would: \"--mca btl tcp,self\"");
  sub->add_option("--nproc-per-node", opts->nproc_per_node,
                  "ranks per node (torchrun's flag): must match the recipe's rank count on one "
                  "host; with --hostfile, mpirun --npernode")
      ->check(CLI::PositiveNumber);
  auto json = std::make_shared<bool>(false);
  auto quiet = std::make_shared<bool>(false);
  sub->add_flag("--json", *json, "print the results as one JSON object on stdout");
  sub->add_flag("-q,--quiet", *quiet, "print only errors and the final results (no rank output)");
  sub->add_flag("-v,--verbose", opts->verbose,
                "print the mpirun command and the rank log paths before starting");
  // Training (a recipe with [train]); launch() refuses these for anything else.
  const std::string training = "Training (a recipe with [train])";
  sub->add_option("--data", opts->data, "token stream to train on (flat uint16 or uint32 ids)")
      ->group(training);
  sub->add_option("--token-bytes", opts->token_bytes, "bytes per token id in --data: 2 or 4")
      ->check(CLI::IsMember({2, 4}))
      ->group(training);
  sub->add_option("--seed", opts->seed, "order of the --data batches (default [train].seed)")
      ->check(CLI::NonNegativeNumber)
      ->group(training);
  sub->add_option("--metrics", opts->metrics, "write one JSON line per step to this file")
      ->group(training);
  sub->add_option("--save-model", opts->save_model, "write the trained model to this ONNX file")
      ->group(training);
  sub->add_option("--trace", opts->trace,
                  "write every rank's steps (compute, gradient buckets, optimizer) as a Chrome "
                  "trace (Perfetto); MODEL.onnx: every node of the last run")
      ->group(training);
  sub->add_option("--timeline", opts->timeline,
                  "pp > 1: draw the last step's measured per-rank actions above the schedule's "
                  "prediction from the measured F/B/W times (SVG)")
      ->group(training);
  sub->add_flag("--simulate", opts->simulate,
                "dp > 1: run the data-parallel ranks as threads of this process, not mpirun")
      ->group(training);
  sub->add_option("--checkpoint", opts->checkpoint_dir,
                  "keep a checkpoint in this directory (at the end, and every --checkpoint-every)")
      ->group(training);
  sub->add_option("--checkpoint-every", opts->checkpoint_every,
                  "steps between checkpoints (default: only at the end)")
      ->check(CLI::PositiveNumber)
      ->group(training);
  sub->add_option("--resume", opts->resume_dir, "continue from the checkpoint in this directory")
      ->group(training);
  sub->add_option("--log-every", opts->log_every, "print a progress line every K steps (default 1)")
      ->check(CLI::PositiveNumber)
      ->group(training);
  sub->add_flag("--worker", opts->worker, "run as one rank of the job (started by hp launch)")
      ->group("");
  sub->callback([opts, json, quiet, &ctx] {
    opts->verbose = opts->verbose || ctx.verbose;
    // --json keeps stdout for the one object: the ranks' lines go to stderr (--quiet: not at all).
    opts->sink = [json = *json, quiet = *quiet](bool err, const std::string& line) {
      if (quiet && !err) return;
      std::FILE* f = err || json ? stderr : stdout;
      fmt::print(f, "{}\n", line);
      std::fflush(f);
    };
    opts->preset_dirs = recipe::preset_dirs(executable_dir(), HP_SOURCE_DIR);
    auto report = job::launch(*opts);
    if (!report) {
      ctx.exit_code = report_error(report.error());
      // A rank must not return normally on error: the other ranks may wait on it in a collective.
      if (opts->worker) {
        std::fflush(stderr);
        comm::mpi_abort(ctx.exit_code);
      }
      return;
    }
    if (*json && !opts->worker)
      fmt::print("{}\n", report->json.empty() ? std::string("{}") : report->json);
    else
      fmt::print("{}", report->summary);
  });
}

}  // namespace hp::cli
