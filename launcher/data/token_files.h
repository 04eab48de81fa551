#pragma once
// Token files as a dataset (data.dataset = "tokens"), the form large corpora come in: llm.c's
// .bin shards (a header of 256 little-endian int32: magic, version, token count, zeros; then the
// tokens, uint16 for magic 20240520 (GPT-2's vocabulary), uint32 for magic 20240801 (Llama 3's)),
// or headerless uint16/uint32 arrays as nanoGPT-derived pipelines write them (data.token_dtype).
//
// Files are memory-mapped read-only, never read into memory: a 10 GB corpus costs address space,
// and a batch reads only its own windows from the page cache. A sample is a window of
// block_size + 1 tokens (input: the first block_size, target: the same shifted by one); windows
// step by block_size and never cross a shard's end, so sample i is (shard, offset) with offset a
// multiple of block_size. Every file is checked when opened (header, size, length, and every
// token id below the vocabulary: one chunked pass over the mapping); a bad one is a UserError
// naming the file, the byte offset and what was expected.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "launcher/data/mapped_file.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ht {

constexpr int64_t kTokenHeaderBytes = 256 * 4;
constexpr int32_t kGpt2TokensMagic = 20240520;    // version 1: uint16 tokens, GPT-2's 50257 ids
constexpr int32_t kLlama3TokensMagic = 20240801;  // version 7: uint32 tokens, Llama 3's 128256 ids

// How a file stores its tokens.
struct TokenFormat {
  int32_t magic = 0;       // 0: headerless
  int token_bytes = 2;     // 2 (uint16) or 4 (uint32)
  // The vocabulary the header implies (50257 or 128256), or states: hybrid_train tokenize writes
  // its tokenizer's size into header[3], which llm.c leaves 0 and its readers ignore. 0: headerless.
  int64_t vocab_size = 0;
  bool vocab_stated = false;  // vocab_size came from header[3]
  // Bytes of text the tokens encode, from header[4..5] (hybrid_train tokenize writes them); 0: unknown.
  int64_t text_bytes = 0;
  int64_t header_bytes() const { return magic != 0 ? kTokenHeaderBytes : 0; }
  std::string name() const;  // "llm.c magic 20240520, uint16" or "headerless uint32"
};

// llm.c's format for a vocabulary: uint16 (magic 20240520) when every id fits, else uint32 (20240801).
TokenFormat llmc_format_for(int64_t vocab_size);

// One token file, mapped and checked (header or size; not yet the ids, see first_id_at_least).
class TokenShard {
 public:
  TokenShard(const std::string& path, TokenDtype dtype);
  const std::string& path() const { return file_.path(); }
  const TokenFormat& format() const { return format_; }
  int64_t tokens() const { return tokens_; }
  int64_t bytes() const { return file_.size(); }
  int64_t byte_of(int64_t token) const { return format_.header_bytes() + token * format_.token_bytes; }
  // Tokens [first, first + count) as int64.
  void read(int64_t first, int64_t count, int64_t* out) const;
  // The index of the first token >= vocab_size, or -1: one pass in chunks, calling
  // progress(bytes of this file done) after each.
  int64_t first_id_at_least(int64_t vocab_size, const std::function<void(int64_t)>& progress) const;

 private:
  MappedFile file_;
  TokenFormat format_;
  int64_t tokens_ = 0;
};

// Shards in order, their windows numbered one after another.
class TokenCorpus {
 public:
  // Throws UserError for a shard shorter than one window (block_size + 1 tokens).
  TokenCorpus(std::vector<TokenShard> shards, int64_t block_size);
  int64_t windows() const { return first_window_.back(); }
  int64_t block_size() const { return block_size_; }
  int64_t tokens() const;
  int64_t bytes() const;
  const std::vector<TokenShard>& shards() const { return shards_; }
  // Window w as (shard, first token): window k of a shard starts at its token k * block_size.
  std::pair<int64_t, int64_t> locate(int64_t window) const;
  // input[0..T) and target[0..T) of window w (T = block_size).
  void read_window(int64_t window, int64_t* input, int64_t* target) const;

 private:
  std::vector<TokenShard> shards_;
  std::vector<int64_t> first_window_;  // per shard, then the total
  int64_t block_size_;
};

// Windows [first, first + count) of a corpus as a dataset: batches of (n, T) int64 inputs and targets.
class TokenWindows : public Dataset {
 public:
  TokenWindows(std::shared_ptr<const TokenCorpus> corpus, int64_t first, int64_t count);
  int64_t size() const override { return count_; }
  Batch batch(const at::Tensor& indices) const override;
  Batch slice(int64_t start, int64_t count) const override;

 private:
  std::shared_ptr<const TokenCorpus> corpus_;
  int64_t first_, count_;
};

// Opens the files of data.path (and data.eval_path, or holds out the last data.eval_fraction of
// the windows), checks every token id against the vocabulary (data.vocab_size, else the
// header's), and returns the splits. Errors name the config, the key and the file.
DataSplits make_token_splits(const Config& config, bool show_progress);

}  // namespace ht
