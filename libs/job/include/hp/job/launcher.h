// The MPMD launcher behind `hp launch RECIPE.toml` (HyperMPMD, docs/launch.md).
//
// plan_job() turns a recipe's [[groups]] (or one implicit group of dp*tp*pp ranks running the
// recipe's model) into one Open MPI job with one app context per group: `-n N`, every `-x` repeated
// in every context (a -x before the first colon reaches only the first context), HP_GROUP /
// HP_GROUP_INDEX / HP_RECIPE / HP_RUN_DIR per context, `--oversubscribe` when the ranks exceed the
// cores, `--bind-to none` (workers are threaded), `--hostfile` on a cluster. It also writes the
// equivalent app file text (which repeats --hostfile and every -x per line, because `--app` ignores
// the command-line ones) and, for `--launcher slurm`, the `srun --multi-prog` configuration.
// Container quirks are applied for single-host runs and listed in `notes`: OMPI_MCA_plm=isolated
// (no ssh/rsh agent needed) and OMPI_MCA_btl_vader_single_copy_mechanism=none (process_vm_readv is
// often blocked). Running as root is refused by Open MPI; hp adds --allow-run-as-root only on
// explicit opt-in.
//
// run_job() starts the planned command and supervises it: every rank's output line (mpirun
// --tag-output) goes to the sink prefixed "[group:rank]" and, whole, to RUN/logs/rank-N.log;
// mpirun's own messages go to RUN/logs/mpirun.log. On failure it names the first failing rank (the
// first rank that printed "hp: error:", else the rank mpirun names), shows the tail of its log, and
// returns an Error whose code follows the rank's own exit code when it is an hp code (workers
// MPI_Abort with their hp exit code), else Errc::runtime. --timeout: mpirun's own --timeout ends
// the ranks, and hp kills mpirun's process group a few seconds later if it is still alive, so
// nothing is left behind.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "hp/core/expected.h"
#include "hp/job/job.h"

namespace hp::job {

/// What plan_job needs to know about the machine (injected so tests are deterministic).
struct HostInfo {
  int cores = 1;
  bool root = false;
};
HostInfo probe_host();

struct JobOptions {
  std::filesystem::path recipe;     ///< RECIPE.toml as the ranks are to read it (the job's path)
  std::filesystem::path worker;     ///< the hp executable the ranks run (`hp launch --worker`)
  std::filesystem::path run_dir;    ///< logs and rank outputs; must be given
  std::filesystem::path inputs;     ///< input_K.pb directory handed to every rank (may be empty)
  std::filesystem::path hostfile;   ///< Open MPI hostfile / cluster run
  std::string launcher = "mpirun";  ///< "mpirun" or "slurm"
  std::string mpirun = "mpirun";    ///< the mpirun (or srun) program
  double timeout_s = 0;             ///< 0: no limit
  int threads = 0;                  ///< per rank; 0: cores / ranks (at least 1)
  bool allow_run_as_root = false;
  std::vector<std::filesystem::path> plugin_paths;
  int steps = 1;  ///< passed to the ranks as --steps when > 1
  /// Appended to every rank's command line (a training job's data and output options).
  std::vector<std::string> extra_args;
  /// --mpi-args, split into words: given to mpirun (or srun) after hp's own global options.
  std::vector<std::string> launcher_args;
};

/// One mpirun app context (one [[groups]] entry).
struct AppContext {
  std::string group;
  int index = 0, first_rank = 0, ranks = 0;
  std::vector<std::pair<std::string, std::string>> env;  ///< exported with -x, in order
  std::vector<std::string> argv;                         ///< the program and its arguments
};

struct JobPlan {
  std::vector<AppContext> contexts;
  int total_ranks = 0;
  std::vector<std::pair<std::string, std::string>> launcher_env;  ///< set for mpirun/srun itself
  std::vector<std::string> argv;                                  ///< the exact launch command
  std::string app_file;            ///< mpirun --app text, or srun --multi-prog text
  std::string app_file_name;       ///< "app.txt" or "multi-prog.conf" (under the run dir)
  std::vector<std::string> notes;  ///< which defaults were applied and why
  std::filesystem::path run_dir;
  /// Group name of a global rank ("?" when out of range).
  const std::string& group_of(int rank) const;
};

/// Builds the launch. Errors: bad_input (recipe groups inconsistent with dp*tp*pp, a module file
/// missing, a hostfile missing, tensor flows between groups that do not check: group_flow.h), usage
/// (unknown launcher, negative timeout), unavailable (root without opt-in; reported as a
/// configuration problem with the two ways out).
Expected<JobPlan> plan_job(const Job& job, const JobOptions& o, const HostInfo& host);

/// `--dry-run`: the environment and exact command on one line (shell-quoted), then the app file.
std::string format_dry_run(const JobPlan& plan);

/// Splits `text` into words as a POSIX shell would without expanding anything: whitespace
/// separates, '...' keeps everything literally, "..." keeps all but backslash escapes of " and \,
/// and a backslash outside quotes escapes the next character. Errc::usage on an unterminated quote
/// or a trailing backslash (`what` names the option in the message).
Expected<std::vector<std::string>> split_words(std::string_view text, std::string_view what);

/// Shell quoting for display: words with special characters in single quotes.
std::string shell_quote(const std::string& word);

struct JobReport {
  double seconds = 0;
  int ranks = 0;
  std::filesystem::path log_dir;
};

/// Receives each console line: `err` for stderr lines. Called from the supervising thread only.
using LineSink = std::function<void(bool err, const std::string& line)>;

/// Runs the plan (see the file comment). Writes the app file under the run dir first.
Expected<JobReport> run_job(const JobPlan& plan, const JobOptions& o, const LineSink& sink);

}  // namespace hp::job
