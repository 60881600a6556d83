// External data stays inside the model's directory and its numbers parse completely
// (hp/model/external_data.h): absolute locations, `..` escapes and symlinks resolving outside are
// refused with the path; "12abc" as an offset or length is refused with the key.
#include <onnx/onnx_pb.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "hp/model/external_data.h"

namespace fs = std::filesystem;
using hp::model::confine_external_path;
using hp::model::resolve_external_data;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("hp-ext-test-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path / "model" / "sub");
    std::ofstream(path / "model" / "w.bin") << "data";
    std::ofstream(path / "outside.bin") << "secret";
  }
  ~TempDir() { fs::remove_all(path); }
};

onnx::TensorProto external(const std::string& location,
                           std::vector<std::pair<std::string, std::string>> more = {}) {
  onnx::TensorProto t;
  t.set_name("w");
  t.set_data_location(onnx::TensorProto::EXTERNAL);
  auto* kv = t.add_external_data();
  kv->set_key("location");
  kv->set_value(location);
  for (auto& [k, v] : more) {
    kv = t.add_external_data();
    kv->set_key(k);
    kv->set_value(v);
  }
  return t;
}

}  // namespace

TEST_CASE("model: external data inside the model's directory resolves", "[model]") {
  TempDir d;
  const fs::path dir = d.path / "model";
  auto r = resolve_external_data(external("w.bin", {{"offset", "2"}, {"length", "2"}}), dir);
  REQUIRE(r.ok());
  CHECK(r->path == dir / "w.bin");
  CHECK(r->offset == 2);
  CHECK(r->length == 2);
  CHECK(confine_external_path(dir, "sub/../w.bin").ok());
  CHECK(confine_external_path(dir, "sub/not-yet-there.bin").ok());
}

TEST_CASE("model: external data outside the model's directory is refused", "[model]") {
  TempDir d;
  const fs::path dir = d.path / "model";
  auto abs = confine_external_path(dir, "/etc/passwd");
  REQUIRE_FALSE(abs.ok());
  CHECK(abs.error().message().find("'/etc/passwd' is an absolute path") != std::string::npos);
  auto up = confine_external_path(dir, "../outside.bin");
  REQUIRE_FALSE(up.ok());
  CHECK(up.error().message().find((d.path / "outside.bin").string()) != std::string::npos);
  CHECK_FALSE(confine_external_path(dir, "sub/../../outside.bin").ok());
  CHECK_FALSE(confine_external_path(dir, "..").ok());
  CHECK_FALSE(confine_external_path(dir, ".").ok());
  fs::create_symlink(d.path / "outside.bin", dir / "link.bin");
  auto link = confine_external_path(dir, "link.bin");
  REQUIRE_FALSE(link.ok());
  CHECK(link.error().message().find("outside the model's directory") != std::string::npos);
  fs::create_directory_symlink(d.path, dir / "up");
  CHECK_FALSE(confine_external_path(dir, "up/outside.bin").ok());
  // A sibling whose name starts like the model's directory is outside too.
  fs::create_directories(d.path / "model2");
  CHECK_FALSE(confine_external_path(dir, "../model2/x.bin").ok());
}

TEST_CASE("model: external data offsets and lengths parse completely", "[model]") {
  TempDir d;
  const fs::path dir = d.path / "model";
  for (const char* bad : {"12abc", "", "-1", " 12", "0x10", "99999999999999999999", "1e3"}) {
    INFO(bad);
    auto off = resolve_external_data(external("w.bin", {{"offset", bad}}), dir);
    REQUIRE_FALSE(off.ok());
    CHECK(off.error().message().find("offset") != std::string::npos);
    auto len = resolve_external_data(external("w.bin", {{"length", bad}}), dir);
    REQUIRE_FALSE(len.ok());
    CHECK(len.error().message().find("length") != std::string::npos);
  }
  CHECK_FALSE(resolve_external_data(external(""), dir).ok());
}
