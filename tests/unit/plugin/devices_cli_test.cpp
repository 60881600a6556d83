// `hp devices` end to end against the fake plugins (whose build paths the shell-based CLI runner
// has no substitution for): each rejection reason reaches the user on stdout, and the exit code is
// 0 while the cpu plugin loads, 7 when nothing does.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include "plugin_test_util.h"

namespace {

struct Run {
  int rc = -1;
  std::string out;
};

Run run_hp(const std::string& args, const std::string& env = "") {
  Run r;
  std::string cmd =
      std::string("env -u HP_PLUGIN_PATH ") + env + " " + HP_EXE + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

}  // namespace

TEST_CASE("hp devices: a wrong-ABI plugin named by --plugin-path is an error at the file (exit 3)",
          "[plugin][cli]") {
  auto file = hp_test::fake_plugin("fakeabi2").string();
  auto r = run_hp("devices --plugin-path " + file);
  INFO(r.out);
  CHECK(r.rc == 3);
  CHECK_THAT(r.out,
             Catch::Contains(
                 "hp: error: " + file +
                 ": wrong abi: plugin libhp-backend-fakeabi2.so implements ABI 2, hp supports 1"));
  CHECK_THAT(r.out, Catch::Contains("cpu 0.1.0"));  // the listing is still printed
}

TEST_CASE("hp devices: a named plugin whose runtime is missing exits 7", "[plugin][cli]") {
  auto file = hp_test::fake_plugin("fakeunavailable").string();
  auto r = run_hp("devices --plugin-path " + file);
  INFO(r.out);
  CHECK(r.rc == 7);
  CHECK_THAT(r.out, Catch::Contains("hp: error: " + file +
                                    ": unavailable: fakeunavailable: fake runtime not found"));
}

TEST_CASE("hp devices: the fake plugin dir shows every rejection reason", "[plugin][cli]") {
  auto r = run_hp(std::string("devices --plugin-path ") + HP_FAKE_PLUGIN_DIR);
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("not an hp backend, or an unsupported ABI"));
  CHECK_THAT(r.out, Catch::Contains("mandatory member 'gemm' is null"));
  CHECK_THAT(r.out, Catch::Contains("libhpfakevendor.so: cannot open shared object file"));
  CHECK_THAT(r.out, Catch::Contains("fakenodevices plugin reports no devices"));
  CHECK_THAT(r.out, Catch::Contains("fakegood 9.9.9 (abi 1.3)"));
  CHECK_THAT(r.out, Catch::Contains("fakeold 9.9.9 (abi 1.0)"));
}

TEST_CASE("hp devices: -v --json includes the paths tried", "[plugin][cli]") {
  auto r = run_hp(std::string("-v devices --json --plugin-path ") +
                  hp_test::fake_plugin("notbackend").string());
  INFO(r.out);
  CHECK(r.rc == 3);
  CHECK_THAT(r.out, Catch::Contains("\"trace\""));
  CHECK_THAT(r.out, Catch::Contains("\"verdict\": \"not an hp backend\""));
  CHECK_THAT(r.out, Catch::Contains(HP_BUILD_PLUGIN_DIR));
}

TEST_CASE("hp devices: a --plugin-path that does not exist is bad input (exit 3)",
          "[plugin][cli]") {
  auto r = run_hp("devices --plugin-path /no/such/dir");
  INFO(r.out);
  CHECK(r.rc == 3);
  CHECK_THAT(r.out, Catch::Contains("hp: error: /no/such/dir: no such plugin file or directory"));
}

TEST_CASE("hp devices: explains why cuda is unavailable without a driver", "[plugin][cli]") {
  if (!std::filesystem::exists(std::filesystem::path(HP_BUILD_PLUGIN_DIR) /
                               "libhp-backend-cuda.so")) {
    WARN("cuda plugin not built (no CUDA toolkit), nothing to check");
    return;
  }
  auto r = run_hp("devices", "HP_CUDA_DRIVER_LIB=/nonexistent/libcuda.so.1");
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains(
                        "unavailable: cuda: NVIDIA driver not found (/nonexistent/libcuda.so.1: "
                        "/nonexistent/libcuda.so.1: cannot open shared object file"));
}

TEST_CASE("hp devices: on this machine every built plugin is either listed or explained",
          "[plugin][cli]") {
  auto r = run_hp("devices");
  INFO(r.out);
  CHECK(r.rc == 0);
  for (const char* name : {"cuda", "ascend"}) {
    if (!std::filesystem::exists(std::filesystem::path(HP_BUILD_PLUGIN_DIR) /
                                 ("libhp-backend-" + std::string(name) + ".so")))
      continue;
    bool listed = r.out.find(std::string("  ") + name + " 0.1.0 (abi") != std::string::npos;
    bool explained = r.out.find(std::string("unavailable: ") + name + ": ") != std::string::npos ||
                     r.out.find(std::string("no devices: ") + name) != std::string::npos;
    INFO(name);
    CHECK((listed || explained));
  }
}
