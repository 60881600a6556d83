// plan_job / format_dry_run: the Open MPI MPMD (or srun --multi-prog) command for a recipe. See
// launcher.h for the rules and docs/launch.md ("Open MPI pitfalls") for the Open MPI 4.1 behaviour
// they work around.
#include <fmt/core.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <thread>

#include "hp/job/group_flow.h"
#include "hp/job/launcher.h"
#include "hp/recipe/names.h"

namespace hp::job {
namespace fs = std::filesystem;

HostInfo probe_host() {
  HostInfo h;
  h.cores = std::max(1u, std::thread::hardware_concurrency());
  h.root = ::geteuid() == 0;
  return h;
}

const std::string& JobPlan::group_of(int rank) const {
  static const std::string unknown = "?";
  for (const auto& c : contexts)
    if (rank >= c.first_rank && rank < c.first_rank + c.ranks) return c.group;
  return unknown;
}

std::string shell_quote(const std::string& w) {
  if (!w.empty() &&
      w.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=/.,:@%") ==
          std::string::npos)
    return w;
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

namespace {

std::string rank_range(int first, int n) {
  return n == 1 ? std::to_string(first) : fmt::format("{}-{}", first, first + n - 1);
}

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::string(v) == value;
}

}  // namespace

namespace {

// One app context per group, in recipe order, with its rank range; a module that is missing or no
// ONNX file is reported for every group at once.
Status add_contexts(const Job& job, const std::vector<recipe::Group>& groups,
                    const std::string& where, JobPlan& plan) {
  std::vector<Diagnostic> problems;
  int next = 0;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    const std::string key = fmt::format("{}: groups[{}] ('{}')", where, i, g.name);
    const fs::path module = job.module_path(g);
    if (is_scheduler(g))
      ;  // runs no model (group_flow.h)
    else if (module.extension() != ".onnx")
      problems.push_back({key, fmt::format("module '{}' is not an ONNX file", g.module),
                          "each group runs an ONNX module (a path relative to the recipe) or is "
                          "the \"scheduler\""});
    else if (!fs::is_regular_file(module))
      problems.push_back(
          {key, fmt::format("module '{}' does not exist ({})", g.module, module.string()), ""});
    AppContext c;
    c.group = g.name;
    c.index = static_cast<int>(i);
    c.first_rank = next;
    c.ranks = static_cast<int>(g.ranks.size());
    next += c.ranks;
    plan.contexts.push_back(std::move(c));
  }
  if (!problems.empty()) return collect_errors(Errc::bad_input, std::move(problems));
  plan.total_ranks = next;
  return {};
}

// Each context's environment (HP_GROUP... then the group's own env) and its worker command line.
void add_worker_commands(const std::vector<recipe::Group>& groups, const fs::path& recipe,
                         const JobOptions& o, int threads, JobPlan& plan) {
  for (std::size_t i = 0; i < groups.size(); ++i) {
    AppContext& c = plan.contexts[i];
    c.env = {{"HP_GROUP", c.group},
             {"HP_GROUP_INDEX", std::to_string(c.index)},
             {"HP_RECIPE", recipe.string()},
             {"HP_RUN_DIR", plan.run_dir.string()}};
    for (const auto& [k, v] : groups[i].env) c.env.emplace_back(k, v);
    c.argv = {fs::absolute(o.worker).string(),
              "launch",
              recipe.string(),
              "--worker",
              "--run-dir",
              plan.run_dir.string(),
              "--threads",
              std::to_string(threads)};
    if (!o.inputs.empty()) {
      c.argv.push_back("--inputs");
      c.argv.push_back(fs::absolute(o.inputs).string());
    }
    for (const auto& p : o.plugin_paths) {
      c.argv.push_back("--plugin-path");
      c.argv.push_back(fs::absolute(p).string());
    }
    // The ranks re-read the recipe: they need the variables the user allowed it to set.
    for (const auto& name : recipe::allowed_recipe_env()) {
      c.argv.push_back("--allow-recipe-env");
      c.argv.push_back(name);
    }
    if (o.steps > 1) {
      c.argv.push_back("--steps");
      c.argv.push_back(std::to_string(o.steps));
    }
    c.argv.insert(c.argv.end(), o.extra_args.begin(), o.extra_args.end());
  }
}

// Launcher environment: container-safe defaults unless the user already chose (docs/launch.md).
void add_launcher_env(const JobOptions& o, const HostInfo& host, bool single_host, JobPlan& plan) {
  if (single_host && !std::getenv("OMPI_MCA_plm")) {
    plan.launcher_env.emplace_back("OMPI_MCA_plm", "isolated");
    plan.notes.push_back("OMPI_MCA_plm=isolated: single-host run, no ssh/rsh launch agent needed");
  }
  if (o.launcher == "mpirun" && !std::getenv("OMPI_MCA_btl_vader_single_copy_mechanism")) {
    plan.launcher_env.emplace_back("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    plan.notes.push_back(
        "OMPI_MCA_btl_vader_single_copy_mechanism=none: containers often block process_vm_readv");
  }
  const bool root_ok = o.allow_run_as_root || (env_is("OMPI_ALLOW_RUN_AS_ROOT", "1") &&
                                               env_is("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"));
  if (host.root && !root_ok && o.launcher == "mpirun")
    plan.notes.push_back(
        "running as root: Open MPI refuses unless --allow-run-as-root is given "
        "(or OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)");
}

// Every word hp writes into the launcher's files is checked before anything is written: a line
// break in any of them would start a new app context / program line (another command), and srun
// --multi-prog has its own syntax (%t and %o expand, quotes and backslashes are its own, '#'
// comments), so under slurm a word holds only characters no parser reads as syntax. Refused rather
// than quoted: the two formats quote differently (Open MPI app files not at all).
Status check_launcher_words(const JobOptions& o, const JobPlan& plan) {
  static constexpr std::string_view kSlurmSafe =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=/.,:@";
  std::vector<Diagnostic> problems;
  auto check = [&](const AppContext& c, const std::string& what, const std::string& word) {
    std::string bad;
    for (char ch : word) {
      const auto u = static_cast<unsigned char>(ch);
      if (u < 0x20 || u == 0x7f)
        bad = fmt::format("the control character 0x{:02x}", u);
      else if (o.launcher == "slurm" && kSlurmSafe.find(ch) == std::string_view::npos)
        bad = fmt::format("'{}', which srun --multi-prog would read as syntax", ch);
      if (!bad.empty()) break;
    }
    if (!bad.empty())
      problems.push_back({fmt::format("{}: group '{}'", o.recipe.string(), c.group),
                          fmt::format("{} holds {}; it would be written into {} as is", what, bad,
                                      o.launcher == "slurm" ? "multi-prog.conf" : "app.txt"),
                          "rename it, or run from a path without such characters"});
  };
  for (const auto& c : plan.contexts) {
    check(c, "the group name", c.group);
    for (const auto& [k, v] : c.env) {
      if (!recipe::is_env_name(k))
        problems.push_back({fmt::format("{}: group '{}'", o.recipe.string(), c.group),
                            fmt::format("'{}' is not an environment variable name", k), ""});
      check(c, fmt::format("the value of {}", k), v);
    }
    for (const auto& a : c.argv) check(c, fmt::format("the worker argument '{}'", a), a);
  }
  if (!problems.empty()) return collect_errors(Errc::bad_input, std::move(problems));
  return {};
}

// srun --multi-prog: one line per rank range, its environment through env(1).
void finish_slurm(const JobOptions& o, JobPlan& plan) {
  plan.app_file_name = "multi-prog.conf";
  plan.app_file = "# srun --multi-prog: <ranks> <program> <args>; written by hp launch\n";
  for (const auto& c : plan.contexts) {
    std::string line = rank_range(c.first_rank, c.ranks) + " env";
    for (const auto& [k, v] : c.env) line += " " + k + "=" + v;
    for (const auto& a : c.argv) line += " " + a;
    plan.app_file += line + "\n";
  }
  plan.argv = {o.mpirun == "mpirun" ? std::string("srun") : o.mpirun, "-n",
               std::to_string(plan.total_ranks), "-l", "--kill-on-bad-exit=1"};
  if (o.timeout_s > 0)
    plan.argv.push_back(
        fmt::format("--time={}", (static_cast<long>(std::ceil(o.timeout_s)) + 59) / 60));
  plan.argv.insert(plan.argv.end(), o.launcher_args.begin(), o.launcher_args.end());
  plan.argv.push_back("--multi-prog");
  plan.argv.push_back((plan.run_dir / plan.app_file_name).string());
}

// mpirun's MPMD form: global options, then one colon-separated context per group; the app file
// repeats --hostfile and every -x per line because `--app` ignores the command-line ones.
void finish_mpirun(const JobOptions& o, const HostInfo& host, bool single_host, JobPlan& plan) {
  plan.argv = {o.mpirun};
  std::vector<std::string> global;
  if (o.allow_run_as_root) global.push_back("--allow-run-as-root");
  if (single_host && plan.total_ranks > host.cores) {
    global.push_back("--oversubscribe");
    plan.notes.push_back(
        fmt::format("--oversubscribe: {} ranks on {} cores", plan.total_ranks, host.cores));
  }
  global.insert(global.end(), {"--bind-to", "none", "--tag-output"});
  if (o.timeout_s > 0)
    global.insert(global.end(),
                  {"--timeout", std::to_string(static_cast<long>(std::ceil(o.timeout_s)))});
  std::string hostfile;
  if (!o.hostfile.empty()) {
    hostfile = fs::absolute(o.hostfile).string();
    global.insert(global.end(), {"--hostfile", hostfile});
  }
  global.insert(global.end(), o.launcher_args.begin(), o.launcher_args.end());
  plan.argv.insert(plan.argv.end(), global.begin(), global.end());
  plan.app_file_name = "app.txt";
  plan.app_file =
      "# mpirun --app: one app context per line; --hostfile and every -x repeated per line\n";
  for (std::size_t i = 0; i < plan.contexts.size(); ++i) {
    const auto& c = plan.contexts[i];
    if (i) plan.argv.push_back(":");
    std::vector<std::string> ctx{"-n", std::to_string(c.ranks)};
    for (const auto& [k, v] : c.env) ctx.insert(ctx.end(), {"-x", k + "=" + v});
    ctx.insert(ctx.end(), c.argv.begin(), c.argv.end());
    plan.argv.insert(plan.argv.end(), ctx.begin(), ctx.end());
    std::string line = "-n " + std::to_string(c.ranks);
    if (!hostfile.empty()) line += " --hostfile " + hostfile;
    for (std::size_t k = 2; k < ctx.size(); ++k) line += " " + ctx[k];
    plan.app_file += line + "\n";
  }
}

}  // namespace

Expected<std::vector<std::string>> split_words(std::string_view text, std::string_view what) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'' || c == '"') {
      std::size_t k = i + 1;
      for (; k < text.size() && text[k] != c; ++k) {
        // Inside "...", a backslash escapes " and \ (anything else stays as typed).
        if (c == '"' && text[k] == '\\' && k + 1 < text.size() &&
            (text[k + 1] == '"' || text[k + 1] == '\\'))
          ++k;
        word += text[k];
      }
      if (k >= text.size())
        return Error(Errc::usage, fmt::format("{}: unterminated {} quote", what, c), "",
                     "close the quote, or escape it with a backslash");
      i = k;
    } else if (c == '\\') {
      if (i + 1 >= text.size())
        return Error(Errc::usage, fmt::format("{}: a trailing backslash escapes nothing", what));
      word += text[++i];
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

Expected<JobPlan> plan_job(const Job& job, const JobOptions& o, const HostInfo& host) {
  if (o.launcher != "mpirun" && o.launcher != "slurm")
    return Error(Errc::usage, fmt::format("unknown launcher '{}'", o.launcher), "",
                 "--launcher is mpirun or slurm");
  if (!(o.timeout_s >= 0))
    return Error(Errc::usage, "--timeout must be a non-negative number of seconds");
  if (o.run_dir.empty()) return Error(Errc::internal, "plan_job needs a run directory");
  if (!o.hostfile.empty() && !fs::is_regular_file(o.hostfile))
    return Error(Errc::bad_input, fmt::format("hostfile '{}' does not exist", o.hostfile.string()));
  JobPlan plan;
  plan.run_dir = fs::absolute(o.run_dir).lexically_normal();
  // The groups: as declared, or one implicit group running the recipe's model on every rank.
  const std::vector<recipe::Group> groups = job.groups();
  HP_TRY(add_contexts(job, groups, o.recipe.string(), plan));
  // Tensors flowing between groups: a module that lacks a tensor its flow names would otherwise
  // only fail once every rank has started.
  if (job.kind == JobKind::flow_groups) HP_TRY(check_group_flows(job));
  const int threads =
      o.threads > 0 ? o.threads : std::max(1, host.cores / std::max(1, plan.total_ranks));
  add_worker_commands(groups, fs::absolute(o.recipe).lexically_normal(), o, threads, plan);
  const bool single_host = o.hostfile.empty() && o.launcher == "mpirun";
  add_launcher_env(o, host, single_host, plan);
  HP_TRY(check_launcher_words(o, plan));
  if (o.launcher == "slurm")
    finish_slurm(o, plan);
  else
    finish_mpirun(o, host, single_host, plan);
  return plan;
}

std::string format_dry_run(const JobPlan& p) {
  std::string s = fmt::format("# {} rank(s) in {} group(s); nothing was started\n", p.total_ranks,
                              p.contexts.size());
  for (const auto& c : p.contexts)
    s += fmt::format("#   group '{}': ranks {}\n", c.group, rank_range(c.first_rank, c.ranks));
  std::string cmd;
  for (const auto& [k, v] : p.launcher_env) cmd += shell_quote(k + "=" + v) + " ";
  for (std::size_t i = 0; i < p.argv.size(); ++i) cmd += (i ? " " : "") + shell_quote(p.argv[i]);
  s += cmd + "\n";
  s += fmt::format("# {} (written to {}):\n", p.app_file_name,
                   (p.run_dir / p.app_file_name).string());
  s += p.app_file;
  for (const auto& n : p.notes) s += "# note: " + n + "\n";
  return s;
}

}  // namespace hp::job
