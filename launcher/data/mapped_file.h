#pragma once
// A file mapped read-only into memory (mmap): its bytes are read from the page cache on demand
// and never copied into the process, so a corpus of many gigabytes costs address space, not
// memory. Moves, does not copy; unmaps when destroyed.

#include <cstdint>
#include <string>

namespace ht {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws UserError naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Hints for the kernel's read-ahead: one pass from start to end, or the usual.
  void expect_sequential() const;
  void expect_normal() const;
  // Drops the pages of [offset, offset + bytes) from this process's resident set (they stay in
  // the page cache and come back on the next read): a pass over a big file leaves no trace in RSS.
  void release_pages(int64_t offset, int64_t bytes) const;

 private:
  void release();
  std::string path_;
  const unsigned char* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace ht
