#include "training/slice_files.h"

#include "training/optimizer_shard.h"
#include "base/user_error.h"
#include "alloc/cpu_device_allocator.h"

#include <zlib.h>

#include <algorithm>
#include <map>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unistd.h>

namespace ht {
namespace {

namespace fs = std::filesystem;

uint32_t crc_add(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (bytes > 0) {  // zlib's length is 32-bit
    const auto n = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    c = crc32(c, p, n);
    p += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(c);
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n <= 0) throw std::runtime_error("the disk refused " + path + " (full, or a quota)");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

template <typename T>
std::string joined(const std::vector<T>& values) {
  std::string s;
  for (const T& v : values) s += " " + std::to_string(v);
  return s;
}

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(sizes[d], 1);
  return strides;
}

int64_t product(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// The sizes of `part` of a tensor of `sizes`.
std::vector<int64_t> part_sizes(const std::vector<int64_t>& sizes, const SlicePart& part) {
  std::vector<int64_t> out = sizes;
  if (part.whole()) return out;
  out[static_cast<size_t>(part.dim)] = 0;
  for (const auto& range : part.ranges) out[static_cast<size_t>(part.dim)] += range.second;
  return out;
}

// A part as boxes of the whole: each range's (start, length) along every dimension, and where
// along the part's dimension it lies in the part.
struct Box {
  std::vector<int64_t> start, length;
  int64_t at_in_part = 0;
};

std::vector<Box> boxes_of(const std::vector<int64_t>& sizes, const SlicePart& part) {
  const Box all{std::vector<int64_t>(sizes.size(), 0), sizes, 0};
  if (part.whole()) return {all};
  std::vector<Box> boxes;
  int64_t at = 0;
  for (const auto& [start, length] : part.ranges) {
    Box b = all;
    b.start[static_cast<size_t>(part.dim)] = start;
    b.length[static_cast<size_t>(part.dim)] = length;
    b.at_in_part = at;
    at += length;
    boxes.push_back(b);
  }
  return boxes;
}

// The view of `part_tensor` (a tensor shaped as `part`) that holds the whole's elements in `box`.
at::Tensor view_of(at::Tensor part_tensor, const SlicePart& part, const Box& of_part, const Box& box) {
  for (size_t d = 0; d < box.start.size(); ++d) {
    int64_t start = box.start[d];
    if (static_cast<int64_t>(d) == part.dim) start += of_part.at_in_part - of_part.start[d];
    part_tensor = part_tensor.narrow(static_cast<int64_t>(d), start, box.length[d]);
  }
  return part_tensor;
}

}  // namespace

bool SlicedTensor::has_parts() const {
  return std::any_of(slices.begin(), slices.end(), [](const SliceRecord& s) { return !s.part.whole(); });
}

std::string slice_file_stem(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d", rank);
  return name;
}

struct SliceFileWriter::Files {
  int rank = 0;
  std::string data_path, index_path;
  int data = -1;
  uint64_t bytes = 0;
  uint32_t crc = crc_add(0, nullptr, 0);
  std::ostringstream index;
  bool held = false;
  std::vector<at::Tensor> copies;  // held: each slice's bytes, in order
  int64_t held_bytes = 0;
  void open(const std::string& folder) {
    const std::string stem = (fs::path(folder) / slice_file_stem(rank)).string();
    data_path = stem + ".slices";
    index_path = stem + ".index";
    data = ::open(data_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (data < 0) throw std::runtime_error("cannot create " + stem + ".slices");
  }
};

SliceFileWriter::SliceFileWriter(const std::string& folder, int rank, const std::string& optimizer)
    : files_(std::make_unique<Files>()) {
  files_->rank = rank;
  files_->open(folder);
  files_->index << "optimizer " << optimizer << '\n';
}

SliceFileWriter::SliceFileWriter(int rank, const std::string& optimizer) : files_(std::make_unique<Files>()) {
  files_->rank = rank;
  files_->held = true;
  files_->index << "optimizer " << optimizer << '\n';
}

int64_t SliceFileWriter::held_bytes() const { return files_->held_bytes; }

std::array<uint64_t, 4> SliceFileWriter::write_to(const std::string& folder) {
  TORCH_CHECK(files_->held && files_->data < 0, "SliceFileWriter::write_to: not a held writer, or written already");
  files_->open(folder);
  for (at::Tensor& copy : files_->copies) {
    write_all(files_->data, copy.data_ptr(), static_cast<size_t>(copy.nbytes()), files_->data_path);
    copy = at::Tensor();  // its host memory goes as soon as it is on its way to the disk
  }
  files_->copies.clear();
  files_->held_bytes = 0;
  return finish();
}

SliceFileWriter::~SliceFileWriter() {
  if (files_->data >= 0) ::close(files_->data);
}

void SliceFileWriter::add(const std::string& kind, const std::string& name, const at::Tensor& like, int64_t offset,
                          const at::Tensor& values) {
  record(kind, name, values.scalar_type(), like.sizes(), like.strides(), SlicePart{}, offset, values);
}

void SliceFileWriter::add_part(const std::string& kind, const std::string& name, const std::vector<int64_t>& sizes,
                               const SlicePart& part, int64_t offset, const at::Tensor& values) {
  TORCH_CHECK(!part.whole() && part.dim < static_cast<int64_t>(sizes.size()), "SliceFileWriter: ", name,
              "'s part is not along one of its dimensions");
  record(kind, name, values.scalar_type(), sizes, row_major_strides(sizes), part, offset, values);
}

void SliceFileWriter::record(const std::string& kind, const std::string& name, at::ScalarType dtype,
                             at::IntArrayRef sizes, at::IntArrayRef strides, const SlicePart& part, int64_t offset,
                             const at::Tensor& values) {
  at::Tensor host;
  {
    HostAllocationScope scope;  // the copy is host memory, not the device's
    const at::Tensor flat = values.detach().reshape({-1});
    if (files_->held) {  // a copy of its own: training goes on changing the values
      host = at::empty({flat.numel()}, flat.options().device(at::kCPU).pinned_memory(flat.is_cuda()));
      host.copy_(flat);
    } else {
      host = flat.to(at::kCPU).contiguous();
    }
  }
  TORCH_CHECK(host.scalar_type() == dtype, "SliceFileWriter: ", name, "'s slice is not its dtype");
  const size_t bytes = static_cast<size_t>(host.numel()) * host.element_size();
  files_->index << "slice " << kind << ' ' << name << ' ' << static_cast<int>(dtype) << ' ' << offset << ' '
                << host.numel() << ' ' << files_->bytes << ' ' << sizes.size() << joined(sizes.vec())
                << joined(strides.vec());
  if (!part.whole()) {
    files_->index << " part " << part.dim << ' ' << part.ranges.size();
    for (const auto& [start, length] : part.ranges) files_->index << ' ' << start << ' ' << length;
  }
  files_->index << '\n';
  if (files_->held) {
    files_->copies.push_back(host);
    files_->held_bytes += static_cast<int64_t>(bytes);
  } else {
    write_all(files_->data, host.data_ptr(), bytes, files_->data_path);
  }
  files_->crc = crc_add(files_->crc, host.data_ptr(), bytes);
  files_->bytes += bytes;
}

void SliceFileWriter::add_step(const std::string& name, int64_t count) {
  files_->index << "step " << name << ' ' << count << '\n';
}

std::array<uint64_t, 4> SliceFileWriter::finish() {
  if (::fsync(files_->data) != 0) throw std::runtime_error("fsync of " + files_->data_path + " failed; is the disk full?");
  ::close(files_->data);
  files_->data = -1;
  const std::string index = files_->index.str();
  const int fd = ::open(files_->index_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + files_->index_path);
  try {
    write_all(fd, index.data(), index.size(), files_->index_path);
    if (::fsync(fd) != 0) throw std::runtime_error("fsync of " + files_->index_path + " failed; is the disk full?");
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return {files_->bytes, files_->crc, index.size(), crc_add(crc_add(0, nullptr, 0), index.data(), index.size())};
}

bool SliceIndex::present(const std::string& folder) {
  return fs::exists(fs::path(folder) / (slice_file_stem(0) + ".index"));
}

SliceIndex::SliceIndex(std::string folder) : folder_(std::move(folder)) {
  for (int rank = 0;; ++rank) {
    const fs::path path = fs::path(folder_) / (slice_file_stem(rank) + ".index");
    if (!fs::exists(path)) break;
    ranks_ = rank + 1;
    std::ifstream in(path);
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      auto bad = [&] {
        return UserError(path.string() + ", line " + std::to_string(number) + ": not a slice record (\"" + line +
                         "\"); the checkpoint is damaged or from another program");
      };
      std::istringstream fields(line);
      std::string what;
      fields >> what;
      if (what == "optimizer") {
        if (!(fields >> optimizer_)) throw bad();
      } else if (what == "step") {
        std::string name;
        int64_t count = 0;
        if (!(fields >> name >> count)) throw bad();
        steps_[name] = count;
      } else if (what == "slice") {
        std::string kind, name;
        int dtype = 0;
        int64_t dims = 0;
        SliceRecord r;
        r.file = slice_file_stem(rank) + ".slices";
        if (!(fields >> kind >> name >> dtype >> r.offset >> r.length >> r.byte_at >> dims) || dims < 0 || dims > 16) {
          throw bad();
        }
        SlicedTensor& t = tensors_[kind][name];
        std::vector<int64_t> sizes(static_cast<size_t>(dims)), strides(static_cast<size_t>(dims));
        for (int64_t& s : sizes) fields >> s;
        for (int64_t& s : strides) fields >> s;
        if (!fields) throw bad();
        std::string part;
        if (fields >> part) {
          int64_t n = 0;
          if (part != "part" || !(fields >> r.part.dim >> n) || r.part.dim < 0 || r.part.dim >= dims || n <= 0) throw bad();
          for (int64_t k = 0; k < n; ++k) {
            int64_t start = 0, length = 0;
            if (!(fields >> start >> length) || start < 0 || length <= 0 ||
                start + length > sizes[static_cast<size_t>(r.part.dim)]) {
              throw bad();
            }
            r.part.ranges.emplace_back(start, length);
          }
        }
        if (t.slices.empty()) {
          t.dtype = static_cast<at::ScalarType>(dtype);
          t.sizes = sizes;
          t.strides = strides;
        } else if (t.sizes != sizes || t.strides != strides || t.dtype != static_cast<at::ScalarType>(dtype)) {
          throw UserError(path.string() + ", line " + std::to_string(number) + ": " + name +
                          "'s shape or dtype differs from another rank's record; the checkpoint is damaged");
        }
        t.slices.push_back(r);
      } else if (!what.empty()) {
        throw bad();
      }
    }
  }
  for (auto& [kind, by_name] : tensors_) {
    for (auto& [name, t] : by_name) {
      std::sort(t.slices.begin(), t.slices.end(),
                [](const SliceRecord& a, const SliceRecord& b) { return a.offset < b.offset; });
    }
  }
}

std::vector<std::string> SliceIndex::names(const std::string& kind) const {
  std::vector<std::string> out;
  const auto it = tensors_.find(kind);
  if (it != tensors_.end()) {
    for (const auto& [name, t] : it->second) out.push_back(name);
  }
  return out;
}

const SlicedTensor* SliceIndex::find(const std::string& kind, const std::string& name) const {
  const auto it = tensors_.find(kind);
  if (it == tensors_.end()) return nullptr;
  const auto t = it->second.find(name);
  return t == it->second.end() ? nullptr : &t->second;
}

std::optional<int64_t> SliceIndex::step(const std::string& name) const {
  const auto it = steps_.find(name);
  if (it == steps_.end()) return std::nullopt;
  return it->second;
}

void SliceIndex::read_record(const SliceRecord& s, int64_t from, int64_t to, int64_t element, char* dst,
                             const std::string& name) const {
  const std::string path = (fs::path(folder_) / s.file).string();
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UserError(path + ": cannot open it to read " + name);
  size_t left = static_cast<size_t>((to - from) * element);
  auto at = static_cast<off_t>(s.byte_at + static_cast<uint64_t>((from - s.offset) * element));
  while (left > 0) {
    const ssize_t n = ::pread(fd, dst, left, at);
    if (n <= 0) {
      ::close(fd);
      throw UserError(path + ": ends before " + name + "'s slice; the checkpoint is damaged");
    }
    dst += n;
    at += n;
    left -= static_cast<size_t>(n);
  }
  ::close(fd);
}

at::Tensor SliceIndex::read(const std::string& kind, const std::string& name, int64_t offset, int64_t length) const {
  const SlicedTensor* t = find(kind, name);
  if (t == nullptr) throw UserError(folder_ + ": the checkpoint has no " + kind + " " + name);
  if (t->has_parts()) return read_part(kind, name, SlicePart{}, offset, length);  // row-major: parts are
  HostAllocationScope scope;
  at::Tensor out = at::empty({length}, at::TensorOptions().dtype(t->dtype));
  const int64_t element = static_cast<int64_t>(out.element_size());
  int64_t covered = offset;  // slices are by offset and do not overlap: fill [offset, end) in order
  for (const SliceRecord& s : t->slices) {
    const int64_t from = std::max(covered, s.offset), to = std::min(offset + length, s.offset + s.length);
    if (from >= to) continue;
    if (from != covered) break;
    read_record(s, from, to, element, static_cast<char*>(out.data_ptr()) + (from - offset) * element, name);
    covered = to;
  }
  if (covered < offset + length) {
    throw UserError(folder_ + ": no rank's slice holds elements " + std::to_string(covered) + " and after of " + kind +
                    " " + name + "; the checkpoint is incomplete");
  }
  return out;
}

at::Tensor SliceIndex::assemble(const SlicedTensor& t, const std::vector<const SliceRecord*>& records, int64_t numel,
                                const std::string& what) const {
  at::Tensor out = at::empty({numel}, at::TensorOptions().dtype(t.dtype));
  const int64_t element = static_cast<int64_t>(out.element_size());
  int64_t covered = 0;
  for (const SliceRecord* s : records) {
    if (s->offset != covered || s->offset + s->length > numel) break;  // a gap, or an overlap
    read_record(*s, s->offset, s->offset + s->length, element, static_cast<char*>(out.data_ptr()) + s->offset * element,
                what);
    covered += s->length;
  }
  if (covered != numel) {
    throw UserError(folder_ + ": the slices of " + what + " hold its elements up to " + std::to_string(covered) +
                    " of " + std::to_string(numel) + " without a gap or overlap; the checkpoint is incomplete");
  }
  return out;
}

at::Tensor SliceIndex::read_part(const std::string& kind, const std::string& name, const SlicePart& part,
                                 int64_t offset, int64_t length) const {
  const SlicedTensor* t = find(kind, name);
  if (t == nullptr) throw UserError(folder_ + ": the checkpoint has no " + kind + " " + name);
  if (!t->has_parts() && part.whole()) return read(kind, name, offset, length);
  const std::string what = kind + " " + name;
  if (t->strides != row_major_strides(t->sizes) || t->sizes.empty()) {
    throw UserError(folder_ + ": " + what + " is recorded in parts but is not a row-major tensor; the checkpoint is damaged");
  }
  if (!part.whole()) {
    for (const auto& [start, n] : part.ranges) {
      TORCH_CHECK(part.dim < static_cast<int64_t>(t->sizes.size()) &&
                      start + n <= t->sizes[static_cast<size_t>(part.dim)],
                  "SliceIndex::read_part: ", what, " has no such part");
    }
  }
  HostAllocationScope scope;
  const std::vector<int64_t> wanted_sizes = part_sizes(t->sizes, part);
  at::Tensor out = at::empty(wanted_sizes, at::TensorOptions().dtype(t->dtype));
  const std::vector<Box> wanted = boxes_of(t->sizes, part);
  std::map<SlicePart, std::vector<const SliceRecord*>> written;  // by the part they are of, by offset
  for (const SliceRecord& s : t->slices) written[s.part].push_back(&s);
  int64_t filled = 0;
  for (const auto& [written_part, records] : written) {
    const std::vector<Box> have = boxes_of(t->sizes, written_part);
    std::vector<std::pair<size_t, size_t>> overlaps;  // (have, wanted) boxes that share elements
    for (size_t h = 0; h < have.size(); ++h) {
      for (size_t w = 0; w < wanted.size(); ++w) {
        bool shared = true;
        for (size_t d = 0; d < t->sizes.size(); ++d) {
          shared = shared && std::max(have[h].start[d], wanted[w].start[d]) <
                                 std::min(have[h].start[d] + have[h].length[d], wanted[w].start[d] + wanted[w].length[d]);
        }
        if (shared) overlaps.emplace_back(h, w);
      }
    }
    if (overlaps.empty()) continue;
    const std::vector<int64_t> sizes = part_sizes(t->sizes, written_part);
    const at::Tensor source = assemble(*t, records, product(sizes), what).view(sizes);
    for (const auto& [h, w] : overlaps) {
      Box common;
      for (size_t d = 0; d < t->sizes.size(); ++d) {
        const int64_t from = std::max(have[h].start[d], wanted[w].start[d]);
        common.start.push_back(from);
        common.length.push_back(std::min(have[h].start[d] + have[h].length[d], wanted[w].start[d] + wanted[w].length[d]) - from);
      }
      view_of(out, part, wanted[w], common).copy_(view_of(source, written_part, have[h], common));
      filled += product(common.length);
    }
  }
  if (filled != out.numel()) {
    throw UserError(folder_ + ": the slices of " + what + " hold " + std::to_string(filled) + " of the " +
                    std::to_string(out.numel()) + " elements asked for (a rank's files missing, or parts that " +
                    "overlap); the checkpoint is damaged or incomplete");
  }
  return out.view({-1}).narrow(0, offset, length);
}

at::Tensor SliceIndex::whole(const std::string& kind, const std::string& name) const {
  const SlicedTensor* t = find(kind, name);
  if (t == nullptr) throw UserError(folder_ + ": the checkpoint has no " + kind + " " + name);
  int64_t numel = 1;
  for (int64_t s : t->sizes) numel *= s;
  HostAllocationScope scope;
  const at::Tensor like = at::empty_strided(t->sizes, t->strides, at::TensorOptions().dtype(t->dtype));
  return from_memory_order(read(kind, name, 0, numel), like);
}

}  // namespace ht
