// The ascend plugin's own outcomes, against the fake CANN runtime: each way CANN can be missing or
// unusable gives the documented code and a message naming what was tried, and the SoC table figures
// arrive with provenance. The plugin caches a successfully loaded runtime for the process, so the
// cases run in this order: failures to load first, then runtime knobs.
#include <catch2/catch.hpp>

#include "hp/plugin/registry.h"
#include "plugin_test_util.h"

using namespace hp::plugin;

namespace {

const std::string kFakeLib = std::string(HP_FAKE_ACL_DIR) + "/lib/libascendcl.so";

PluginRecord load_ascend() {
  SearchOptions o;
  o.plugin_paths = {std::filesystem::path(HP_BUILD_PLUGIN_DIR) / "libhp-backend-ascend.so"};
  o.use_env = o.use_install_dir = o.use_build_dir = false;
  auto reg = discover(o);
  REQUIRE(reg.ok());
  REQUIRE(reg->plugins.size() == 1);
  return reg->plugins[0];
}

}  // namespace

TEST_CASE("ascend: without CANN the plugin is unavailable and lists what it tried",
          "[plugin][ascend]") {
  hp_test::ScopedEnv lib("HP_ASCEND_LIB", std::string("/nonexistent/libascendcl.so"));
  hp_test::ScopedEnv home("ASCEND_TOOLKIT_HOME", std::nullopt);
  auto rec = load_ascend();
  CHECK(rec.verdict == Verdict::unavailable);
  CHECK(rec.code == HP_UNAVAILABLE);
  CHECK(rec.probe_score == 0);
  CHECK_THAT(rec.reason, Catch::Contains("ascend: CANN runtime not found"));
  CHECK_THAT(rec.reason,
             Catch::Contains("tried $HP_ASCEND_LIB=/nonexistent/libascendcl.so: "
                             "/nonexistent/libascendcl.so: cannot open shared object file"));
  CHECK_THAT(rec.reason,
             Catch::Contains("libascendcl.so: libascendcl.so: cannot open shared object file"));
  CHECK_THAT(rec.reason, Catch::Contains("source <toolkit>/set_env.sh"));
}

TEST_CASE("ascend: a CANN lacking a required operator is a version error", "[plugin][ascend]") {
  hp_test::ScopedEnv lib("HP_ASCEND_LIB", kFakeLib);
  hp_test::ScopedEnv opapi("HP_ASCEND_OPAPI_LIB",
                           std::string(HP_FAKE_ACL_DIR) + "/lib-old/libopapi.so");
  auto rec = load_ascend();
  CHECK(rec.verdict == Verdict::unavailable);
  CHECK(rec.code == HP_VERSION);
  CHECK_THAT(
      rec.reason,
      Catch::Contains("ascend: libopapi.so lacks aclnnMatmulGetWorkspaceSize; CANN too old"));
}

TEST_CASE("ascend: a failing device query is unavailable with the ACL error text",
          "[plugin][ascend]") {
  hp_test::ScopedEnv lib("HP_ASCEND_LIB", kFakeLib);
  hp_test::ScopedEnv fail("HP_FAKE_ACL_FAIL_COUNT", std::string("1"));
  auto rec = load_ascend();
  CHECK(rec.verdict == Verdict::unavailable);
  CHECK(rec.probe_score == 10);
  CHECK_THAT(rec.reason, Catch::Contains("ascend: no usable device (aclrtGetDeviceCount failed "
                                         "(error 507033: fake acl: drvGetDevNum failed"));
}

TEST_CASE("ascend: zero devices is rejected as 'no devices'", "[plugin][ascend]") {
  hp_test::ScopedEnv lib("HP_ASCEND_LIB", kFakeLib);
  hp_test::ScopedEnv n("HP_FAKE_ACL_DEVICES", std::string("0"));
  auto rec = load_ascend();
  CHECK(rec.verdict == Verdict::no_devices);
}

TEST_CASE("ascend: devices report memory and SoC-table figures tagged 'table'",
          "[plugin][ascend]") {
  hp_test::ScopedEnv lib("HP_ASCEND_LIB", kFakeLib);
  hp_test::ScopedEnv n("HP_FAKE_ACL_DEVICES", std::string("2"));
  SECTION("910B3") {
    auto rec = load_ascend();
    REQUIRE(rec.ok());
    REQUIRE(rec.devices.size() == 2);
    const auto& d = rec.devices[1];
    CHECK(d.name == "Ascend910B3");
    CHECK(d.kind == HP_DEVICE_NPU);
    CHECK(d.mem_total == (std::uint64_t(64) << 30));
    CHECK(d.peak_flops[HP_BF16].value == 313e12);
    CHECK(d.peak_flops[HP_BF16].prov == HP_PROV_TABLE);
    CHECK(d.mem_bw.prov == HP_PROV_UNKNOWN);
  }
  SECTION("910C die") {
    hp_test::ScopedEnv soc("HP_FAKE_ACL_SOC", std::string("Ascend910_9391"));
    auto rec = load_ascend();
    REQUIRE(rec.ok());
    const auto& d = rec.devices[0];
    CHECK(d.peak_flops[HP_F16].value == 376e12);
    CHECK(d.mem_bw.value == 1.6e12);
    CHECK(d.mem_bw.prov == HP_PROV_TABLE);
    CHECK(d.compute_units == 24);
  }
  SECTION("unknown SoC") {
    hp_test::ScopedEnv soc("HP_FAKE_ACL_SOC", std::string("Ascend310P3"));
    auto rec = load_ascend();
    REQUIRE(rec.ok());
    CHECK(rec.devices[0].peak_flops[HP_F16].prov == HP_PROV_UNKNOWN);
    CHECK_THAT(rec.devices[0].note, Catch::Contains("not in hp's table"));
  }
}

TEST_CASE("ascend: copies whose direction does not match the pointers are refused",
          "[plugin][ascend]") {
  hp_test::ScopedEnv lib("HP_ASCEND_LIB", kFakeLib);
  auto rec = load_ascend();
  REQUIRE(rec.ok());
  auto& b = *rec.backend;
  auto s = b.stream_create(0);
  REQUIRE(s.ok());
  float host[4] = {1, 2, 3, 4}, other[4] = {};
  auto st = b.copy_async(*s, other, host, sizeof host, HP_H2D);  // dst is not device memory
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.error().message(), Catch::Contains("aclrtMemcpyAsync failed"));
  CHECK_THAT(st.error().message(), Catch::Contains("destination does not match the copy kind"));
  CHECK(b.stream_destroy(*s).ok());
}

TEST_CASE(
    "ascend: mem_stats counts device allocations, not pinned host memory, and runtime refusals",
    "[plugin][ascend]") {
  hp_test::ScopedEnv lib("HP_ASCEND_LIB", kFakeLib);
  hp_test::ScopedEnv hbm("HP_FAKE_ACL_HBM_LIMIT", std::string("8192"));
  auto rec = load_ascend();
  REQUIRE(rec.ok());
  auto& b = *rec.backend;
  REQUIRE(b.has_mem_stats());
  auto a = b.alloc(0, 1000);
  auto c = b.alloc(0, 3000);
  auto pinned = b.alloc(0, 5000, HP_MEM_PINNED_HOST);
  REQUIRE((a.ok() && c.ok() && pinned.ok()));
  auto m = b.mem_stats(0);
  REQUIRE(m.ok());
  CHECK(m->in_use == 4000);
  CHECK(m->peak == 4000);
  CHECK(m->allocs == 2);
  CHECK(m->limit == 0);
  auto big = b.alloc(0, 6000);  // 4000 + 6000 > the fake device's 8192 bytes
  REQUIRE_FALSE(big.ok());
  CHECK(big.error().code == hp::Errc::runtime);
  CHECK_THAT(big.error().message(), Catch::Contains("out of device memory"));
  REQUIRE(b.free_mem(0, *c).ok());
  m = b.mem_stats(0, true);
  REQUIRE(m.ok());
  CHECK(m->in_use == 1000);
  CHECK(m->peak == 4000);  // the peak before the reset
  CHECK(m->refused == 1);
  CHECK(b.mem_stats(0)->peak == 1000);  // reset to what is in use
  REQUIRE(b.free_mem(0, *a).ok());
  REQUIRE(b.free_mem(0, *pinned, HP_MEM_PINNED_HOST).ok());
  CHECK(b.mem_stats(0)->in_use == 0);
}
