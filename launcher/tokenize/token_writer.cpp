#include "launcher/tokenize/token_writer.h"

#include "launcher/data/byte_progress.h"
#include "base/user_error.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

namespace ht {

TokenFileWriter::TokenFileWriter(std::string path, int64_t vocab_size)
    : path_(std::move(path)), temp_(path_ + ".tmp." + std::to_string(::getpid())), format_(llmc_format_for(vocab_size)) {
  file_ = std::fopen(temp_.c_str(), "wb");
  if (file_ == nullptr) {
    throw UserError(path_ + ": cannot write here (" + std::strerror(errno) + "); give an output path in a folder "
                    "that exists and can be written");
  }
  const std::array<int32_t, 256> header{};  // written for real by commit()
  write(header.data(), sizeof(header));
}

TokenFileWriter::~TokenFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(temp_.c_str());
  }
}

void TokenFileWriter::write(const void* data, size_t bytes) {
  if (std::fwrite(data, 1, bytes, file_) != bytes) {
    throw UserError(path_ + ": writing failed after " + std::to_string(tokens_) + " tokens (" + std::strerror(errno) +
                    "); nothing was kept. Free space there, or write the output to a disk with room");
  }
}

void TokenFileWriter::append(const std::vector<int>& ids, int64_t text_bytes) {
  text_bytes_ += text_bytes;
  if (tokens_ + static_cast<int64_t>(ids.size()) > std::numeric_limits<int32_t>::max()) {
    throw UserError(path_ + ": more than " + grouped(std::numeric_limits<int32_t>::max()) + " tokens, the most "
                    "llm.c's header counts; tokenize the input in parts, one --output each (data.path takes a glob "
                    "of them)");
  }
  buffer_.resize(ids.size() * static_cast<size_t>(format_.token_bytes));
  for (size_t i = 0; i < ids.size(); ++i) {
    TORCH_INTERNAL_ASSERT(ids[i] >= 0 && ids[i] < format_.vocab_size, "token id ", ids[i], " outside the vocabulary");
    if (format_.token_bytes == 2) {
      const uint16_t v = static_cast<uint16_t>(ids[i]);
      std::memcpy(buffer_.data() + 2 * i, &v, 2);
    } else {
      const uint32_t v = static_cast<uint32_t>(ids[i]);
      std::memcpy(buffer_.data() + 4 * i, &v, 4);
    }
  }
  write(buffer_.data(), buffer_.size());
  tokens_ += static_cast<int64_t>(ids.size());
}

void TokenFileWriter::commit() {
  std::array<int32_t, 256> header{};
  header[0] = format_.magic;
  header[1] = format_.magic == kGpt2TokensMagic ? 1 : 7;
  header[2] = static_cast<int32_t>(tokens_);
  header[3] = static_cast<int32_t>(format_.vocab_size);  // ours: llm.c leaves it 0 (token_files.h)
  header[4] = static_cast<int32_t>(text_bytes_ & 0xffffffff);  // ours too: the text's bytes, low and
  header[5] = static_cast<int32_t>(text_bytes_ >> 32);         // high halves (bits per byte)
  if (std::fseek(file_, 0, SEEK_SET) != 0) throw UserError(path_ + ": cannot seek in its temporary file " + temp_);
  write(header.data(), sizeof(header));
  const bool flushed = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const int err = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed || std::rename(temp_.c_str(), path_.c_str()) != 0) {
    std::remove(temp_.c_str());
    throw UserError(path_ + ": could not finish writing (" + std::strerror(flushed && closed ? errno : err) +
                    "); nothing was kept. Free space there, or write the output to a disk with room");
  }
}

void write_token_file(const std::string& path, const std::vector<int>& ids, int64_t vocab_size) {
  TokenFileWriter writer(path, vocab_size);
  writer.append(ids);
  writer.commit();
}

}  // namespace ht
