#pragma once
// A fresh folder per test, removed afterwards, and helpers to put config files in it.

#include "base/remove_tree.h"
#include "launcher/config/config_loader.h"
#include "base/user_error.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace ht::test {

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "ht_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
                       std::to_string(::getpid());
    for (char& ch : name)
      if (ch == '/') ch = '_';  // parameterized tests are named Suite/Test/0
    path_ = (std::filesystem::temp_directory_path() / name).string();
    remove_tree(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { remove_tree(path_); }
  std::string path(const std::string& name = "") const { return (std::filesystem::path(path_) / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name)) << text;
    return path(name);
  }

 private:
  std::string path_;
};

// A whole file, or "" if it cannot be read.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The UserError message load_config gives, or "" when the config loads.
inline std::string load_error(const std::string& file, const std::vector<ConfigOverride>& overrides = {}) {
  try {
    load_config(file, overrides);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// The UserError message `f` throws, or "" when it throws none.
inline std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// The config of `toml` (written as job.toml in `dir`) with `--section.key=value` overrides.
inline Config config_for(const TempDir& dir, const std::string& toml, const std::vector<std::string>& args) {
  std::vector<ConfigOverride> overrides;
  for (const auto& a : args) overrides.push_back(override_of(a));
  return load_config(dir.write("job.toml", toml), overrides).config;
}

}  // namespace ht::test
