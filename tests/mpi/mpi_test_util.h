// Shared by the tests that start real MPI jobs through the hp executable (HP_EXE): a temporary
// directory, running hp and capturing its output and exit code, comparing f32 tensor files, and
// checking that no rank process outlived its job.
#pragma once

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "hp/exec/tensor.h"

namespace mpi_test {

namespace fs = std::filesystem;

/// A fresh directory under the temp dir (hp_mpi_<prefix>_<name>_<pid>), removed on scope exit.
struct TempDir {
  fs::path path;
  TempDir(const std::string& prefix, const std::string& name) {
    path = fs::temp_directory_path() /
           ("hp_mpi_" + prefix + "_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

struct Run {
  int rc = -1;
  std::string out;  ///< stdout and stderr together
  double seconds = 0;
};

/// Runs `hp ARGS` (a shell word list) with no stdin.
inline Run run_hp(const std::string& args) {
  Run r;
  const auto start = std::chrono::steady_clock::now();
  std::string cmd = std::string(HP_EXE) + " " + args + " 2>&1 </dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) r.out += buf;
  const int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

/// Max |a - b| of two f32 tensor files of the same shape.
inline double max_abs_diff(const fs::path& a, const fs::path& b) {
  auto x = hp::exec::read_tensor_file(a), y = hp::exec::read_tensor_file(b);
  REQUIRE(x.ok());
  REQUIRE(y.ok());
  REQUIRE(x->dims == y->dims);
  double d = 0;
  for (std::int64_t i = 0; i < x->numel(); ++i)
    d = std::max(d, std::fabs(double(x->as<float>()[i]) - y->as<float>()[i]));
  return d;
}

// True when no process recorded under RUN/pids is still alive (zombies of our own children aside).
inline bool no_rank_left(const fs::path& run) {
  for (int tries = 0; tries < 50; ++tries) {
    bool alive = false;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(run / "pids", ec)) {
      std::ifstream in(e.path());
      long pid = 0;
      if (in >> pid && ::kill(static_cast<pid_t>(pid), 0) == 0) {
        std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
        std::string s;
        std::getline(stat, s);
        const auto close = s.rfind(')');
        if (close == std::string::npos || s.substr(close + 2, 1) != "Z") alive = true;
      }
    }
    if (!alive) return true;
    ::usleep(100 * 1000);
  }
  return false;
}

}  // namespace mpi_test
