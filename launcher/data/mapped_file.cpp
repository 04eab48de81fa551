#include "launcher/data/mapped_file.h"

#include "base/user_error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace ht {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError(path + ": not a regular file; give a token file (or a glob of them)");
  }
  size_ = static_cast<int64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) throw UserError(path + ": cannot map into memory: " + std::strerror(err));
    data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::release() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(size_));
  data_ = nullptr;
}

void MappedFile::expect_sequential() const {
  if (data_ != nullptr) ::madvise(const_cast<unsigned char*>(data_), static_cast<size_t>(size_), MADV_SEQUENTIAL);
}

void MappedFile::expect_normal() const {
  if (data_ != nullptr) ::madvise(const_cast<unsigned char*>(data_), static_cast<size_t>(size_), MADV_NORMAL);
}

void MappedFile::release_pages(int64_t offset, int64_t bytes) const {
  static const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t begin = offset / page * page, end = std::min(size_, offset + bytes);
  if (data_ != nullptr && end > begin) {
    ::madvise(const_cast<unsigned char*>(data_) + begin, static_cast<size_t>(end - begin), MADV_DONTNEED);
  }
}

}  // namespace ht
