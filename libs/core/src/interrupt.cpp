// The interrupt handlers (interrupt.h). Everything the handler itself touches is a fixed-size
// static table of path slots and atomics: no allocation, no locks, only async-signal-safe calls
// (open, getdents64, unlinkat, write, _exit), since a signal may arrive inside malloc.
#include "hp/core/interrupt.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "hp/core/exit_code.h"

namespace hp {
namespace {

constexpr int kSlots = 64;
constexpr std::size_t kPathMax = 4096;

struct Slot {
  std::atomic<int> state{0};  // 0 free, 1 being written, 2 registered
  char path[kPathMax];
};
Slot g_slots[kSlots];
std::atomic<int> g_signal{0};
std::atomic<int> g_supervisors{0};
std::atomic<bool> g_installed{false};

void write_all(int fd, const char* s) {
  std::size_t n = std::strlen(s);
  while (n > 0) {
    ssize_t w = ::write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

struct LinuxDirent64 {
  ino64_t d_ino;
  off64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

// Empties the directory open as `fd` (and closes it). Unlinking while reading may make getdents
// skip entries, so it reads again from the start until a pass finds nothing or removes nothing.
void empty_dir(int fd, int depth) {
  alignas(8) char buf[2048];
  for (int pass = 0; pass < 64; ++pass) {
    ::lseek(fd, 0, SEEK_SET);
    bool any = false, removed = false;
    for (;;) {
      const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        const auto* d = reinterpret_cast<const LinuxDirent64*>(buf + off);
        off += d->d_reclen;
        const char* name = d->d_name;
        if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
        any = true;
        if (::unlinkat(fd, name, 0) == 0) {
          removed = true;
          continue;
        }
        if (errno != EISDIR && errno != EPERM) continue;
        if (depth < 32) {
          const int sub = ::openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
          if (sub >= 0) empty_dir(sub, depth + 1);
        }
        if (::unlinkat(fd, name, AT_REMOVEDIR) == 0) removed = true;
      }
    }
    if (!any || !removed) break;
  }
  ::close(fd);
}

void clean_all() {
  for (auto& s : g_slots)
    if (s.state.load() == 2) remove_tree_signal_safe(s.path);
}

void on_signal(int sig) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
  if (g_supervisors.load() > 0) return;  // the supervisor stops its children and unwinds
  clean_all();
  write_all(2, "hp: error: interrupted by ");
  write_all(2, signal_name(sig));
  write_all(2, "\n");
  ::_exit(static_cast<int>(ExitCode::runtime));
}

}  // namespace

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGKILL: return "SIGKILL";
    default: return "a signal";
  }
}

bool remove_tree_signal_safe(const char* path) {
  if (::unlink(path) == 0) return true;
  int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  empty_dir(fd, 0);
  return ::rmdir(path) == 0 || errno == ENOENT;
}

void install_interrupt_handlers() {
  if (g_installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

int interrupted_signal() { return g_signal.load(); }

TemporaryGuard::TemporaryGuard(const std::filesystem::path& dir) {
  const std::string p = std::filesystem::absolute(dir).string();
  if (p.size() >= kPathMax) return;
  for (int k = 0; k < kSlots; ++k) {
    int free = 0;
    if (!g_slots[k].state.compare_exchange_strong(free, 1)) continue;
    std::memcpy(g_slots[k].path, p.c_str(), p.size() + 1);
    g_slots[k].state.store(2);
    slot_ = k;
    return;
  }
}

TemporaryGuard::~TemporaryGuard() {
  if (slot_ >= 0) g_slots[slot_].state.store(0);
}

InterruptSupervision::InterruptSupervision() { g_supervisors.fetch_add(1); }
InterruptSupervision::~InterruptSupervision() { g_supervisors.fetch_sub(1); }

void start_parent_watchdog() {
  const pid_t parent = ::getppid();
  std::thread([parent] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      if (::getppid() != parent) {
        clean_all();
        write_all(2, "hp: error: the launcher (this rank's parent process) is gone; stopping\n");
        ::_exit(static_cast<int>(ExitCode::runtime));
      }
    }
  }).detach();
}

}  // namespace hp
