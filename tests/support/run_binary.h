#pragma once
// Runs the hybrid_train binary (HT_BINARY, set by tests/CMakeLists.txt) as a user would, with
// its output (stdout and stderr together) and exit status.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace ht::test {

struct ProcessResult {
  int status;
  std::string output;
};

inline ProcessResult run_binary(const std::string& args) {
  const std::string command = std::string(HT_BINARY) + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) output += buffer.data();
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace ht::test
