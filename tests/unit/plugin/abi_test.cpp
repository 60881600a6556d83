// ABI rules from the host's side: struct_size gating of table members and of in/out structs, and
// status objects (codes, messages, conversion to hp::Error).
#include <catch2/catch.hpp>

#include <cstring>

#include "hp/plugin/registry.h"
#include "plugin_test_util.h"

using namespace hp::plugin;
using hp_test::load_only;

TEST_CASE("abi: hp_dtype is core's DType numbering, names come from the core table", "[plugin]") {
  for (int d = HP_F32; d <= HP_U64; ++d) {
    auto t = hp::plugin::to_dtype(d);
    REQUIRE(t.has_value());
    CHECK(hp::plugin::to_hp_dtype(*t) == d);
    CHECK(std::string(hp::plugin::dtype_name(d)) == hp::dtype_name(*t));
  }
  CHECK(std::string(hp::plugin::dtype_name(HP_F32)) == "f32");
  CHECK(std::string(hp::plugin::dtype_name(HP_BOOL)) == "bool");
  CHECK(std::string(hp::plugin::dtype_name(HP_U8)) == "u8");
  CHECK(std::string(hp::plugin::dtype_name(HP_F8)) == "f8");
  CHECK(std::string(hp::plugin::dtype_name(HP_I16)) == "i16");
  CHECK(std::string(hp::plugin::dtype_name(HP_U64)) == "u64");
  for (int bad : {-1, HP_U64 + 1, 100}) {
    CHECK_FALSE(hp::plugin::to_dtype(bad).has_value());
    CHECK(std::string(hp::plugin::dtype_name(bad)) == "?");
  }
  for (hp::DType t : {hp::DType::c64, hp::DType::c128, hp::DType::tf32})
    CHECK(hp::plugin::to_hp_dtype(t) == -1);
}

TEST_CASE("abi: HP_BACKEND_V1_0_SIZE ends at graph_free and 1.1 members lie beyond it",
          "[plugin]") {
  hp_backend_v1 t{};
  t.struct_size = HP_BACKEND_V1_0_SIZE;
  CHECK(HP_HAS_MEMBER(&t, hp_backend_v1, graph_free));
  CHECK_FALSE(HP_HAS_MEMBER(&t, hp_backend_v1, event_query));
  CHECK_FALSE(HP_HAS_MEMBER(&t, hp_backend_v1, mem_info));
  t.struct_size = sizeof t;
  CHECK(HP_HAS_MEMBER(&t, hp_backend_v1, mem_info));
}

TEST_CASE("abi: an older-minor plugin loads and the host uses only the members it has",
          "[plugin]") {
  // The fake's slots past struct_size abort the process if called.
  auto rec = load_only(hp_test::fake_plugin("fakeold"));
  REQUIRE(rec.ok());
  CHECK(rec.abi_major == 1);
  CHECK(rec.abi_minor == 0);
  auto& b = *rec.backend;
  CHECK_FALSE(b.has_event_query());
  CHECK_FALSE(b.has_mem_info());
  auto ev = b.event_create(0);
  REQUIRE(ev.ok());
  auto done = b.event_query(*ev);
  REQUIRE_FALSE(done.ok());
  CHECK(done.error().code == hp::Errc::not_implemented);
  CHECK_THAT(done.error().message(), Catch::Contains("implements ABI 1.0, event_query needs 1.1"));
  CHECK(b.event_destroy(*ev).ok());
}

TEST_CASE("abi: a current plugin exposes the 1.1 members", "[plugin]") {
  auto rec = load_only(hp_test::fake_plugin("fakegood"));
  REQUIRE(rec.ok());
  CHECK(rec.backend->has_event_query());
  auto ev = rec.backend->event_create(0);
  REQUIRE(ev.ok());
  auto s = rec.backend->stream_create(0);
  REQUIRE(s.ok());
  REQUIRE(rec.backend->event_record(*ev, *s).ok());
  auto done = rec.backend->event_query(*ev);
  REQUIRE(done.ok());
  CHECK(*done);
  CHECK(rec.backend->stream_destroy(*s).ok());
  CHECK(rec.backend->event_destroy(*ev).ok());
}

TEST_CASE("abi: a plugin fills only the part of hp_device_info the caller's struct_size covers",
          "[plugin]") {
  auto rec = load_only(hp_test::cpu_plugin());
  REQUIRE(rec.ok());
  const hp_backend_v1* t = rec.backend->table();
  // An "older host" that knows hp_device_info only up to mem_Bps: bytes past that must stay
  // untouched.
  hp_device_info info;
  std::memset(&info, 0xAB, sizeof info);
  std::size_t known = offsetof(hp_device_info, mem_Bps);
  info.struct_size = known;
  hp_status* st = t->device_info(rec.backend->ctx(), 0, &info);
  REQUIRE(st == nullptr);
  CHECK(info.struct_size == known);
  CHECK(std::strlen(info.name) > 0);
  CHECK(info.kind == HP_DEVICE_CPU);
  const unsigned char* tail = reinterpret_cast<const unsigned char*>(&info) + known;
  bool untouched = true;
  for (std::size_t i = 0; i < sizeof info - known; ++i) untouched &= tail[i] == 0xAB;
  CHECK(untouched);
}

TEST_CASE("abi: status objects carry a code and a message and become hp::Error", "[plugin]") {
  auto rec = load_only(hp_test::cpu_plugin());
  REQUIRE(rec.ok());
  auto& b = *rec.backend;
  auto info = b.device_info(5);
  REQUIRE_FALSE(info.ok());
  CHECK(info.error().code == hp::Errc::bad_input);
  CHECK_THAT(info.error().message(), Catch::Contains("cpu: device_info: no device 5"));
  CHECK(info.error().where() == "cpu plugin, device_info");

  // Raw: the code and message accessors, then free through the table.
  const hp_backend_v1* t = b.table();
  hp_status* st = t->alloc(b.ctx(), 0, 16, 99, nullptr);
  REQUIRE(st != nullptr);
  CHECK(t->status_code(st) == HP_INVALID);
  CHECK(std::strlen(t->status_message(st)) > 0);
  t->status_free(st);
  t->status_free(nullptr);

  CHECK(take_status(t, nullptr, "x").ok());
  CHECK(errc_for(HP_UNAVAILABLE) == hp::Errc::unavailable);
  CHECK(errc_for(HP_VERSION) == hp::Errc::unavailable);
  CHECK(errc_for(HP_UNSUPPORTED) == hp::Errc::not_implemented);
  CHECK(errc_for(HP_NO_MEMORY) == hp::Errc::runtime);
}

TEST_CASE("abi: unsupported kernels report HP_UNSUPPORTED rather than failing silently",
          "[plugin]") {
  auto rec = load_only(hp_test::cpu_plugin());
  REQUIRE(rec.ok());
  auto& b = *rec.backend;
  CHECK(b.supports(0, HP_OP_GEMM, HP_F32));
  CHECK_FALSE(b.supports(0, HP_OP_GEMM, HP_F16));
  CHECK_FALSE(b.supports(1, HP_OP_ADD, HP_F32));
  auto s = b.stream_create(0);
  REQUIRE(s.ok());
  float x[4] = {1, 2, 3, 4};
  hp_elementwise_desc d{};
  d.op = HP_OP_RELU;
  d.dtype = HP_F16;
  d.n = 4;
  d.x = x;
  d.out = x;
  auto r = b.elementwise(*s, d);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == hp::Errc::not_implemented);
  CHECK(b.stream_destroy(*s).ok());
}
