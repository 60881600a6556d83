// Helpers for the plugin tests: paths of the fake plugins, loading one file, a scoped environment
// variable, a temp dir.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include "hp/plugin/registry.h"

namespace hp_test {

inline std::filesystem::path fake_plugin(const std::string& name) {
  return std::filesystem::path(HP_FAKE_PLUGIN_DIR) / ("libhp-backend-" + name + ".so");
}

inline std::filesystem::path cpu_plugin() {
  return std::filesystem::path(HP_BUILD_PLUGIN_DIR) / "libhp-backend-cpu.so";
}

/// Loads exactly one file, the way --plugin-path FILE does, with no other search dirs.
inline hp::plugin::PluginRecord load_only(const std::filesystem::path& file) {
  hp::plugin::SearchOptions o;
  o.plugin_paths = {file};
  o.use_env = o.use_install_dir = o.use_build_dir = false;
  auto reg = hp::plugin::discover(o);
  REQUIRE(reg.ok());
  REQUIRE(reg->plugins.size() == 1);
  return reg->plugins[0];
}

/// Sets (or unsets, with nullopt) an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

/// A fresh directory removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("hp-plugin-test-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace hp_test
