// SIGINT, SIGTERM and SIGHUP: what hp does when it is interrupted (docs/hardening.md, "Output
// directories and signals").
//
// Two situations. Most of the time nothing of hp's runs outside this process: the handler removes
// every registered temporary directory (a half-written output, a verify scratch directory) with
// async-signal-safe calls only, prints `hp: error: interrupted by SIGTERM`, and _exit()s with the
// runtime exit code (5), since the shell's 128+N codes are not hp's documented ones. While a
// supervisor is active (run_job waiting on mpirun), the handler only records the signal: the
// supervisor forwards it to mpirun's process group, waits a bounded time, kills what is left and
// returns an error, which unwinds normally (destructors remove the temporaries).
#pragma once

#include <filesystem>

namespace hp {

/// Installs the handlers (once per process; later calls do nothing).
void install_interrupt_handlers();

/// The signal that interrupted this process, or 0.
int interrupted_signal();

/// "SIGINT", "SIGTERM", "SIGHUP" or "signal N".
const char* signal_name(int sig);

/// A directory the handler removes if the process is interrupted while the guard lives. At most
/// 64 are registered at once (more are simply not cleaned on a signal).
class TemporaryGuard {
 public:
  explicit TemporaryGuard(const std::filesystem::path& dir);
  ~TemporaryGuard();
  TemporaryGuard(const TemporaryGuard&) = delete;
  TemporaryGuard& operator=(const TemporaryGuard&) = delete;

 private:
  int slot_ = -1;
};

/// While one lives, a signal is only recorded (interrupted_signal()); the holder must notice it
/// and stop its children within a bounded time.
class InterruptSupervision {
 public:
  InterruptSupervision();
  ~InterruptSupervision();
  InterruptSupervision(const InterruptSupervision&) = delete;
  InterruptSupervision& operator=(const InterruptSupervision&) = delete;
};

/// Removes a directory tree with async-signal-safe calls only (open, getdents64, unlinkat); used by
/// the handler, exposed for tests. Gives up below 32 levels. True when `path` is gone.
bool remove_tree_signal_safe(const char* path);

/// Starts a thread that _exit()s the process with the runtime code when its parent process changes
/// (the parent died: a rank whose mpirun or orted was killed must not run on alone).
void start_parent_watchdog();

}  // namespace hp
