// Seeded, structure-aware mutations of TOML text for the recipe and manifest fuzz drivers
// (tests/unit/recipe/fuzz_recipe.cpp, tests/unit/shard/fuzz_manifest.cpp): byte edits, truncations,
// line deletions and duplications, and the edits the adversarial pass found dangerous (numbers
// replaced by 0, -1, 2^20+1, INT64_MAX...; strings by paths, shell syntax, line breaks). Also a
// crash reporter: the case being run is kept in a buffer that a SIGSEGV/SIGABRT handler writes to a
// file, so a crash found in an hour-long run can be replayed.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace hp::fuzz {

inline std::string mutate(const std::string& seed, std::mt19937_64& rng) {
  std::string s = seed;
  auto pick = [&](std::size_t n) { return n ? static_cast<std::size_t>(rng() % n) : 0; };
  static const char* numbers[] = {"0",
                                  "-1",
                                  "1",
                                  "2",
                                  "3",
                                  "7",
                                  "65537",
                                  "1048576",
                                  "1048577",
                                  "2147483648",
                                  "4294967297",
                                  "9223372036854775807",
                                  "-9223372036854775808",
                                  "1e308",
                                  "nan",
                                  "inf",
                                  "\"3\"",
                                  "[]",
                                  "{}"};
  static const char* strings[] = {"\"../../../x\"",
                                  "\"/etc/passwd\"",
                                  "\"a b\"",
                                  "\"x\\nname = \\\"y\\\"\"",
                                  "\"\"",
                                  "\"$(touch pwned)\"",
                                  "\"%t\"",
                                  "\"'\"",
                                  "\".hidden\"",
                                  "\"rank0.onnx/../../x\"",
                                  "\"\\u0000\"",
                                  "\"LD_PRELOAD\"",
                                  "12"};
  const int edits = 1 + static_cast<int>(pick(4));
  for (int e = 0; e < edits; ++e) {
    switch (pick(9)) {
      case 0:  // flip a byte
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(rng());
        break;
      case 1:  // truncate
        s.resize(pick(s.size() + 1));
        break;
      case 2: {  // delete a line
        std::size_t a = s.find('\n', pick(s.size()));
        if (a == std::string::npos) break;
        std::size_t b = s.find('\n', a + 1);
        s.erase(a, (b == std::string::npos ? s.size() : b) - a);
        break;
      }
      case 3: {  // duplicate a line
        std::size_t a = s.rfind('\n', pick(s.size()));
        if (a == std::string::npos) a = 0;
        std::size_t b = s.find('\n', a + 1);
        if (b == std::string::npos) break;
        s.insert(b, s.substr(a, b - a));
        break;
      }
      case 4:
      case 5: {  // a number replaced
        std::vector<std::size_t> at;
        for (std::size_t i = 0; i < s.size(); ++i)
          if (std::isdigit(static_cast<unsigned char>(s[i])) &&
              (i == 0 || !std::isalnum(static_cast<unsigned char>(s[i - 1]))))
            at.push_back(i);
        if (at.empty()) break;
        std::size_t i = at[pick(at.size())], j = i;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        s.replace(i, j - i, numbers[pick(std::size(numbers))]);
        break;
      }
      case 6:
      case 7: {  // a string value replaced
        std::vector<std::size_t> at;
        for (std::size_t i = 0; i < s.size(); ++i)
          if (s[i] == '"') at.push_back(i);
        if (at.size() < 2) break;
        std::size_t k = pick(at.size() - 1);
        s.replace(at[k], at[k + 1] - at[k] + 1, strings[pick(std::size(strings))]);
        break;
      }
      default: {  // a random byte inserted
        s.insert(pick(s.size() + 1), 1, static_cast<char>(rng()));
        break;
      }
    }
  }
  return s;
}

// The case under test, for the crash handler (a fixed buffer: the handler may not allocate).
inline char g_case[1 << 16];
inline std::size_t g_case_len = 0;
inline char g_crash_file[512] = "fuzz-crash.txt";

inline void remember(const std::string& c) {
  g_case_len = std::min(c.size(), sizeof g_case);
  std::memcpy(g_case, c.data(), g_case_len);
}

extern "C" inline void fuzz_on_crash(int sig) {
  int fd = ::open(g_crash_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ssize_t ignored = ::write(fd, g_case, g_case_len);
    (void)ignored;
    ::close(fd);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

inline void install_crash_handler(const std::string& file) {
  std::snprintf(g_crash_file, sizeof g_crash_file, "%s", file.c_str());
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, fuzz_on_crash);
}

struct Args {
  double seconds = 10;
  std::uint64_t seed = 1;
  std::string crash_file = "fuzz-crash.txt";
  std::vector<std::string> seeds;  ///< seed files
};

inline Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string w = argv[i];
    if (w == "--seconds" && i + 1 < argc)
      a.seconds = std::atof(argv[++i]);
    else if (w == "--seed" && i + 1 < argc)
      a.seed = std::strtoull(argv[++i], nullptr, 10);
    else if (w == "--crash-file" && i + 1 < argc)
      a.crash_file = argv[++i];
    else
      a.seeds.push_back(w);
  }
  return a;
}

/// Appends the contents of each seed file to `out`; false (after a message) when one is unreadable.
inline bool read_seeds(const std::vector<std::string>& files, std::vector<std::string>& out) {
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) {
      std::fprintf(stderr, "cannot read seed %s\n", f.c_str());
      return false;
    }
    out.push_back(ss.str());
  }
  return true;
}

}  // namespace hp::fuzz
