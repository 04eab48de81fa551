#pragma once
// Writes token ids as one file in llm.c's format (launcher/data/token_files.h): a 1024-byte
// header (magic, version, token count, and in header[3] the vocabulary size and in header[4..5]
// the bytes of text encoded, which llm.c leaves 0) and the tokens, uint16 with magic 20240520 when the vocabulary fits in 65536 ids, else uint32
// with magic 20240801. Atomic: the tokens go to a temporary file beside the target; commit()
// writes the header (the count is known only then), fsyncs and renames. A writer destroyed
// without commit() removes its temporary file, so the target is either as it was or complete,
// never half written.

#include "launcher/data/token_files.h"

#include <cstdio>
#include <string>
#include <vector>

namespace ht {

class TokenFileWriter {
 public:
  // Throws UserError naming the file when its folder cannot be written.
  TokenFileWriter(std::string path, int64_t vocab_size);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // `text_bytes`: the bytes of text these ids encode (0: not known), summed into the header.
  void append(const std::vector<int>& ids, int64_t text_bytes = 0);
  int64_t tokens() const { return tokens_; }
  const TokenFormat& format() const { return format_; }
  const std::string& path() const { return path_; }
  // Header, fsync, rename: the file is complete under its name.
  void commit();

 private:
  void write(const void* data, size_t bytes);
  std::string path_, temp_;
  TokenFormat format_;
  std::FILE* file_ = nullptr;
  int64_t tokens_ = 0;
  int64_t text_bytes_ = 0;
  std::vector<unsigned char> buffer_;
};

// One call: the ids, written and committed.
void write_token_file(const std::string& path, const std::vector<int>& ids, int64_t vocab_size);

}  // namespace ht
