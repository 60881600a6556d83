// replace_output_dir and its rules (hp/core/fs.h): what hp may replace (absent, empty, its own
// marked output), what it refuses (foreign entries, bad markers, inputs, the working directory),
// that a refusal and a failed fill leave the target untouched, stale temporaries of dead
// processes, and the signal-safe tree removal the interrupt handler uses.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "hp/core/fs.h"
#include "hp/core/interrupt.h"

namespace fs = std::filesystem;
using hp::OutputDirOptions;
using hp::Status;

namespace {

struct Scratch {
  fs::path path;
  explicit Scratch(const std::string& name) {
    path = fs::temp_directory_path() / ("hp_outdir_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() { fs::remove_all(path); }
};

void put(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
std::string get(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Status write_one(const fs::path& target, const std::string& text, const OutputDirOptions& o) {
  return hp::replace_output_dir(
      target,
      [&](const fs::path& tmp) -> Status {
        put(tmp / "out.txt", text);
        return {};
      },
      o);
}

OutputDirOptions opts() { return OutputDirOptions{"test", {}, {}, {}, false}; }

// A PID that is certainly gone: a child that exited and was reaped.
long dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return pid;
}

}  // namespace

TEST_CASE("output dir: a new target is written with a marker listing what hp wrote", "[core][fs]") {
  Scratch s("new");
  REQUIRE(write_one(s.path / "out", "1", opts()).ok());
  CHECK(get(s.path / "out" / "out.txt") == "1");
  const std::string marker = get(s.path / "out" / hp::kOutputMarker);
  CHECK(marker.rfind("hp-output 1\n", 0) == 0);
  CHECK(marker.find("writer test\n") != std::string::npos);
  CHECK(marker.find("file out.txt\n") != std::string::npos);
  // Nothing but the target is left beside it.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(s.path)) entries += e.exists();
  CHECK(entries == 1);
}

TEST_CASE("output dir: hp's own earlier output and an empty directory are replaced", "[core][fs]") {
  Scratch s("own");
  REQUIRE(write_one(s.path / "out", "1", opts()).ok());
  REQUIRE(write_one(s.path / "out", "2", opts()).ok());
  CHECK(get(s.path / "out" / "out.txt") == "2");
  fs::create_directories(s.path / "empty");
  CHECK(write_one(s.path / "empty", "3", opts()).ok());
}

TEST_CASE("output dir: a foreign entry is refused by name and left intact; --force replaces it",
          "[core][fs]") {
  Scratch s("foreign");
  REQUIRE(write_one(s.path / "out", "1", opts()).ok());
  put(s.path / "out" / "notes.txt", "mine");
  Status st = write_one(s.path / "out", "2", opts());
  REQUIRE(!st.ok());
  CHECK(st.error().code == hp::Errc::bad_input);
  CHECK(st.error().what.message.find("'notes.txt'") != std::string::npos);
  CHECK(get(s.path / "out" / "notes.txt") == "mine");
  CHECK(get(s.path / "out" / "out.txt") == "1");
  // A directory without a marker is the user's too, whatever it holds.
  fs::create_directories(s.path / "plain");
  put(s.path / "plain" / "manifest.toml", "x");
  CHECK(!write_one(s.path / "plain", "2", opts()).ok());
  CHECK(fs::exists(s.path / "plain" / "manifest.toml"));
  auto f = opts();
  f.force = true;
  REQUIRE(write_one(s.path / "out", "2", f).ok());
  CHECK(!fs::exists(s.path / "out" / "notes.txt"));
  CHECK(get(s.path / "out" / "out.txt") == "2");
}

TEST_CASE("output dir: a marker that is not hp's or from a newer hp is refused", "[core][fs]") {
  Scratch s("marker");
  fs::create_directories(s.path / "out");
  put(s.path / "out" / hp::kOutputMarker, "something else\n");
  CHECK(!write_one(s.path / "out", "1", opts()).ok());
  put(s.path / "out" / hp::kOutputMarker, "hp-output 999\n");
  Status st = write_one(s.path / "out", "1", opts());
  REQUIRE(!st.ok());
  CHECK(st.error().what.message.find("newer hp") != std::string::npos);
  put(s.path / "out" / hp::kOutputMarker, "");
  CHECK(!write_one(s.path / "out", "1", opts()).ok());
}

TEST_CASE("output dir: legacy patterns recognise a marker-less earlier output", "[core][fs]") {
  Scratch s("legacy");
  fs::create_directories(s.path / "out");
  put(s.path / "out" / "output_0.pb", "x");
  auto o = opts();
  o.legacy = {"output_*.pb"};
  CHECK(write_one(s.path / "out", "1", o).ok());
  fs::remove_all(s.path / "out");
  fs::create_directories(s.path / "out");
  put(s.path / "out" / "output_0.pb", "x");
  put(s.path / "out" / "README", "x");
  CHECK(!write_one(s.path / "out", "1", o).ok());
}

TEST_CASE("output dir: inputs, the working directory and protected paths are never replaced",
          "[core][fs]") {
  Scratch s("inputs");
  fs::create_directories(s.path / "in" / "sub");
  put(s.path / "in" / "input_0.pb", "x");
  put(s.path / "model.onnx", "m");
  auto o = opts();
  o.force = true;  // none of these is lifted by --force
  o.inputs = {s.path / "in", s.path / "model.onnx"};
  Status is = write_one(s.path / "in", "1", o);
  REQUIRE(!is.ok());
  CHECK(is.error().what.message.find("is the input") != std::string::npos);
  Status contains = write_one(s.path, "1", o);
  REQUIRE(!contains.ok());
  CHECK(contains.error().what.message.find("contains the input") != std::string::npos);
  Status inside = write_one(s.path / "in" / "sub", "1", o);
  REQUIRE(!inside.ok());
  CHECK(inside.error().what.message.find("inside the input") != std::string::npos);
  // The same directory spelt differently is still the input.
  CHECK(!write_one(s.path / "in" / "sub" / "..", "1", o).ok());
  CHECK(get(s.path / "in" / "input_0.pb") == "x");
  const fs::path cwd = fs::current_path();
  fs::current_path(s.path / "in" / "sub");
  auto plain = opts();
  plain.force = true;
  Status dot = write_one(".", "1", plain);
  Status parent = write_one("..", "1", plain);
  fs::current_path(cwd);
  REQUIRE(!dot.ok());
  CHECK(dot.error().what.message.find("is the working directory") != std::string::npos);
  CHECK(!parent.ok());
  auto p = opts();
  p.protect = {s.path / "run" / "logs"};
  fs::create_directories(s.path / "run" / "logs");
  CHECK(!write_one(s.path / "run", "1", p).ok());
  CHECK(write_one(s.path / "run" / "outputs", "1", p).ok());
}

TEST_CASE("output dir: a failed fill leaves the old content and no temporary", "[core][fs]") {
  Scratch s("fail");
  REQUIRE(write_one(s.path / "out", "1", opts()).ok());
  Status st = hp::replace_output_dir(
      s.path / "out",
      [](const fs::path& tmp) -> Status {
        put(tmp / "half.txt", "half");
        return hp::Error(hp::Errc::runtime, "disk full");
      },
      opts());
  CHECK(!st.ok());
  CHECK(get(s.path / "out" / "out.txt") == "1");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(s.path)) entries += e.exists();
  CHECK(entries == 1);
}

TEST_CASE("output dir: stale temporaries of dead processes go, live ones stay", "[core][fs]") {
  Scratch s("stale");
  const long dead = dead_pid();
  fs::create_directories(s.path / (".out.hp-tmp-" + std::to_string(dead)) / "deep");
  put(s.path / (".out.hp-tmp-" + std::to_string(dead)) / "deep" / "x", "x");
  const fs::path live = s.path / (".out.hp-tmp-" + std::to_string(::getpid()));
  fs::create_directories(live);
  // An aside copy whose target is missing (a swap that died between its renames) comes back.
  fs::create_directories(s.path / (".ckpt.hp-old-" + std::to_string(dead)));
  put(s.path / (".ckpt.hp-old-" + std::to_string(dead)) / "state.json", "{}");
  put(s.path / ".notes.hp-tmp-x", "not a pid");
  CHECK(hp::remove_stale_temporaries(s.path) == 2);
  CHECK(!fs::exists(s.path / (".out.hp-tmp-" + std::to_string(dead))));
  CHECK(fs::exists(live));
  CHECK(get(s.path / "ckpt" / "state.json") == "{}");
  CHECK(fs::exists(s.path / ".notes.hp-tmp-x"));
  // replace_output_dir sweeps the parent it writes into.
  fs::remove_all(live);
  fs::create_directories(s.path / (".other.hp-tmp-" + std::to_string(dead)));
  REQUIRE(write_one(s.path / "out", "1", opts()).ok());
  CHECK(!fs::exists(s.path / (".other.hp-tmp-" + std::to_string(dead))));
}

TEST_CASE("output dir: the signal-safe removal empties nested trees", "[core][fs]") {
  Scratch s("tree");
  fs::path deep = s.path / "t";
  for (int k = 0; k < 6; ++k) {
    deep /= "d" + std::to_string(k);
    fs::create_directories(deep);
    for (int f = 0; f < 40; ++f) put(deep / ("file-with-a-long-name-" + std::to_string(f)), "x");
  }
  fs::create_symlink(s.path / "keep", s.path / "t" / "link");
  put(s.path / "keep", "kept");
  CHECK(hp::remove_tree_signal_safe((s.path / "t").c_str()));
  CHECK(!fs::exists(s.path / "t"));
  CHECK(get(s.path / "keep") == "kept");  // a symlink is removed, never followed
  CHECK(hp::remove_tree_signal_safe((s.path / "absent").c_str()));
}
