// libonnx's shape inference, run where its crashes cannot take hp down.
//
// ONNX's per-op inference functions trust the graph: a graph input declared with a higher rank than
// the graph's shape arithmetic assumes, once hp pins the resulting shape values as constants, sends
// one of them past the end of a vector and the process dies with SIGSEGV inside libonnx, where no
// exception handler can catch it. Validating every op's preconditions ourselves would mean
// re-implementing ONNX's inference. Instead each round runs in a forked child: the child infers on
// its copy-on-write copy of the model and writes the result back through a pipe; a child killed
// by a signal (or exceeding kTimeoutSeconds) becomes an error value naming the model. A fork costs
// about a millisecond against the tens of milliseconds an inference round takes. Only a process
// with one thread forks (see infer_shapes_isolated).
#include <onnx/shape_inference/implementation.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/core.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>

#include "shape_infer.h"

namespace hp::model {
namespace {

constexpr int kTimeoutSeconds = 300;

// Child side: infer, then "ok" + the serialized model, or "er" + the exception's message.
[[noreturn]] void child_infer(onnx::ModelProto& copy, const onnx::ShapeInferenceOptions& options,
                              int fd) {
  std::string out;
  try {
    onnx::shape_inference::InferShapes(copy, onnx::OpSchemaRegistry::Instance(), options);
    out = "ok" + copy.SerializeAsString();
  } catch (const std::exception& e) {
    out = std::string("er") + e.what();
  }
  const char* p = out.data();
  std::size_t left = out.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(3);
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  ::_exit(0);
}

// Threads of this process (/proc/self/task), 0 when unreadable.
int thread_count() {
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it("/proc/self/task", ec), end; !ec && it != end;
       it.increment(ec))
    ++n;
  return ec ? 0 : n;
}

}  // namespace

std::mutex& onnx_registry_mutex() {
  static std::mutex mu;
  return mu;
}

Status infer_shapes_isolated(onnx::ModelProto& copy, const onnx::ShapeInferenceOptions& options,
                             const std::string& where) {
  // A forked child holds only the forking thread: a lock another thread held at the fork (inside
  // protobuf, libonnx or the allocator) stays locked there forever. So the child is used only while
  // this process has one thread, as every hp command has while it loads its model; the ranks of
  // `verify --simulate` (threads) and MPI ranks (Open MPI's own threads) load models the parent
  // command already loaded through this path, and infer in place.
  if (thread_count() != 1) {
    try {
      const std::lock_guard<std::mutex> lock(onnx_registry_mutex());
      onnx::shape_inference::InferShapes(copy, onnx::OpSchemaRegistry::Instance(), options);
    } catch (const std::exception& e) {
      return Error(Errc::bad_input, fmt::format("shape inference failed: {}", e.what()), where);
    }
    return Status::success();
  }
  (void)onnx::OpSchemaRegistry::Instance();  // static registration done before the fork
  int fds[2];
  if (::pipe(fds) != 0)
    return Error(Errc::runtime, fmt::format("pipe: {}", std::strerror(errno)), where);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return Error(Errc::runtime, fmt::format("fork: {}", std::strerror(errno)), where);
  }
  if (pid == 0) {
    ::close(fds[0]);
    child_infer(copy, options, fds[1]);
  }
  ::close(fds[1]);
  std::string bytes;
  char buf[65536];
  bool timed_out = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(kTimeoutSeconds);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      timed_out = r == 0;
      break;
    }
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    bytes.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    return Error(Errc::bad_input,
                 fmt::format("shape inference did not finish in {} s", kTimeoutSeconds), where);
  if (WIFSIGNALED(status))
    return Error(
        Errc::bad_input,
        fmt::format("shape inference crashed (signal {}, {}) on this model: a graph input, "
                    "op or attribute contradicts how the graph uses it",
                    WTERMSIG(status), ::strsignal(WTERMSIG(status))),
        where, "run onnx.checker.check_model(model, full_check=True) on it");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || bytes.size() < 2)
    return Error(Errc::runtime, "shape inference's worker process failed", where);
  if (bytes.compare(0, 2, "er") == 0)
    return Error(Errc::bad_input, fmt::format("shape inference failed: {}", bytes.substr(2)),
                 where);
  if (!copy.ParseFromArray(bytes.data() + 2, static_cast<int>(bytes.size() - 2)))
    return Error(Errc::runtime, "shape inference's result does not parse", where);
  return Status::success();
}

}  // namespace hp::model
