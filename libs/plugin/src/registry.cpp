// Plugin discovery and loading (see registry.h for the search order).
//
// Every outcome is data: a candidate that fails at any step becomes a PluginRecord with a Verdict
// and the reason in words, and every path looked at goes into the trace, because "why was my
// backend not picked up" is the commonest question a plugin system gets (ggml hides this in release
// builds; we never do). The steps follow the loader rules (docs/architecture.md, "The plugin
// boundary"): dlopen with RTLD_NOW|RTLD_LOCAL and the dlerror text verbatim; the entry symbol for
// our major, with a look for other majors to say which ABI a file implements; the major check; the
// mandatory members of ABI 1.0; probe; open; devices.
#include "hp/plugin/registry.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "hp/core/fs.h"
#include "load_steps.h"

namespace hp::plugin {

namespace fs = std::filesystem;

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::loaded: return "loaded";
    case Verdict::not_library: return "not a shared library";
    case Verdict::not_backend: return "not an hp backend";
    case Verdict::abi_mismatch: return "wrong abi";
    case Verdict::bad_table: return "malformed table";
    case Verdict::unavailable: return "unavailable";
    case Verdict::open_failed: return "open failed";
    case Verdict::no_devices: return "no devices";
    case Verdict::crashed: return "crashed";
  }
  return "?";
}

std::vector<std::pair<fs::path, std::string>> search_dirs(const SearchOptions& opts) {
  std::vector<std::pair<fs::path, std::string>> dirs;
  for (const auto& p : opts.plugin_paths) dirs.emplace_back(p, "--plugin-path");
  if (opts.use_env) {
    if (const char* env = std::getenv("HP_PLUGIN_PATH")) {
      std::string list = env;
      std::size_t start = 0;
      while (start <= list.size()) {
        std::size_t end = list.find(':', start);
        if (end == std::string::npos) end = list.size();
        if (end > start) dirs.emplace_back(list.substr(start, end - start), "HP_PLUGIN_PATH");
        start = end + 1;
      }
    }
  }
  bool installed = false;
  if (opts.use_install_dir) {
#ifdef HP_INSTALL_PLUGIN_DIR
    fs::path rel = HP_INSTALL_PLUGIN_DIR;
#else
    fs::path rel = "lib/hp/plugins";
#endif
    fs::path dir = (executable_dir() / ".." / rel).lexically_normal();
    std::error_code ec;
    installed = fs::is_directory(dir, ec);
    dirs.emplace_back(dir, "install dir");
  }
  if (opts.use_build_dir) {
    if (!opts.build_dir.empty()) {
      dirs.emplace_back(opts.build_dir, "build tree");
    } else if (!installed) {
      // The compiled-in build tree is for an hp run from its build directory; an installed hp (or
      // an unpacked .deb) must not pick up plugins of whatever tree it was once built in.
#ifdef HP_BUILD_PLUGIN_DIR
      dirs.emplace_back(fs::path(HP_BUILD_PLUGIN_DIR), "build tree");
#endif
    }
  }
  return dirs;
}

namespace {

constexpr std::string_view kPrefix = "libhp-backend-";
constexpr std::string_view kSuffix = ".so";

/// "cpu" for ".../libhp-backend-cpu.so", "" when the name does not follow the convention.
std::string name_from_file(const fs::path& file) {
  std::string f = file.filename().string();
  if (f.size() <= kPrefix.size() + kSuffix.size() || f.rfind(kPrefix, 0) != 0 ||
      f.compare(f.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return {};
  return f.substr(kPrefix.size(), f.size() - kPrefix.size() - kSuffix.size());
}

/// Candidate files of one directory, sorted by name so runs are reproducible.
std::vector<fs::path> candidates_in(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (!name_from_file(it->path()).empty()) files.push_back(it->path());
  std::sort(files.begin(), files.end());
  return files;
}

// Runs the load steps in a child process; a non-empty reason when the child did not come back
// (killed by a signal, or exited on its own from inside the plugin).
std::string crash_in_child(const fs::path& file, const std::vector<std::string>& open_options) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return {};  // cannot isolate: load in-process as before
  if (pid == 0) {
    PluginRecord rec;
    rec.path = file;
    detail::run_load_steps(rec, open_options);
    ::_exit(0);  // without atexit handlers or the plugin's destructors: only the steps count
  }
  // A plugin whose loading never ends (a driver waiting for a device) must not hang hp: the child
  // gets HP_PLUGIN_PROBE_TIMEOUT seconds (default 30: a GPU driver's first initialisation takes a
  // few), then is killed and the plugin listed as hanging.
  double limit = 30;
  if (const char* v = std::getenv("HP_PLUGIN_PROBE_TIMEOUT")) {
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    if (end != v && *end == '\0' && x > 0 && x < 86400) limit = x;
  }
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return fmt::format(
          "the process trying it did not finish within {:g} s and was killed (a "
          "plugin that hangs while loading; HP_PLUGIN_PROBE_TIMEOUT sets the limit)",
          limit);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFSIGNALED(status))
    return fmt::format("the process trying it was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    return fmt::format("the plugin ended the process trying it (exit status {})",
                       WEXITSTATUS(status));
  return {};
}

bool wanted(const SearchOptions& opts, const std::string& name) {
  return opts.only.empty() ||
         std::find(opts.only.begin(), opts.only.end(), name) != opts.only.end();
}

PluginRecord try_plugin(const fs::path& file, const std::string& origin, const SearchOptions& opts,
                        std::vector<std::string>& trace) {
  if (opts.isolate) {
    if (std::string why = crash_in_child(file, opts.open_options); !why.empty()) {
      PluginRecord rec;
      rec.path = file;
      rec.origin = origin;
      rec.name = name_from_file(file);
      if (rec.name.empty()) rec.name = file.stem().string();
      rec.verdict = Verdict::crashed;
      rec.reason = why;
      trace.push_back(fmt::format("  try {} (in a child process)", file.string()));
      trace.push_back(fmt::format("    rejected ({}): {}", verdict_name(rec.verdict), rec.reason));
      return rec;
    }
  }
  return load_plugin(file, origin, opts.open_options, trace);
}

}  // namespace

PluginRecord load_plugin(const fs::path& file, const std::string& origin,
                         const std::vector<std::string>& open_options,
                         std::vector<std::string>& trace) {
  PluginRecord rec;
  rec.path = file;
  rec.origin = origin;
  rec.name = name_from_file(file);
  if (rec.name.empty()) rec.name = file.stem().string();
  trace.push_back(fmt::format("  try {}", file.string()));
  detail::run_load_steps(rec, open_options);
  if (rec.ok())
    trace.push_back(fmt::format("    loaded '{}' {} (abi {}.{}), {} device(s)", rec.name,
                                rec.version, rec.abi_major, rec.abi_minor, rec.devices.size()));
  else
    trace.push_back(fmt::format("    rejected ({}): {}", verdict_name(rec.verdict), rec.reason));
  return rec;
}

Expected<Registry> discover(const SearchOptions& opts) {
  Registry reg;
  std::set<std::string> loaded_names;
  std::set<fs::path> seen_dirs;
  for (const auto& [dir, origin] : search_dirs(opts)) {
    std::error_code ec;
    bool explicit_path = origin == "--plugin-path";
    if (explicit_path && fs::is_regular_file(dir, ec)) {
      // A plugin file named directly is tried whatever it is called.
      reg.trace.push_back(fmt::format("search {} ({})", dir.string(), origin));
      PluginRecord rec = try_plugin(dir, origin, opts, reg.trace);
      rec.named = true;
      if (rec.ok()) loaded_names.insert(rec.name);
      reg.plugins.push_back(std::move(rec));
      continue;
    }
    if (!fs::is_directory(dir, ec)) {
      if (explicit_path)
        return Error(Errc::bad_input, "no such plugin file or directory", dir.string(),
                     "--plugin-path takes a directory holding libhp-backend-<name>.so files, or "
                     "one such file");
      reg.trace.push_back(fmt::format("search {} ({}): no such directory", dir.string(), origin));
      continue;
    }
    fs::path canon = fs::weakly_canonical(dir, ec);
    if (!seen_dirs.insert(canon).second) {
      reg.trace.push_back(fmt::format("search {} ({}): already searched", dir.string(), origin));
      continue;
    }
    auto files = candidates_in(dir);
    reg.trace.push_back(
        fmt::format("search {} ({}): {} candidate(s)", dir.string(), origin, files.size()));
    for (const auto& file : files) {
      std::string name = name_from_file(file);
      if (loaded_names.count(name)) {
        reg.trace.push_back(fmt::format("  skip {}: '{}' already loaded from an earlier path",
                                        file.string(), name));
        continue;
      }
      if (!wanted(opts, name)) {
        reg.trace.push_back(
            fmt::format("  skip {}: '{}' is not needed by this run", file.string(), name));
        continue;
      }
      PluginRecord rec = try_plugin(file, origin, opts, reg.trace);
      if (rec.ok()) loaded_names.insert(rec.name);
      reg.plugins.push_back(std::move(rec));
    }
  }
  return reg;
}

std::vector<std::shared_ptr<Backend>> Registry::loaded() const {
  std::vector<const PluginRecord*> recs;
  for (const auto& r : plugins)
    if (r.ok()) recs.push_back(&r);
  // Best probe score first; cpu last whatever its score, since it is the fallback for everything.
  std::stable_sort(recs.begin(), recs.end(), [](const PluginRecord* a, const PluginRecord* b) {
    bool a_cpu = a->name == "cpu", b_cpu = b->name == "cpu";
    if (a_cpu != b_cpu) return b_cpu;
    return a->probe_score > b->probe_score;
  });
  std::vector<std::shared_ptr<Backend>> out;
  for (const auto* r : recs) out.push_back(r->backend);
  return out;
}

std::shared_ptr<Backend> Registry::find(const std::string& name) const {
  for (const auto& r : plugins)
    if (r.ok() && r.name == name) return r.backend;
  return nullptr;
}

const PluginRecord* Registry::record(const std::string& name) const {
  const PluginRecord* found = nullptr;
  for (const auto& r : plugins) {
    if (r.name != name) continue;
    if (r.ok()) return &r;
    if (!found) found = &r;
  }
  return found;
}

}  // namespace hp::plugin
