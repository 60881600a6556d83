// hp verify RECIPE.toml: static checks of a recipe (its keys, its cluster, its model file, the
// tensor flows between its groups), then the sharded job against the unsharded model (--simulate
// runs the ranks in-process, --static skips it). hp verify MODEL.onnx --inputs DIR --expected DIR:
// runs the model and compares its outputs. hp verify MODEL.onnx --grad: hp's gradient model
// against finite differences in float64 (hp::train::check_gradients). Exit 6 on a mismatch. The
// file's extension picks the mode. Thin: flags -> hp::job::VerifyOptions -> hp::job::verify (or
// hp::train::GradCheckOptions -> hp::train::check_gradients) -> the report or the error. See
// hp-verify(1).
#include <memory>

#include <fmt/core.h>

#include "commands.h"
#include "hp/core/fs.h"
#include "hp/job/verify.h"
#include "hp/recipe/presets.h"
#include "hp/train/gradcheck.h"

namespace hp::cli {

void add_verify_command(CLI::App& app, Context& ctx) {
  struct Flags {
    job::VerifyOptions opts;
    std::string target, inputs, expected;
    std::string backend = "cpu";
    bool json = false;
    bool grad = false;
    train::GradCheckOptions g;
    std::string loss = "cross_entropy";
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand("verify", "check a recipe (and, with --inputs, its outputs)");
  sub->add_option("recipe", f->target,
                  "the recipe file (.toml), or a model (.onnx) to run and compare")
      ->required();
  sub->add_option("--inputs", f->inputs, "directory of input_K.pb tensors to run the model on");
  sub->add_option("--expected", f->expected, "directory of expected output_K.pb tensors");
  sub->add_option("--rtol", f->opts.rtol, "relative tolerance of the output comparison")
      ->capture_default_str();
  sub->add_option("--atol", f->opts.atol, "absolute tolerance of the output comparison")
      ->capture_default_str();
  sub->add_option("--backend", f->backend, "plugin to run on (cpu, cuda, ascend)")
      ->capture_default_str();
  sub->add_option("--threads", f->opts.threads,
                  "CPU threads when running a model (default: the cores available)");
  sub->add_flag("--json", f->json,
                "print one JSON object on stdout (ok, errors with where/message/hint; the outputs' "
                "max errors)");
  sub->add_flag("--static", f->opts.static_only,
                "RECIPE: the static checks only; do not run the sharded job");
  sub->add_flag("--simulate", f->opts.run.simulate,
                "RECIPE: run all ranks in this process (no MPI)");
  sub->add_option("--data", f->opts.run.data,
                  "RECIPE with [train]: token stream to train on (else --inputs: one batch)");
  sub->add_option("--steps", f->opts.run.steps,
                  "RECIPE with [train]: steps trained by the job and by one rank (default 3)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--seed", f->opts.run.seed,
                  "seed of the generated inputs (without --inputs) and of --grad's directions")
      ->capture_default_str();
  sub->add_flag("--grad", f->grad,
                "MODEL: check hp's gradients against central finite differences in float64");
  sub->add_option("--loss", f->loss, "--grad: the loss on the logits (cross_entropy or mse)")
      ->capture_default_str();
  sub->add_option("--logits", f->g.grad.logits,
                  "--grad: the graph output the loss reads (default: the first output)");
  sub->add_option("--labels", f->g.grad.labels, "--grad: the name of the labels input")
      ->capture_default_str();
  sub->add_option("--frozen", f->g.grad.frozen,
                  "--grad: initializers not trained (glob with * and ?; repeatable)");
  sub->add_option("--directions", f->g.directions, "--grad: random directions to compare along")
      ->capture_default_str();
  sub->add_option("--eps", f->g.eps, "--grad: the step, relative to max(1, |weights|)")
      ->capture_default_str();
  sub->add_option("--shard-dir", f->opts.run.shard_dir,
                  "RECIPE: verify these hp shard partitions instead of fresh ones");
  sub->add_option("--timeout", f->opts.run.timeout_s,
                  "RECIPE: stop the MPI job after this many seconds")
      ->check(timeout_seconds());
  sub->add_flag("--allow-run-as-root", f->opts.run.allow_run_as_root,
                "RECIPE: let Open MPI start ranks as root");
  f->g.grad.logits.clear();  // the library's default: the model's first output
  sub->callback([f, &ctx, sub] {
    if (f->grad) {
      train::GradCheckOptions& g = f->g;
      g.model = f->target;
      g.inputs = f->inputs;
      g.seed = f->opts.run.seed;
      g.threads = f->opts.threads;
      if (sub->count("--backend")) g.backend = f->backend;
      auto loss = train::parse_loss(f->loss);
      if (!loss) {
        ctx.exit_code = report_error(loss.error());
        return;
      }
      g.grad.loss = *loss;
      if (!f->expected.empty() || f->target.ends_with(".toml")) {
        ctx.exit_code = report_error(Error(Errc::usage,
                                           "--grad checks a model (.onnx) on its "
                                           "inputs; it takes no recipe or --expected"));
        return;
      }
      auto report = train::check_gradients(g);
      if (!report) {
        ctx.exit_code = report_error(report.error());
        return;
      }
      fmt::print("{}", f->json ? report->json() + "\n" : report->text());
      ctx.exit_code = report->ok() ? 0 : report_error(report->mismatch());
      return;
    }
    job::VerifyOptions& o = f->opts;
    o.target = f->target;
    o.inputs = f->inputs;
    o.expected = f->expected;
    o.backend =
        sub->count("--backend") ? f->backend : std::string();  // default: the best available
    // Presets: the install's share/hp first, then this build's source tree.
    o.preset_dirs = recipe::preset_dirs(executable_dir(), HP_SOURCE_DIR);
    auto report = job::verify(o);
    if (!report) {
      ctx.exit_code = report_error(report.error());
      return;
    }
    if (f->json)
      fmt::print("{}\n", report->json());
    else
      fmt::print("{}", report->text());
    if (report->failure)
      ctx.exit_code = report_error(*report->failure);
    else
      ctx.exit_code = report->ok() ? 0 : report_error(report->mismatch());
  });
}

}  // namespace hp::cli
