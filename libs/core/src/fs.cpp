#include "hp/core/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

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

fs::path executable_dir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return fs::current_path();
  return self.parent_path();
}

}  // namespace hp
