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
//   slice <kind> <name> <dtype> <offset> <length> <byte at> <dims> <sizes...> <strides...> [part <dim> <n> <start> <length>...]
//   step <name> <count>            (AdamW's step count, by the rank holding the first element)
//
// A slice with "part" is a range of a tensor-parallel rank's part of the tensor instead of the
// whole's (SlicePart: n ranges along one dimension, concatenated, in row-major order; the sizes are
// still the whole tensor's). A reader asks for the part its own layout holds, whatever parts and
// pieces wrote it: resuming at another tensor-parallel count is the same read as at another
// data-parallel count.
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
#include <tuple>
#include <utility>
#include <vector>

namespace ht {

std::string slice_file_stem(int rank);  // "rank_00003"

// A part of a row-major tensor: `ranges` (start, length) along `dim`, concatenated in order. dim < 0:
// the whole tensor, in its own memory order.
struct SlicePart {
  int64_t dim = -1;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  bool whole() const { return dim < 0; }
  bool operator<(const SlicePart& o) const { return std::tie(dim, ranges) < std::tie(o.dim, o.ranges); }
  bool operator==(const SlicePart& o) const { return dim == o.dim && ranges == o.ranges; }
};

// One rank's two files. Streams: memory beyond one slice's bytes is never needed. Or held
// (checkpoint.async): every slice copied into host memory (pinned, from a GPU) as it is added, the
// files written later, by another thread, with write_to.
class SliceFileWriter {
 public:
  // Opens <folder>/rank_<r>.slices and .index; throws std::runtime_error if it cannot.
  SliceFileWriter(const std::string& folder, int rank, const std::string& optimizer);
  // Held: nothing is written until write_to.
  SliceFileWriter(int rank, const std::string& optimizer);
  ~SliceFileWriter();
  SliceFileWriter(const SliceFileWriter&) = delete;
  SliceFileWriter& operator=(const SliceFileWriter&) = delete;

  // `values`: `length` elements from `offset` of `like`'s memory order (any device; copied to
  // the host here). `like` gives the global sizes and strides, the values their dtype (an
  // optimizer's moments may be bf16 over an fp32 parameter).
  void add(const std::string& kind, const std::string& name, const at::Tensor& like, int64_t offset,
           const at::Tensor& values);
  // `values`: `length` elements from `offset` of `part`'s row-major order, of a tensor of `sizes`
  // (the whole's) and the values' dtype.
  void add_part(const std::string& kind, const std::string& name, const std::vector<int64_t>& sizes,
                const SlicePart& part, int64_t offset, const at::Tensor& values);
  void add_step(const std::string& name, int64_t count);
  // Flushes and fsyncs both files. {data bytes, data CRC-32, index bytes, index CRC-32}; throws
  // std::runtime_error where the disk refused a write.
  std::array<uint64_t, 4> finish();
  // Held: writes the two files into `folder` (opens, writes, finishes); the host copies go as
  // they are written. Any thread, once the adding is done.
  std::array<uint64_t, 4> write_to(const std::string& folder);
  // The bytes held in host memory (0 when streaming).
  int64_t held_bytes() const;

 private:
  struct Files;
  void record(const std::string& kind, const std::string& name, at::ScalarType dtype, at::IntArrayRef sizes,
              at::IntArrayRef strides, const SlicePart& part, int64_t offset, const at::Tensor& values);
  std::unique_ptr<Files> files_;
};

struct SliceRecord {
  std::string file;  // rank_<r>.slices
  int64_t offset = 0, length = 0;
  uint64_t byte_at = 0;
  SlicePart part;  // offset and length are in its order
};

struct SlicedTensor {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
  std::vector<SliceRecord> slices;  // by offset
  bool has_parts() const;
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
  // Elements [offset, offset + length) of `part`'s row-major order, 1-D, on the host, from whatever
  // parts and ranges were written (each written part that overlaps is read whole, one at a time).
  at::Tensor read_part(const std::string& kind, const std::string& name, const SlicePart& part, int64_t offset,
                       int64_t length) const;
  // The whole tensor in its recorded sizes and strides.
  at::Tensor whole(const std::string& kind, const std::string& name) const;

 private:
  // Elements [from, to) of `s`'s own order into `dst`.
  void read_record(const SliceRecord& s, int64_t from, int64_t to, int64_t element, char* dst,
                   const std::string& name) const;
  // Every element of the part that `records` (one written part's, by offset) hold, in its order.
  at::Tensor assemble(const SlicedTensor& t, const std::vector<const SliceRecord*>& records, int64_t numel,
                      const std::string& what) const;
  std::string folder_;
  std::string optimizer_ = "none";
  int ranks_ = 0;
  std::map<std::string, std::map<std::string, SlicedTensor>> tensors_;  // kind -> name -> slices
  std::map<std::string, int64_t> steps_;
};

}  // namespace ht
