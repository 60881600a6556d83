// Loader: search order, and one test per rejection reason (what the user is told for each way a
// file can fail to be a usable backend).
#include <catch2/catch.hpp>

#include <fstream>

#include "hp/core/exit_code.h"
#include "hp/plugin/devices.h"
#include "hp/plugin/registry.h"
#include "plugin_test_util.h"

using namespace hp::plugin;
using hp_test::fake_plugin;
using hp_test::load_only;

TEST_CASE("loader: search order is --plugin-path, HP_PLUGIN_PATH, install dir, build tree",
          "[plugin]") {
  hp_test::ScopedEnv env("HP_PLUGIN_PATH", std::string("/env/a::/env/b"));
  SearchOptions o;
  o.plugin_paths = {"/cli/x"};
  o.build_dir = "/build/plugins";
  auto dirs = search_dirs(o);
  REQUIRE(dirs.size() == 5);
  CHECK(dirs[0] == std::make_pair(std::filesystem::path("/cli/x"), std::string("--plugin-path")));
  CHECK(dirs[1] == std::make_pair(std::filesystem::path("/env/a"), std::string("HP_PLUGIN_PATH")));
  CHECK(dirs[2] == std::make_pair(std::filesystem::path("/env/b"), std::string("HP_PLUGIN_PATH")));
  CHECK(dirs[3].second == "install dir");
  CHECK(dirs[3].first.string().find("lib/hp/plugins") != std::string::npos);
  CHECK(dirs[4] ==
        std::make_pair(std::filesystem::path("/build/plugins"), std::string("build tree")));
}

TEST_CASE("loader: the build tree is searched by default and finds the cpu plugin", "[plugin]") {
  hp_test::ScopedEnv env("HP_PLUGIN_PATH", std::nullopt);
  auto reg = discover(SearchOptions{});
  REQUIRE(reg.ok());
  auto cpu = reg->find("cpu");
  REQUIRE(cpu != nullptr);
  CHECK(reg->record("cpu")->origin == "build tree");
  CHECK(reg->record("cpu")->devices.size() == 1);
  bool traced = false;
  for (const auto& line : reg->trace) traced |= line.find(HP_BUILD_PLUGIN_DIR) != std::string::npos;
  CHECK(traced);
}

TEST_CASE("loader: an earlier path shadows a later plugin of the same name", "[plugin]") {
  hp_test::TempDir dir;
  std::filesystem::copy_file(hp_test::cpu_plugin(), dir.path() / "libhp-backend-cpu.so");
  hp_test::ScopedEnv env("HP_PLUGIN_PATH", dir.path().string());
  auto reg = discover(SearchOptions{});
  REQUIRE(reg.ok());
  REQUIRE(reg->record("cpu") != nullptr);
  CHECK(reg->record("cpu")->origin == "HP_PLUGIN_PATH");
  int cpu_records = 0;
  for (const auto& r : reg->plugins) cpu_records += r.name == "cpu";
  CHECK(cpu_records == 1);
  bool skipped = false;
  for (const auto& line : reg->trace)
    skipped |= line.find("already loaded from an earlier path") != std::string::npos;
  CHECK(skipped);
}

TEST_CASE("loader: a --plugin-path that does not exist is a bad-input error", "[plugin]") {
  SearchOptions o;
  o.plugin_paths = {"/no/such/dir"};
  auto reg = discover(o);
  REQUIRE_FALSE(reg.ok());
  CHECK(reg.error().code == hp::Errc::bad_input);
  CHECK(reg.error().where() == "/no/such/dir");
}

TEST_CASE("loader: a file that is not a shared library is rejected with the dlerror text",
          "[plugin]") {
  hp_test::TempDir dir;
  auto file = dir.path() / "libhp-backend-garbage.so";
  std::ofstream(file) << "this is not an ELF file\n";
  auto rec = load_only(file);
  CHECK(rec.verdict == Verdict::not_library);
  CHECK_THAT(rec.reason, Catch::Contains(file.string()));
  CHECK_THAT(rec.reason,
             Catch::Contains("invalid ELF header") || Catch::Contains("file too short"));
}

TEST_CASE("loader: a shared library without the entry symbol is not an hp backend", "[plugin]") {
  auto rec = load_only(fake_plugin("notbackend"));
  CHECK(rec.verdict == Verdict::not_backend);
  CHECK_THAT(rec.reason, Catch::Contains("not an hp backend, or an unsupported ABI"));
}

TEST_CASE("loader: a plugin for another ABI major is rejected with both versions", "[plugin]") {
  SECTION("only hp_backend_entry_v2 is exported") {
    auto rec = load_only(fake_plugin("fakeabi2"));
    CHECK(rec.verdict == Verdict::abi_mismatch);
    CHECK_THAT(rec.reason, Catch::Contains("implements ABI 2, hp supports 1"));
  }
  SECTION("the v1 entry returns a table saying major 2") {
    auto rec = load_only(fake_plugin("fakeabi2table"));
    CHECK(rec.verdict == Verdict::abi_mismatch);
    CHECK_THAT(rec.reason,
               Catch::Contains("libhp-backend-fakeabi2table.so implements ABI 2, hp supports 1"));
  }
}

TEST_CASE("loader: a table with a null mandatory member is rejected", "[plugin]") {
  auto rec = load_only(fake_plugin("fakenullmember"));
  CHECK(rec.verdict == Verdict::bad_table);
  CHECK_THAT(rec.reason, Catch::Contains("mandatory member 'gemm' is null"));
}

TEST_CASE("loader: open failing with HP_UNAVAILABLE is reported as unavailable with the reason",
          "[plugin]") {
  auto rec = load_only(fake_plugin("fakeunavailable"));
  CHECK(rec.verdict == Verdict::unavailable);
  CHECK(rec.code == HP_UNAVAILABLE);
  CHECK_THAT(rec.reason, Catch::Contains("fake runtime not found (tried libfake.so"));
  CHECK(rec.probe_score == 5);
}

TEST_CASE("loader: a plugin whose vendor library is missing is unavailable, not broken",
          "[plugin]") {
  auto rec = load_only(fake_plugin("fakeneedsvendor"));
  CHECK(rec.verdict == Verdict::unavailable);
  CHECK_THAT(rec.reason, Catch::Contains("libhpfakevendor.so: cannot open shared object file"));
}

TEST_CASE("loader: a plugin with no devices is rejected", "[plugin]") {
  auto rec = load_only(fake_plugin("fakenodevices"));
  CHECK(rec.verdict == Verdict::no_devices);
  CHECK_THAT(rec.reason, Catch::Contains("reports no devices"));
}

TEST_CASE("loader: a well-formed plugin loads with its table name, version and devices",
          "[plugin]") {
  auto rec = load_only(fake_plugin("fakegood"));
  REQUIRE(rec.ok());
  CHECK(rec.name == "fakegood");
  CHECK(rec.version == "9.9.9");
  CHECK(rec.abi_major == 1);
  CHECK(rec.abi_minor == HP_ABI_MINOR);
  REQUIRE(rec.devices.size() == 1);
  CHECK(rec.devices[0].peak_flops[HP_F32].prov == HP_PROV_MEASURED);
  CHECK(rec.devices[0].mem_bw.prov == HP_PROV_TABLE);
  CHECK(rec.devices[0].h2d_bw.prov == HP_PROV_UNKNOWN);
}

TEST_CASE("loader: every rejection in a directory is kept, loaded ones are ordered cpu last",
          "[plugin]") {
  SearchOptions o;
  o.plugin_paths = {HP_FAKE_PLUGIN_DIR, hp_test::cpu_plugin()};
  o.use_env = o.use_install_dir = o.use_build_dir = false;
  auto reg = discover(o);
  REQUIRE(reg.ok());
  CHECK(reg->plugins.size() == 10);
  auto loaded = reg->loaded();
  REQUIRE(loaded.size() == 3);  // fakegood, fakeold (probe 5), then cpu (probe 1, and last anyway)
  CHECK(loaded.back()->name() == "cpu");
  CHECK(reg->record("fakeabi2")->verdict == Verdict::abi_mismatch);
}

TEST_CASE("loader: dlerror classification tells missing dependencies from missing files",
          "[plugin]") {
  CHECK(is_missing_dependency(
      "/p/a.so: libcudart.so.12: cannot open shared object file: No such file or directory",
      "/p/a.so"));
  CHECK_FALSE(is_missing_dependency(
      "/p/a.so: cannot open shared object file: No such file or directory", "/p/a.so"));
  CHECK_FALSE(is_missing_dependency("/p/a.so: invalid ELF header", "/p/a.so"));
}

TEST_CASE("devices: no loaded plugin is 'unavailable' (exit 7) and lists every rejection",
          "[plugin]") {
  SearchOptions o;
  o.plugin_paths = {hp_test::fake_plugin("fakeabi2"), hp_test::fake_plugin("fakeunavailable")};
  o.use_env = o.use_install_dir = o.use_build_dir = false;
  auto reg = discover(o);
  REQUIRE(reg.ok());
  auto st = check_any_loaded(*reg);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().code == hp::Errc::unavailable);
  CHECK(static_cast<int>(hp::exit_code_for(st.error().code)) == 7);
  auto all = st.error().all();
  REQUIRE(all.size() == 3);
  CHECK_THAT(all[1].message, Catch::Contains("implements ABI 2"));
  CHECK_THAT(all[2].message,
             Catch::Contains("unavailable: fakeunavailable: fake runtime not found"));
  auto text = render_devices_text(*reg, true);
  CHECK_THAT(text, Catch::Contains("(none)"));
  CHECK_THAT(text, Catch::Contains("paths tried:"));
}
