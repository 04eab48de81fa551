#pragma once
// Removes a file or a folder with everything in it: std::filesystem::remove_all's job, done with
// POSIX nftw instead. libtorch 2.11's wheels export their own copies of std::filesystem's
// functions, and a program linked against them calls libtorch's remove_all, which jumped to
// address 0 (test_launcher on an H200, 2026-11-26; a checkpoint's rotation calls it too).

#include <ftw.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>

namespace ht {

namespace detail {
inline int remove_one(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path) == 0 ? 0 : errno;
}
}  // namespace detail

// Removes `path` and, for a folder, everything under it (symbolic links themselves, never what
// they point to). A path that does not exist is no error. On failure `ec` says why; what could
// be removed before it is gone.
inline void remove_tree(const std::filesystem::path& path, std::error_code& ec) noexcept {
  ec.clear();
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return;
  }
  const int failed = nftw(path.c_str(), detail::remove_one, 16, FTW_DEPTH | FTW_PHYS);
  if (failed != 0) ec.assign(failed > 0 ? failed : errno, std::generic_category());
}

// As above; throws std::filesystem::filesystem_error on failure.
inline void remove_tree(const std::filesystem::path& path) {
  std::error_code ec;
  remove_tree(path, ec);
  if (ec) throw std::filesystem::filesystem_error("cannot remove", path, ec);
}

}  // namespace ht
