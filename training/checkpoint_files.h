#pragma once
// What the two halves of checkpoints share (training/checkpoint.cpp reads them,
// training/checkpoint_write.cpp writes them): the files' names and a step's folder name.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace ht::checkpoint_files {

// A whole checkpoint's files (and MANIFEST, written last).
inline constexpr const char* kFiles[] = {"model.pt", "optimizer.pt", "trainer.pt"};

// 42 -> step_00000042.
inline std::string folder_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

// step_00000042 (a folder's path) -> 42.
inline int64_t step_of_folder(const std::string& folder) {
  const std::string name = std::filesystem::path(folder).filename().string();
  return std::strtoll(name.c_str() + 5, nullptr, 10);
}

}  // namespace ht::checkpoint_files
