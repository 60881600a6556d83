#include "hp/core/fs.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <fnmatch.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>

#include "hp/core/interrupt.h"

namespace hp {

namespace fs = std::filesystem;

Expected<std::string> read_file(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return Error(Errc::bad_input, "is a directory, expected a file", path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Error(Errc::bad_input, std::string("cannot open: ") + std::strerror(errno),
                 path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Error(Errc::runtime, "read failed", path.string());
  return ss.str();
}

Status write_file_atomic(const fs::path& path, std::string_view contents) {
  fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Error(Errc::bad_input, "directory does not exist", dir.string());
  // The temp file lives beside the target so rename(2) stays on one filesystem and is atomic.
  std::random_device rd;
  fs::path tmp = dir / ("." + path.filename().string() + ".tmp." + std::to_string(::getpid()) +
                        "." + std::to_string(rd()));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return Error(Errc::runtime, std::string("cannot create: ") + std::strerror(errno),
                 tmp.string());
  const char* p = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Error(Errc::runtime, std::string("write failed: ") + std::strerror(err),
                   path.string());
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Error(Errc::runtime, std::string("write failed: ") + std::strerror(err), path.string());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Error(Errc::runtime, std::string("cannot rename into place: ") + std::strerror(err),
                 path.string());
  }
  return {};
}

// ---- output directories (fs.h: check_output_dir, replace_output_dir) ----

namespace {

fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path a = fs::absolute(p, ec);
  fs::path c = fs::weakly_canonical(a, ec);
  if (ec) c = a.lexically_normal();
  if (c.filename().empty()) c = c.parent_path();  // "dir/" -> "dir"
  return c;
}

// Whether `inner` is `outer` or lies inside it (both resolved).
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

struct Marker {
  bool valid = false;
  int version = 0;
  std::string writer;
  std::vector<std::string> files;
};

Marker read_marker(const fs::path& dir) {
  Marker m;
  std::ifstream in(dir / kOutputMarker);
  std::string line;
  if (!in || !std::getline(in, line)) return m;
  static const std::regex head(R"(^hp-output (\d{1,6})$)");
  std::smatch sm;
  if (!std::regex_match(line, sm, head)) return m;
  m.version = std::stoi(sm[1]);
  m.valid = true;
  while (std::getline(in, line)) {
    if (line.rfind("writer ", 0) == 0) m.writer = line.substr(7);
    if (line.rfind("file ", 0) == 0) m.files.push_back(line.substr(5));
  }
  return m;
}

Error refuse(const fs::path& target, const std::string& why, const std::string& hint) {
  return Error(Errc::bad_input, why, target.string(), hint);
}

}  // namespace

bool process_gone(long pid) {
  return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

Status check_output_dir(const fs::path& target, const OutputDirOptions& o) {
  const fs::path t = resolved(target);
  std::error_code ec;
  const fs::path cwd = resolved(fs::current_path(ec));
  if (!ec && within(cwd, t))
    return refuse(target,
                  t == cwd ? "is the working directory; hp never replaces it"
                           : "contains the working directory; hp never replaces it",
                  "give an output directory of its own, e.g. " + (target / "out").string());
  for (const auto& in : o.inputs) {
    if (in.empty()) continue;
    const fs::path i = resolved(in);
    if (within(i, t))
      return refuse(
          target,
          i == t
              ? fmt::format("is the input '{}'; hp never replaces its inputs", in.string())
              : fmt::format("contains the input '{}'; hp never replaces its inputs", in.string()),
          "give an output directory of its own");
    if (fs::is_directory(i, ec) && within(t, i))
      return refuse(target,
                    fmt::format("lies inside the input directory '{}'; hp never writes into its "
                                "inputs",
                                in.string()),
                    "give an output directory outside the inputs");
  }
  for (const auto& p : o.protect)
    if (!p.empty() && within(resolved(p), t))
      return refuse(target, fmt::format("is or contains '{}', which this run uses", p.string()),
                    "give an output directory of its own");
  const auto st = fs::symlink_status(target, ec);
  if (ec || st.type() == fs::file_type::not_found) return {};
  const std::string force_hint = "choose another directory, or pass --force to replace it";
  if (st.type() != fs::file_type::directory) {
    if (o.force) return {};
    return refuse(target, "exists and is not a directory; not replacing it", force_hint);
  }
  if (o.force) return {};
  std::vector<std::string> entries;
  for (fs::directory_iterator it(target, ec), end; !ec && it != end; it.increment(ec))
    entries.push_back(it->path().filename().string());
  if (ec)
    return Error(Errc::runtime, fmt::format("cannot list the directory: {}", ec.message()),
                 target.string());
  if (entries.empty()) return {};
  std::sort(entries.begin(), entries.end());
  const bool marked = fs::exists(target / kOutputMarker, ec);
  if (marked) {
    const Marker m = read_marker(target);
    if (!m.valid)
      return refuse(target,
                    fmt::format("its {} is not hp's marker (first line 'hp-output N'); not "
                                "replacing it",
                                kOutputMarker),
                    force_hint);
    if (m.version > kOutputMarkerVersion)
      return refuse(target,
                    fmt::format("was written by a newer hp (output format {}, this hp knows {})",
                                m.version, kOutputMarkerVersion),
                    force_hint);
    for (const auto& e : entries)
      if (e != kOutputMarker && std::find(m.files.begin(), m.files.end(), e) == m.files.end())
        return refuse(target,
                      fmt::format("holds '{}', which {} did not write; not replacing it", e,
                                  m.writer.empty() ? std::string("hp") : m.writer),
                      force_hint);
    return {};
  }
  for (const auto& e : entries) {
    bool ours = false;
    for (const auto& pat : o.legacy) ours |= ::fnmatch(pat.c_str(), e.c_str(), 0) == 0;
    if (!ours)
      return refuse(target,
                    fmt::format("is not an earlier hp output (no {} marker) and holds '{}'; not "
                                "replacing it",
                                kOutputMarker, e),
                    force_hint);
  }
  return {};
}

Status write_output_marker(const fs::path& dir, const std::string& writer) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename() != kOutputMarker) names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  std::string text = fmt::format("hp-output {}\nwriter {}\n", kOutputMarkerVersion, writer);
  for (const auto& n : names) text += "file " + n + "\n";
  return write_file_atomic(dir / kOutputMarker, text);
}

int remove_stale_temporaries(const fs::path& parent) {
  static const std::regex temp(R"(^\.(.+)\.hp-(tmp|old)-(\d{1,9})$)");
  int n = 0;
  std::error_code ec;
  std::vector<fs::path> found;
  for (fs::directory_iterator it(parent.empty() ? fs::path(".") : parent, ec), end;
       !ec && it != end; it.increment(ec))
    found.push_back(it->path());
  for (const auto& p : found) {
    const std::string name = p.filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, temp) || !process_gone(std::stol(m[3]))) continue;
    const fs::path target = p.parent_path() / m[1].str();
    if (m[2] == "old" && !fs::exists(target, ec)) {
      fs::rename(p, target, ec);  // the swap died between its renames: put the old one back
      if (!ec) ++n;
      continue;
    }
    if (fs::remove_all(p, ec) > 0 && !ec) ++n;
  }
  return n;
}

Status replace_output_dir(const fs::path& target,
                          const std::function<Status(const fs::path&)>& fill,
                          const OutputDirOptions& o) {
  HP_TRY(check_output_dir(target, o));
  fs::path abs = fs::absolute(target);
  if (abs.filename().empty()) abs = abs.parent_path();
  const fs::path parent = abs.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec || !fs::is_directory(parent, ec))
    return Error(Errc::runtime, fmt::format("cannot create the parent directory: {}", ec.message()),
                 parent.string());
  remove_stale_temporaries(parent);
  const std::string name = abs.filename().string();
  const fs::path tmp = parent / fmt::format(".{}.hp-tmp-{}", name, ::getpid());
  const fs::path old = parent / fmt::format(".{}.hp-old-{}", name, ::getpid());
  fs::remove_all(tmp, ec);
  TemporaryGuard guard_tmp(tmp);
  if (!fs::create_directory(tmp, ec) || ec)
    return Error(Errc::runtime,
                 fmt::format("cannot create a temporary directory: {}", ec.message()),
                 tmp.string());
  auto fail = [&](Error e) -> Status {
    std::error_code ignore;
    fs::remove_all(tmp, ignore);
    return e;
  };
  if (Status s = fill(tmp); !s) return fail(std::move(s).error());
  if (Status s = write_output_marker(tmp, o.writer); !s) return fail(std::move(s).error());
  const auto st = fs::symlink_status(abs, ec);
  const bool had = !ec && st.type() != fs::file_type::not_found;
  if (had) {
    fs::remove_all(old, ec);
    fs::rename(abs, old, ec);
    if (ec)
      return fail(Error(Errc::runtime,
                        fmt::format("cannot move the earlier output aside: {}", ec.message()),
                        target.string()));
  }
  // `old` is not registered for removal: a signal between the two renames must not lose it, and
  // remove_stale_temporaries puts it back on the next run.
  fs::rename(tmp, abs, ec);
  if (ec) {
    std::error_code ignore;
    if (had) fs::rename(old, abs, ignore);
    return fail(Error(Errc::runtime, fmt::format("cannot rename into place: {}", ec.message()),
                      target.string()));
  }
  if (had) fs::remove_all(old, ec);
  return {};
}

fs::path executable_dir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return fs::current_path();
  return self.parent_path();
}

}  // namespace hp
