#pragma once
// A checkpoint as slices: each rank writes the pieces of tensors it holds, and any reader takes
// whatever ranges it needs, whatever split wrote them (docs/design.md, "As built (issue 31, fifth
// part)"). A slice is a range [offset, offset + length) of a tensor's elements in *memory order*
// (channels-last weights are not row-major), recorded with the tensor's global sizes, strides
// and dtype, so that a range is the same elements for every reader.
//
// Rank r writes two files into the checkpoint's folder: rank_<r>.slices, the slices' raw bytes one
// after another (host byte order), and rank_<r>.index, a line per slice:
//
//   slice <kind> <name> <dtype> <offset> <length> <byte at> <dims> <sizes...> <strides...>
//   step <name> <count>            (AdamW's step count, by the rank holding the first element)
//   optimizer <adamw|sgd|none>
//
// Kinds: "param", "buffer", "state0" and "state1" (AdamW's exp_avg and exp_avg_sq; SGD's
// momentum is state0). The reader opens every index in the folder; reading a range reads, with
// pread, only the bytes of the slices that overlap it.

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ht {

std::string slice_file_stem(int rank);  // "rank_00003"

// One rank's two files. Streams: memory beyond one slice's bytes is never needed.
class SliceFileWriter {
 public:
  // Opens <folder>/rank_<r>.slices and .index; throws std::runtime_error if it cannot.
  SliceFileWriter(const std::string& folder, int rank, const std::string& optimizer);
  ~SliceFileWriter();
  SliceFileWriter(const SliceFileWriter&) = delete;
  SliceFileWriter& operator=(const SliceFileWriter&) = delete;

  // `values`: `length` elements from `offset` of `like`'s memory order (any device; copied to
  // the host here). `like` gives the global sizes, strides and dtype.
  void add(const std::string& kind, const std::string& name, const at::Tensor& like, int64_t offset,
           const at::Tensor& values);
  void add_step(const std::string& name, int64_t count);
  // Flushes and fsyncs both files. {data bytes, data CRC-32, index bytes, index CRC-32}; throws
  // std::runtime_error where the disk refused a write.
  std::array<uint64_t, 4> finish();

 private:
  struct Files;
  std::unique_ptr<Files> files_;
};

struct SliceRecord {
  std::string file;  // rank_<r>.slices
  int64_t offset = 0, length = 0;
  uint64_t byte_at = 0;
};

struct SlicedTensor {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
  std::vector<SliceRecord> slices;  // by offset
};

class SliceIndex {
 public:
  // True where `folder` holds rank_*.index files.
  static bool present(const std::string& folder);
  // Reads every index; UserError naming the file and line where one is malformed.
  explicit SliceIndex(std::string folder);

  const std::string& folder() const { return folder_; }
  const std::string& optimizer() const { return optimizer_; }
  int ranks() const { return ranks_; }
  // Names of one kind's tensors, sorted.
  std::vector<std::string> names(const std::string& kind) const;
  const SlicedTensor* find(const std::string& kind, const std::string& name) const;
  std::optional<int64_t> step(const std::string& name) const;

  // Elements [offset, offset + length) of the tensor's memory order, 1-D, on the host; UserError
  // if no slice holds some of them.
  at::Tensor read(const std::string& kind, const std::string& name, int64_t offset, int64_t length) const;
  // The whole tensor in its recorded sizes and strides.
  at::Tensor whole(const std::string& kind, const std::string& name) const;

 private:
  std::string folder_;
  std::string optimizer_ = "none";
  int ranks_ = 0;
  std::map<std::string, std::map<std::string, SlicedTensor>> tensors_;  // kind -> name -> slices
  std::map<std::string, int64_t> steps_;
};

}  // namespace ht
