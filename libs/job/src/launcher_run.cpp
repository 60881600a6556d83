// run_job: starts mpirun (or srun) in its own process group, tees every rank's lines to the console
// sink ("[group:rank] ...") and to RUN/logs/rank-N.log, and turns the end of the job into a result.
//
// Why the pieces: mpirun --tag-output gives "[jobid,rank]<stdout>:text", from which the rank is
// read (srun -l gives "rank: text"). Logs are flushed per line so a killed job still has its tail.
// The first failing rank is the first that printed "hp: error:" (workers print their error, record
// their hp exit code under RUN/exits, then MPI_Abort with it); a rank that crashed is named by
// mpirun's own message instead.
// A failing job whose teardown stalls (a rank printed its error, yet ranks or mpirun linger) is
// ended the same way 10 s after that first error. Timeouts: mpirun's --timeout ends the ranks; if
// mpirun itself is still alive a few seconds after the limit, hp sends SIGTERM to its process
// group, then SIGKILL, then SIGKILLs the rank PIDs the workers recorded under RUN/pids (ranks may
// live in their own process groups), so nothing is left behind. SIGINT/SIGTERM/SIGHUP to hp are
// forwarded the same way (SIGKILL after a few seconds); mpirun itself dies with hp
// (PR_SET_PDEATHSIG), and each rank with mpirun (worker.h's watchdog).
#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <vector>

#include "hp/core/fs.h"
#include "hp/core/interrupt.h"
#include "hp/job/launcher.h"

namespace hp::job {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

struct Supervisor {
  const JobPlan& plan;
  const LineSink& sink;
  fs::path log_dir;
  std::map<int, std::unique_ptr<std::ofstream>> logs;
  std::ofstream launcher_log;
  std::deque<std::string> launcher_tail;
  int first_error_rank = -1;
  std::string first_error;
  bool slurm = false;

  std::ofstream& log_of(int rank) {
    auto& f = logs[rank];
    if (!f)
      f = std::make_unique<std::ofstream>(log_dir / fmt::format("rank-{}.log", rank),
                                          std::ios::app);
    return *f;
  }

  void line(bool err, const std::string& text) {
    static const std::regex ompi(R"(^\[\d+,(\d+)\]<(stdout|stderr)>:(.*)$)");
    static const std::regex srun(R"(^\s*(\d+): (.*)$)");
    std::smatch m;
    int rank = -1;
    std::string body;
    if (!slurm && std::regex_match(text, m, ompi)) {
      rank = std::stoi(m[1]);
      err = m[2] == "stderr";
      body = m[3];
    } else if (slurm && std::regex_match(text, m, srun)) {
      rank = std::stoi(m[1]);
      body = m[2];
    }
    if (rank < 0 || rank >= plan.total_ranks) {
      launcher_log << text << '\n' << std::flush;
      launcher_tail.push_back(text);
      if (launcher_tail.size() > 200) launcher_tail.pop_front();
      return;
    }
    log_of(rank) << body << '\n' << std::flush;
    // A rank that mpirun stopped because another failed says "interrupted by SIGTERM": not the
    // cause.
    if (first_error_rank < 0 && body.rfind("hp: error:", 0) == 0 &&
        body.rfind("hp: error: interrupted by ", 0) != 0) {
      first_error_rank = rank;
      first_error = body;
    }
    sink(err, fmt::format("[{}:{}] {}", plan.group_of(rank), rank, body));
  }
};

// Reads whatever is available on `fd` into `buf` and emits complete lines; false at EOF.
bool pump(int fd, std::string& buf, bool err, Supervisor& sup) {
  char chunk[4096];
  ssize_t n = ::read(fd, chunk, sizeof chunk);
  if (n <= 0) {
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (!buf.empty()) sup.line(err, buf);
    buf.clear();
    return false;
  }
  buf.append(chunk, static_cast<std::size_t>(n));
  std::size_t pos;
  while ((pos = buf.find('\n')) != std::string::npos) {
    sup.line(err, buf.substr(0, pos));
    buf.erase(0, pos + 1);
  }
  return true;
}

std::string tail_of(const fs::path& file, std::size_t lines) {
  std::ifstream in(file);
  std::deque<std::string> last;
  for (std::string l; std::getline(in, l);) {
    last.push_back(l);
    if (last.size() > lines) last.pop_front();
  }
  std::string s;
  for (const auto& l : last) s += "\n    | " + l;
  return s;
}

bool on_path(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return ::access(prog.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= p.size()) {
    std::size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    fs::path cand = fs::path(p.substr(start, end - start)) / prog;
    if (::access(cand.c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

Errc errc_of_exit(int rc) {
  switch (rc) {
    case 2: return Errc::usage;
    case 3: return Errc::bad_input;
    case 4: return Errc::infeasible;
    case 6: return Errc::mismatch;
    case 7: return Errc::unavailable;
    case 8: return Errc::not_implemented;
    default: return Errc::runtime;
  }
}

// The ranks that recorded their PID under RUN/pids and still run -- only processes whose command
// line names this run directory, so a PID reused by an unrelated process is left alone.
std::vector<pid_t> recorded_ranks(const fs::path& run_dir) {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir / "pids", ec)) {
    std::ifstream in(e.path());
    long pid = 0;
    if (!(in >> pid) || pid <= 1) continue;
    std::ifstream cmd(fmt::format("/proc/{}/cmdline", pid), std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find("--worker") != std::string::npos &&
        cmdline.find(run_dir.string()) != std::string::npos)
      pids.push_back(static_cast<pid_t>(pid));
  }
  return pids;
}

// The exit code rank `rank` recorded under RUN/exits before aborting, if it did.
std::optional<int> recorded_exit(const fs::path& run_dir, int rank) {
  std::ifstream in(run_dir / "exits" / fmt::format("rank-{}.code", rank));
  int code = 0;
  if (in >> code && code > 0 && code < 128) return code;
  return std::nullopt;
}

// SIGKILLs the recorded ranks that still run.
void kill_recorded_ranks(const fs::path& run_dir) {
  for (pid_t pid : recorded_ranks(run_dir)) ::kill(pid, SIGKILL);
}

}  // namespace

Expected<JobReport> run_job(const JobPlan& plan, const JobOptions& o, const LineSink& sink) {
  if (plan.argv.empty()) return Error(Errc::internal, "run_job got an empty plan");
  const bool slurm = o.launcher == "slurm";
  if (!on_path(plan.argv[0]))
    return Error(Errc::unavailable, fmt::format("'{}' was not found", plan.argv[0]), "",
                 slurm ? "run inside a Slurm allocation, or use --launcher mpirun"
                       : "install Open MPI (Debian: openmpi-bin), or put its mpirun on PATH");
  for (const auto& c : plan.contexts)
    if (::access(c.argv[0].c_str(), X_OK) != 0)
      return Error(Errc::unavailable,
                   fmt::format("the worker program '{}' is not executable", c.argv[0]));
  const HostInfo host = probe_host();
  const bool root_ok = o.allow_run_as_root || (std::getenv("OMPI_ALLOW_RUN_AS_ROOT") &&
                                               std::getenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"));
  if (!slurm && host.root && !root_ok)
    return Error(Errc::unavailable, "Open MPI refuses to start ranks as root", "",
                 "pass --allow-run-as-root, or export OMPI_ALLOW_RUN_AS_ROOT=1 and "
                 "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                 "(typical in containers)");

  std::error_code ec;
  const fs::path log_dir = plan.run_dir / "logs";
  fs::create_directories(log_dir, ec);
  fs::create_directories(plan.run_dir / "pids", ec);
  std::error_code stale;
  fs::remove_all(plan.run_dir / "exits", stale);  // a rerun in the same directory starts clean
  if (ec)
    return Error(Errc::runtime, fmt::format("cannot create the run directory: {}", ec.message()),
                 plan.run_dir.string());
  HP_TRY(write_file_atomic(plan.run_dir / plan.app_file_name, plan.app_file));

  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) || ::pipe(err_pipe)) return Error(Errc::runtime, "pipe() failed");
  const auto start = Clock::now();
  // From here a SIGINT/SIGTERM is only recorded: the loop below stops the job and returns.
  const InterruptSupervision supervise;
  const pid_t hp_pid = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Error(Errc::runtime, "fork() failed");
  if (pid == 0) {
    ::setpgid(0, 0);
    // If hp dies, even by SIGKILL, mpirun gets SIGTERM and stops its ranks (docs/hardening.md,
    // "Output directories and signals"); the check closes the race with a parent that died
    // before prctl.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != hp_pid) ::_exit(127);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    for (const auto& [k, v] : plan.launcher_env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : plan.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);

  Supervisor sup{plan, sink, log_dir, {},   std::ofstream(log_dir / "mpirun.log", std::ios::app),
                 {},   -1,   {},      slurm};
  std::string out_buf, err_buf;
  bool out_open = true, err_open = true, timed_out = false;
  int term_stage = 0;
  const double grace = 5;  // mpirun's own --timeout acts first; hp steps in after this grace
  // An interrupt: the signal goes to mpirun's group at once, SIGKILL follows after kStopGrace.
  constexpr double kStopGrace = 3;
  int interrupted = 0, irq_stage = 0;
  std::size_t stopped = 0;
  Clock::time_point irq_at;
  // A failing job: once a rank has printed its error (and aborted), mpirun ends the others within
  // a second or two. Open MPI 4.1 has been seen to crash or hang in that teardown, leaving ranks
  // that hold the output pipes until --timeout; kFailGrace after the first error hp ends the job
  // itself (SIGTERM to mpirun's group, then SIGKILL to it and the recorded ranks).
  constexpr double kFailGrace = 10;
  int fail_stage = 0;
  Clock::time_point failed_at;
  while (out_open || err_open) {
    pollfd fds[2] = {{out_open ? out_pipe[0] : -1, POLLIN, 0},
                     {err_open ? err_pipe[0] : -1, POLLIN, 0}};
    int n = ::poll(fds, 2, 200);
    if (n > 0) {
      if (out_open && (fds[0].revents & (POLLIN | POLLHUP | POLLERR)))
        out_open = pump(out_pipe[0], out_buf, false, sup);
      if (err_open && (fds[1].revents & (POLLIN | POLLHUP | POLLERR)))
        err_open = pump(err_pipe[0], err_buf, true, sup);
    }
    if (const int sig = interrupted_signal(); sig != 0 && irq_stage == 0) {
      interrupted = sig;
      stopped = recorded_ranks(plan.run_dir).size();
      ::kill(-pid, sig);
      irq_at = Clock::now();
      irq_stage = 1;
    }
    if (irq_stage > 0) {
      const double since = std::chrono::duration<double>(Clock::now() - irq_at).count();
      if (irq_stage == 1 && since > kStopGrace) {
        ::kill(-pid, SIGKILL);
        kill_recorded_ranks(plan.run_dir);
        irq_stage = 2;
      } else if (irq_stage == 2 && since > kStopGrace + 2) {
        break;  // pipes held open by something we cannot kill: stop reading
      }
      continue;
    }
    if (sup.first_error_rank >= 0 && term_stage == 0) {
      if (fail_stage == 0) {
        failed_at = Clock::now();
        fail_stage = 1;
      }
      const double since = std::chrono::duration<double>(Clock::now() - failed_at).count();
      if (fail_stage == 1 && since > kFailGrace) {
        ::kill(-pid, SIGTERM);
        fail_stage = 2;
      } else if (fail_stage == 2 && since > kFailGrace + kStopGrace) {
        ::kill(-pid, SIGKILL);
        kill_recorded_ranks(plan.run_dir);
        fail_stage = 3;
      } else if (fail_stage == 3 && since > kFailGrace + kStopGrace + 2) {
        break;  // pipes held open by something we cannot kill: stop reading
      }
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (o.timeout_s > 0 && elapsed > o.timeout_s + grace && term_stage == 0) {
      timed_out = true;
      ::kill(-pid, SIGTERM);
      term_stage = 1;
    } else if (term_stage == 1 && elapsed > o.timeout_s + 2 * grace) {
      ::kill(-pid, SIGKILL);
      kill_recorded_ranks(plan.run_dir);
      term_stage = 2;
    } else if (term_stage == 2 && elapsed > o.timeout_s + 3 * grace) {
      break;  // pipes held open by something we cannot kill: stop reading
    }
  }
  ::close(out_pipe[0]);
  ::close(err_pipe[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  JobReport report;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report.ranks = plan.total_ranks;
  report.log_dir = log_dir;
  if (interrupted != 0) {
    ::kill(-pid, SIGKILL);  // whatever of mpirun's group is left
    kill_recorded_ranks(plan.run_dir);
    return Error(
        Errc::runtime,
        fmt::format("interrupted by {}; stopped {} rank{} of {} and mpirun",
                    signal_name(interrupted), stopped, stopped == 1 ? "" : "s", plan.total_ranks),
        o.recipe.string(), fmt::format("rank logs: {}/rank-N.log", log_dir.string()));
  }
  if (rc == 0 && !timed_out && sup.first_error_rank < 0) return report;
  // Ranks left over from a failed job (mpirun normally reaps them; this covers ranks it lost).
  kill_recorded_ranks(plan.run_dir);

  std::string launcher_text;
  for (const auto& l : sup.launcher_tail) launcher_text += l + "\n";
  const std::string logs_hint =
      fmt::format("rank logs: {}/rank-N.log; mpirun's messages: {}/mpirun.log", log_dir.string(),
                  log_dir.string());
  if (timed_out || rc == 110 ||
      launcher_text.find("time limit for job execution") != std::string::npos)
    return Error(Errc::runtime,
                 fmt::format("the job ran past --timeout {:g} s and was stopped", o.timeout_s),
                 o.recipe.string(), logs_hint);
  if (rc == 243 || launcher_text.find("plm_rsh_agent") != std::string::npos)
    return Error(Errc::unavailable, "mpirun found no ssh/rsh launch agent", o.recipe.string(),
                 "on one host export OMPI_MCA_plm=isolated; on a cluster install an ssh client");
  if (launcher_text.find("allow-run-as-root") != std::string::npos)
    return Error(Errc::unavailable, "Open MPI refused to start ranks as root", o.recipe.string(),
                 "pass --allow-run-as-root, or export OMPI_ALLOW_RUN_AS_ROOT=1 and "
                 "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");

  int rank = sup.first_error_rank;
  if (rank < 0) {
    static const std::regex named(R"((?:MPI_ABORT was invoked on rank|process rank) (\d+))");
    static const std::regex procname(R"(Process name: \[\[\d+,\d+\],(\d+)\])");
    std::smatch m;
    if (std::regex_search(launcher_text, m, named) || std::regex_search(launcher_text, m, procname))
      rank = std::stoi(m[1]);
  }
  // The code the failing rank recorded before aborting outranks mpirun's status, which a peer
  // killed during teardown can turn into a signal (worker_internal.h, record_rank_exit).
  const int code = recorded_exit(plan.run_dir, rank).value_or(rc);
  const std::string how = code > 128 ? fmt::format("killed by signal {}", code - 128)
                                     : fmt::format("exit code {}", code);
  if (rank < 0)
    return Error(Errc::runtime,
                 fmt::format("the job failed ({}) without naming a rank{}", how,
                             tail_of(log_dir / "mpirun.log", 12)),
                 o.recipe.string(), logs_hint);
  const fs::path log = log_dir / fmt::format("rank-{}.log", rank);
  std::string msg =
      fmt::format("rank {} (group '{}') failed first ({})", rank, plan.group_of(rank), how);
  if (!sup.first_error.empty() && sup.first_error_rank == rank)
    msg += ": " + sup.first_error.substr(11);
  msg += fmt::format("\n  last lines of {}:{}", log.string(), tail_of(log, 10));
  return Error(code > 128 ? Errc::runtime : errc_of_exit(code), msg, o.recipe.string(), logs_hint);
}

}  // namespace hp::job
