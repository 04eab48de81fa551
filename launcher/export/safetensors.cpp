#include "launcher/export/safetensors.h"

#include "base/user_error.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

namespace ht {
namespace safetensors_impl {

using nlohmann::json;

// The dtypes of the format that ATen holds (huggingface/safetensors, Dtype). U16, U32, U64 and
// the 8-bit floats have no ATen type in every libtorch this builds with: refused by name.
constexpr std::pair<const char*, at::ScalarType> kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool}};

// Headers above this are refused before parsing (the reference implementation's limit).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Bytes of `shape` in `dtype`, or -1 on overflow.
int64_t byte_size(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
  for (int64_t d : shape) {
    if (d != 0 && bytes > std::numeric_limits<int64_t>::max() / d) return -1;
    bytes *= d;
  }
  return bytes;
}

// One header entry, checked on its own: fields, dtype, shape and span.
SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& value, int64_t data_bytes) {
  const std::string where = path + ": tensor " + name;
  if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
    throw UserError(where + ": its header entry must be an object with dtype, shape and data_offsets, got " +
                    value.dump().substr(0, 200));
  }
  SafetensorsEntry e;
  e.name = name;
  const json& dtype = value["dtype"];
  if (!dtype.is_string()) throw UserError(where + ": dtype must be a string such as \"F32\", got " + dtype.dump());
  e.dtype_name = dtype.get<std::string>();
  const auto* known = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                   [&](const auto& d) { return e.dtype_name == d.first; });
  if (known == std::end(kDtypes)) {
    throw UserError(where + ": dtype \"" + e.dtype_name + "\" is not one this reader knows (F64, F32, F16, BF16, "
                    "I64, I32, I16, I8, U8, BOOL)");
  }
  e.dtype = known->second;
  const json& shape = value["shape"];
  if (!shape.is_array()) throw UserError(where + ": shape must be a list of sizes, got " + shape.dump());
  for (const json& d : shape) {
    if (!d.is_number_unsigned()) throw UserError(where + ": shape must hold sizes of 0 or more, got " + shape.dump());
    e.shape.push_back(d.get<int64_t>());
  }
  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
    throw UserError(where + ": data_offsets must be [begin, end], got " + offsets.dump());
  }
  e.begin = offsets[0].get<int64_t>();
  e.end = offsets[1].get<int64_t>();
  if (e.begin < 0 || e.end < e.begin) throw UserError(where + ": data_offsets " + offsets.dump() + " are not a range");
  if (e.end > data_bytes) {
    throw UserError(where + ": data_offsets " + offsets.dump() + " reach past the end of the data (" +
                    std::to_string(data_bytes) + " bytes after the header); the file is truncated or damaged");
  }
  const int64_t need = byte_size(e.shape, e.dtype);
  if (need != e.end - e.begin) {
    throw UserError(where + ": shape " + shape_text(e.shape) + " of " + e.dtype_name + " needs " + std::to_string(need) +
                    " bytes, but data_offsets " + offsets.dump() + " span " + std::to_string(e.end - e.begin));
  }
  return e;
}

void parse_metadata(const std::string& path, const json& value, std::map<std::string, std::string>& out) {
  if (!value.is_object()) throw UserError(path + ": __metadata__ must be an object of strings, got " + value.dump());
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) throw UserError(path + ": __metadata__." + key + " must be a string, got " + v.dump());
    out[key] = v.get<std::string>();
  }
}

}  // namespace safetensors_impl

SafetensorsFile::SafetensorsFile(const std::string& path) {
  using namespace safetensors_impl;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw UserError(path + ": no such file; give a .safetensors file");
  if (!S_ISREG(st.st_mode)) throw UserError(path + ": not a regular file; give a .safetensors file");
  file_ = MappedFile(path);
  const int64_t size = file_.size();
  if (size < 8) {
    throw UserError(path + ": " + std::to_string(size) + " bytes, too short for a safetensors file (an 8-byte header "
                    "length, then the header)");
  }
  uint64_t n = 0;
  std::memcpy(&n, file_.data(), 8);  // little-endian, as every host this builds for
  if (n > kMaxHeaderBytes || n > static_cast<uint64_t>(size - 8)) {
    throw UserError(path + ": the header length says " + std::to_string(n) + " bytes but the file holds " +
                    std::to_string(size - 8) + " after it; the file is truncated or not a safetensors file");
  }
  data_start_ = 8 + static_cast<int64_t>(n);
  json header;
  try {
    header = json::parse(file_.data() + 8, file_.data() + data_start_);
  } catch (const json::parse_error& e) {
    throw UserError(path + ": the header is not valid JSON (" + e.what() + "); is this a safetensors file?");
  }
  if (!header.is_object()) throw UserError(path + ": the header must be a JSON object of tensors");
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      parse_metadata(path, value, metadata_);
    } else {
      entries_.push_back(parse_entry(path, name, value, size - data_start_));
    }
  }
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < entries_.size(); ++i) {
    const SafetensorsEntry &a = entries_[i - 1], &b = entries_[i];
    if (b.begin < a.end) {
      throw UserError(path + ": tensors " + a.name + " [" + std::to_string(a.begin) + ", " + std::to_string(a.end) +
                      ") and " + b.name + " [" + std::to_string(b.begin) + ", " + std::to_string(b.end) +
                      ") overlap; each tensor needs bytes of its own");
    }
  }
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

at::Tensor SafetensorsFile::read(const SafetensorsEntry& e) const {
  // A copy, not a view of the mapping: ATen's kernels may assume an alignment the file's
  // offsets do not promise, and the tensor outlives nothing.
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (e.end > e.begin) std::memcpy(t.data_ptr(), file_.data() + data_start_ + e.begin, static_cast<size_t>(e.end - e.begin));
  return t;
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) throw UserError(path() + ": no tensor " + name + " in it");
  return read(*e);
}

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& [name, type] : safetensors_impl::kDtypes) {
    if (type == dtype) return name;
  }
  throw UserError(std::string("dtype ") + c10::toString(dtype) + " has no safetensors name here");
}

namespace safetensors_impl {

// The header's bytes, padded with spaces so that the data starts 8-byte aligned (as the
// reference writer does).
std::string header_bytes(const std::vector<SafetensorsOutput>& tensors, at::ScalarType dtype,
                         const std::map<std::string, std::string>& metadata, int64_t& data_bytes) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  const std::string name = safetensors_dtype_name(dtype);
  data_bytes = 0;
  for (const SafetensorsOutput& t : tensors) {
    const int64_t bytes = byte_size(t.shape, dtype);
    header[t.name] = {{"dtype", name}, {"shape", t.shape}, {"data_offsets", {data_bytes, data_bytes + bytes}}};
    data_bytes += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void write_all(std::ofstream& out, const std::string& tmp, const std::vector<SafetensorsOutput>& tensors,
               at::ScalarType dtype, const std::string& header) {
  const uint64_t n = header.size();
  char length[8];
  std::memcpy(length, &n, 8);
  out.write(length, 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const SafetensorsOutput& t : tensors) {
    const at::Tensor value = t.make().detach().to(at::kCPU).to(dtype).contiguous();
    TORCH_CHECK(value.sizes() == at::IntArrayRef(t.shape), "safetensors: ", t.name, " was declared ",
                shape_text(t.shape), " but made ", value.sizes());
    out.write(static_cast<const char*>(value.data_ptr()), static_cast<std::streamsize>(value.nbytes()));
    if (!out) throw UserError(tmp + ": the disk refused the write (full, or a quota)");
  }
  out.flush();
  if (!out) throw UserError(tmp + ": the disk refused the write (full, or a quota)");
}

}  // namespace safetensors_impl

void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors, at::ScalarType dtype,
                       const std::map<std::string, std::string>& metadata) {
  namespace fs = std::filesystem;
  int64_t data_bytes = 0;
  const std::string header = safetensors_impl::header_bytes(tensors, dtype, metadata, data_bytes);
  const fs::path target(path);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  const fs::space_info space = fs::space(folder, ec);
  const uint64_t needed = 8 + header.size() + static_cast<uint64_t>(data_bytes);
  if (!ec && space.available < needed) {
    throw UserError(path + ": not enough free space: it needs " + std::to_string(needed) + " bytes, " +
                    std::to_string(space.available) + " are free there; nothing was written");
  }
  const std::string tmp = path + ".tmp";
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) throw UserError(tmp + ": cannot create it; is the folder writable?");
      safetensors_impl::write_all(out, tmp, tensors, dtype, header);
    }
    const int fd = ::open(tmp.c_str(), O_RDONLY);
    if (fd < 0 || ::fsync(fd) != 0) {
      if (fd >= 0) ::close(fd);
      throw UserError(tmp + ": fsync failed; is the disk full?");
    }
    ::close(fd);
    fs::rename(tmp, target);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
}

}  // namespace ht
