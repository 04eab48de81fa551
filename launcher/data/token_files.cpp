#include "launcher/data/token_files.h"

#include "base/user_error.h"

#include <algorithm>
#include <cstring>

namespace ht {
namespace {

int32_t int32_at(const unsigned char* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));  // little-endian, as llm.c writes it and every target reads it
  return v;
}

std::string at_byte(const std::string& path, int64_t byte) { return path + ": byte " + std::to_string(byte) + ": "; }

// llm.c's header: magic, version and token count, checked against the file's size.
TokenFormat read_header(const MappedFile& f, int64_t& tokens) {
  if (f.size() < kTokenHeaderBytes) {
    throw UserError(at_byte(f.path(), f.size()) + "the file ends inside llm.c's " + std::to_string(kTokenHeaderBytes) +
                    "-byte header (it has " + std::to_string(f.size()) + " bytes): truncated, or not a token file");
  }
  const int32_t magic = int32_at(f.data()), version = int32_at(f.data() + 4), count = int32_at(f.data() + 8);
  if (magic != kGpt2TokensMagic && magic != kLlama3TokensMagic) {
    throw UserError(at_byte(f.path(), 0) + "magic number " + std::to_string(magic) + ", expected " +
                    std::to_string(kGpt2TokensMagic) + " (llm.c, uint16 tokens) or " + std::to_string(kLlama3TokensMagic) +
                    " (llm.c, uint32 tokens); for a headerless file of tokens set data.token_dtype = \"uint16\" or "
                    "\"uint32\" (and data.vocab_size)");
  }
  TokenFormat format = llmc_format_for(magic == kGpt2TokensMagic ? 50257 : 128256);
  if (const int32_t stated = int32_at(f.data() + 12); stated > 0) {
    format.vocab_size = stated;
    format.vocab_stated = true;
  }
  format.text_bytes = static_cast<int64_t>(static_cast<uint32_t>(int32_at(f.data() + 16))) |
                      (static_cast<int64_t>(static_cast<uint32_t>(int32_at(f.data() + 20))) << 32);
  const int32_t expected_version = magic == kGpt2TokensMagic ? 1 : 7;
  if (version != expected_version) {
    throw UserError(at_byte(f.path(), 4) + "version " + std::to_string(version) + " for magic " + std::to_string(magic) +
                    ", expected " + std::to_string(expected_version) + ": not a format this reader knows");
  }
  const int64_t expected = kTokenHeaderBytes + static_cast<int64_t>(count) * format.token_bytes;
  if (count < 0 || expected != f.size()) {
    throw UserError(at_byte(f.path(), 8) + "the header counts " + std::to_string(count) + " tokens of " +
                    std::to_string(format.token_bytes) + " bytes, so the file should have " + std::to_string(expected) +
                    " bytes, and it has " + std::to_string(f.size()) +
                    (f.size() < expected ? ": truncated (copy or download it again)" : ": the count is wrong"));
  }
  tokens = count;
  return format;
}

TokenFormat headerless(const MappedFile& f, TokenDtype dtype, int64_t& tokens) {
  TokenFormat format;
  format.token_bytes = dtype == TokenDtype::kUint16 ? 2 : 4;
  const std::string key = std::string("data.token_dtype = \"") + choice_name(dtype) + "\"";
  if (f.size() >= kTokenHeaderBytes && (int32_at(f.data()) == kGpt2TokensMagic || int32_at(f.data()) == kLlama3TokensMagic)) {
    throw UserError(at_byte(f.path(), 0) + "this file starts with llm.c's header (magic " +
                    std::to_string(int32_at(f.data())) + "), and " + key +
                    " reads headerless files; set data.token_dtype = \"header\" (the default)");
  }
  if (f.size() % format.token_bytes != 0) {
    const int64_t cut = f.size() - f.size() % format.token_bytes;
    throw UserError(at_byte(f.path(), cut) + "the file's " + std::to_string(f.size()) + " bytes are not a multiple of " +
                    std::to_string(format.token_bytes) + " (" + key + "): its last token is cut off; check the dtype, "
                    "or whether the file is truncated");
  }
  tokens = f.size() / format.token_bytes;
  return format;
}

template <typename T>
void widen(const unsigned char* src, int64_t count, int64_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, src + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    out[i] = static_cast<int64_t>(v);
  }
}

// The largest id of `count` tokens: a loop the compiler vectorizes.
template <typename T>
int64_t largest_id(const unsigned char* src, int64_t count) {
  const T* p = reinterpret_cast<const T*>(src);  // the mapping is page-aligned and the header 1024 bytes
  T m = 0;
  for (int64_t i = 0; i < count; ++i) m = std::max(m, p[i]);
  return static_cast<int64_t>(m);
}

}  // namespace

std::string TokenFormat::name() const {
  const std::string type = token_bytes == 2 ? "uint16" : "uint32";
  return magic != 0 ? "llm.c magic " + std::to_string(magic) + ", " + type : "headerless " + type;
}

TokenFormat llmc_format_for(int64_t vocab_size) {
  TokenFormat f;
  const bool narrow = vocab_size <= 65536;
  f.magic = narrow ? kGpt2TokensMagic : kLlama3TokensMagic;
  f.token_bytes = narrow ? 2 : 4;
  f.vocab_size = vocab_size;
  return f;
}

TokenShard::TokenShard(const std::string& path, TokenDtype dtype) : file_(path) {
  format_ = dtype == TokenDtype::kHeader ? read_header(file_, tokens_) : headerless(file_, dtype, tokens_);
}

void TokenShard::read(int64_t first, int64_t count, int64_t* out) const {
  TORCH_INTERNAL_ASSERT(first >= 0 && count >= 0 && first + count <= tokens_, "TokenShard::read out of range");
  const unsigned char* src = file_.data() + byte_of(first);
  if (format_.token_bytes == 2) {
    widen<uint16_t>(src, count, out);
  } else {
    widen<uint32_t>(src, count, out);
  }
}

int64_t TokenShard::first_id_at_least(int64_t vocab_size, const std::function<void(int64_t)>& progress) const {
  constexpr int64_t kChunk = int64_t{1} << 24;  // tokens per pass: 32 or 64 MB
  file_.expect_sequential();
  int64_t found = -1;
  for (int64_t start = 0; start < tokens_ && found < 0; start += kChunk) {
    const int64_t n = std::min(kChunk, tokens_ - start);
    const unsigned char* src = file_.data() + byte_of(start);
    const int64_t top = format_.token_bytes == 2 ? largest_id<uint16_t>(src, n) : largest_id<uint32_t>(src, n);
    if (top >= vocab_size) {
      std::vector<int64_t> ids(static_cast<size_t>(n));
      read(start, n, ids.data());
      found = start + (std::find_if(ids.begin(), ids.end(), [&](int64_t id) { return id >= vocab_size; }) - ids.begin());
    }
    file_.release_pages(byte_of(start), byte_of(start + n) - byte_of(start));
    if (progress) progress(byte_of(start + n));
  }
  file_.expect_normal();
  return found;
}

TokenCorpus::TokenCorpus(std::vector<TokenShard> shards, int64_t block_size)
    : shards_(std::move(shards)), block_size_(block_size) {
  first_window_.push_back(0);
  for (const TokenShard& s : shards_) {
    if (s.tokens() < block_size_ + 1) {
      throw UserError(at_byte(s.path(), s.bytes()) + "the file ends after " + std::to_string(s.tokens()) +
                      " tokens, fewer than one window of model.block_size + 1 = " + std::to_string(block_size_ + 1) +
                      " (windows never cross files); use a smaller model.block_size, or leave this file out");
    }
    first_window_.push_back(first_window_.back() + (s.tokens() - 1) / block_size_);
  }
}

int64_t TokenCorpus::tokens() const {
  int64_t n = 0;
  for (const TokenShard& s : shards_) n += s.tokens();
  return n;
}

int64_t TokenCorpus::bytes() const {
  int64_t n = 0;
  for (const TokenShard& s : shards_) n += s.bytes();
  return n;
}

std::pair<int64_t, int64_t> TokenCorpus::locate(int64_t window) const {
  TORCH_INTERNAL_ASSERT(window >= 0 && window < windows(), "TokenCorpus: window ", window, " out of range");
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), window) - 1;
  const int64_t shard = it - first_window_.begin();
  return {shard, (window - *it) * block_size_};
}

void TokenCorpus::read_window(int64_t window, int64_t* input, int64_t* target) const {
  const auto [shard, first] = locate(window);
  shards_[static_cast<size_t>(shard)].read(first, block_size_, input);
  // The target is the input shifted by one: its last token is the window's (T+1)-th.
  std::memcpy(target, input + 1, static_cast<size_t>(block_size_ - 1) * sizeof(int64_t));
  shards_[static_cast<size_t>(shard)].read(first + block_size_, 1, target + block_size_ - 1);
}

TokenWindows::TokenWindows(std::shared_ptr<const TokenCorpus> corpus, int64_t first, int64_t count)
    : corpus_(std::move(corpus)), first_(first), count_(count) {
  TORCH_INTERNAL_ASSERT(first_ >= 0 && count_ >= 0 && first_ + count_ <= corpus_->windows(), "TokenWindows: bad range");
}

Batch TokenWindows::batch(const at::Tensor& indices) const {
  const at::Tensor idx = indices.to(at::kLong).contiguous();
  const int64_t n = idx.size(0), t = corpus_->block_size();
  Batch b{at::empty({n, t}, at::kLong), at::empty({n, t}, at::kLong)};
  const int64_t* i = idx.data_ptr<int64_t>();
  int64_t *input = b.input.data_ptr<int64_t>(), *target = b.target.data_ptr<int64_t>();
  for (int64_t k = 0; k < n; ++k) {
    TORCH_INTERNAL_ASSERT(i[k] >= 0 && i[k] < count_, "TokenWindows: sample ", i[k], " out of range");
    corpus_->read_window(first_ + i[k], input + k * t, target + k * t);
  }
  return b;
}

Batch TokenWindows::slice(int64_t start, int64_t count) const {
  return batch(at::arange(start, start + count, at::kLong));
}

}  // namespace ht
