#pragma once
// Hugging Face's safetensors format, read and written without Python: the way weights leave the
// trainer (`hybrid_train export`) and come in (model.init_from). A file is an 8-byte
// little-endian header length N, N bytes of JSON ({name: {"dtype", "shape", "data_offsets":
// [begin, end]}, "__metadata__": {string: string}}), then the tensors' raw little-endian bytes,
// the offsets counted from the first byte after the header (huggingface/safetensors, README
// "Format"). Chosen over libtorch's own archives because every tool of that ecosystem reads it
// and it runs no code on load.
//
// Reading memory-maps the file (models of several GB cost address space, and each tensor is
// copied out only when asked for) and checks everything before a tensor is touched: the header
// length against the file, the JSON, each dtype, each shape against its byte span, each span
// inside the data and no two overlapping. A bad file is a UserError naming the file, the tensor
// and what was expected. Writing goes through a temporary name, fsync and rename: a file named
// PATH is complete, and a failed write leaves nothing.

#include "launcher/data/mapped_file.h"

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ht {

struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::string dtype_name;        // as the file spells it: "F32", "BF16", ...
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;    // byte range within the data section
};

class SafetensorsFile {
 public:
  // Maps and validates; UserError naming the file (and the tensor) when it is not a valid file.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  // In the order of their data.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A copy of the tensor in host memory, in the file's dtype.
  at::Tensor read(const SafetensorsEntry& entry) const;
  at::Tensor read(const std::string& name) const;

 private:
  MappedFile file_;
  int64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: its name, its shape, and how to make it. `make` is called once, when its
// bytes are due, so a large model is converted one tensor at a time.
struct SafetensorsOutput {
  std::string name;
  std::vector<int64_t> shape;
  std::function<at::Tensor()> make;
};

// Writes every tensor, converted to `dtype`, with `metadata` (Hugging Face's loaders want
// {"format": "pt"}), atomically. UserError naming the file when the disk lacks the room or
// refuses the write; nothing is left behind then.
void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors, at::ScalarType dtype,
                       const std::map<std::string, std::string>& metadata);

// "F32", "BF16", "F16", ... for a dtype; throws UserError for one the format has no name for here.
std::string safetensors_dtype_name(at::ScalarType dtype);

}  // namespace ht
