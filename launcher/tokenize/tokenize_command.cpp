#include "launcher/tokenize/tokenize_command.h"
#include "base/clock.h"

#include "launcher/data/byte_progress.h"
#include "launcher/data/file_glob.h"
#include "launcher/tokenize/token_writer.h"
#include "base/user_error.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

namespace ht {
namespace {

namespace fs = std::filesystem;

constexpr size_t kBlockBytes = size_t{16} << 20;  // text encoded at a time: bounds memory on huge files

std::string join_inputs(const std::vector<std::string>& inputs) {
  std::string out;
  for (const std::string& input : inputs) out += (out.empty() ? "" : " ") + input;
  return out;
}

// The folder `path` goes into must exist and take a new file, and `path` must not be a folder:
// checked before the tokenizer trains, so that a run that cannot write its output writes nothing
// (a probe file is made and removed in the folder, as the writers make theirs there).
void check_writable_target(const std::string& option, const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    throw UserError(option + " " + path + ": the folder " + parent.string() + " does not exist; create it first");
  }
  if (fs::is_directory(path, ec)) throw UserError(option + " " + path + ": is a folder; give a file name, e.g. " + path + "/tokens.bin");
  const fs::path probe = (parent.empty() ? fs::path(".") : parent) /
                         ("." + fs::path(path).filename().string() + ".probe-" + std::to_string(getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    throw UserError(option + " " + path + ": cannot write in the folder " + (parent.empty() ? std::string(".") : parent.string()) +
                    " (" + std::strerror(errno) + "); give a path in a folder you can write to");
  }
  ::close(fd);
  fs::remove(probe, ec);
}

void check_arguments(const TokenizeArgs& a) {
  if (a.inputs.empty()) {
    throw UserError("--input is required: text files, globs or folders, e.g. --input "
                    "'/usr/share/doc/python3.11/html/_sources/**/*.rst.txt'");
  }
  if (a.model.empty() == a.model_prefix.empty()) {
    throw UserError(a.model.empty() ? "give --model-prefix PREFIX (train a tokenizer, writing PREFIX.model and PREFIX.vocab) "
                                      "or --model FILE.model (use one trained before)"
                                    : "--model and --model-prefix both given; use --model FILE.model to encode with an "
                                      "existing tokenizer, or --model-prefix PREFIX to train a new one");
  }
  if (!a.model.empty() && a.output.empty()) {
    throw UserError("--model " + a.model + " without --output: nothing to do; add --output PATH.bin for the token file");
  }
  if (a.eval_fraction > 0 && a.output.empty()) {
    throw UserError("--eval-fraction needs --output PATH.bin (the held-out tokens go to PATH_val.bin)");
  }
  if (!a.model_prefix.empty()) check_writable_target("--model-prefix", a.model_prefix + ".model");
  if (!a.output.empty()) check_writable_target("--output", a.output);
  if (a.overwrite) return;
  // A run trained with a tokenizer reads its ids from it: replaced, the same text gets other ids,
  // and the run's checkpoints read nonsense. Nothing is replaced without a word.
  std::error_code ec;
  if (!a.model_prefix.empty()) {
    for (const char* suffix : {".model", ".vocab"}) {
      const std::string file = a.model_prefix + suffix;
      if (!fs::exists(file, ec)) continue;
      throw UserError("--model-prefix " + a.model_prefix + ": " + file + " exists, and a run trained with that tokenizer "
                      "reads its token ids from it (a new one gives the same text other ids); give another "
                      "--model-prefix, encode with it (--model " + a.model_prefix + ".model), or add --overwrite to "
                      "replace it");
    }
  }
  if (!a.output.empty()) {
    for (const std::string& file : {a.output, eval_output_path(a.output)}) {
      if (file == eval_output_path(a.output) && a.eval_fraction <= 0) continue;
      if (!fs::exists(file, ec)) continue;
      throw UserError("--output " + a.output + ": " + file + " exists (a run may train on it); give another --output, "
                      "or add --overwrite to replace it");
    }
  }
}

std::vector<std::string> input_files(const std::vector<std::string>& inputs, int64_t& bytes) {
  std::vector<std::string> files;
  bytes = 0;
  for (const std::string& input : inputs) {
    const std::vector<std::string> matched = match_files(input, /*folders_recursively=*/true);
    if (matched.empty()) {
      throw UserError("--input " + input + ": " + (has_wildcards(input) ? "no file matches this pattern" : "no such file or folder") +
                      "; give text files, globs (quoted, ** for any depth: 'docs/**/*.txt') or folders");
    }
    for (const std::string& f : matched) {
      files.push_back(f);
      bytes += static_cast<int64_t>(fs::file_size(f));
    }
  }
  return files;
}

Tokenizer make_tokenizer(const TokenizeArgs& a, const std::vector<std::string>& files, int64_t bytes) {
  if (!a.model.empty()) {
    try {
      return Tokenizer::load(a.model);
    } catch (const UserError& e) {
      throw UserError("--model " + a.model + ": " + e.what());
    }
  }
  std::printf("training a %s tokenizer of %lld pieces on %zu file(s), %s (at most %s lines sampled) ...\n",
              choice_name(a.model_type), static_cast<long long>(a.vocab_size), files.size(), decimal_bytes(bytes).c_str(),
              grouped(a.max_sentences).c_str());
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  TokenizerTraining training;
  training.files = files;
  training.vocab_size = a.vocab_size;
  training.model = a.model_type;
  training.max_sentences = a.max_sentences;
  Tokenizer tokenizer = Tokenizer::train(training);
  tokenizer.save(a.model_prefix);
  std::printf("trained in %.1f s: %s.model, %s.vocab\n", seconds_since(start), a.model_prefix.c_str(),
              a.model_prefix.c_str());
  return tokenizer;
}

// Reads a file in blocks that end at a line's end (or the file's), each at most about `limit`
// bytes long (a line longer than that comes whole).
class LineBlocks {
 public:
  explicit LineBlocks(const std::string& path) : in_(path, std::ios::binary) {
    if (!in_) throw UserError("--input: " + path + ": cannot read this file");
  }
  // The next block: at least `limit` bytes (where the file has them), up to the end of that line.
  // False at the file's end.
  bool next(size_t limit, std::string& block) {
    size_t newline = std::string::npos;
    while (true) {
      if (pending_.size() >= limit) newline = pending_.find('\n', limit - 1);
      if (newline != std::string::npos || eof_) break;
      const size_t old = pending_.size();
      pending_.resize(old + std::max(limit, size_t{1} << 16));
      in_.read(pending_.data() + old, static_cast<std::streamsize>(pending_.size() - old));
      pending_.resize(old + static_cast<size_t>(in_.gcount()));
      eof_ = !in_;
    }
    if (pending_.empty()) return false;
    const size_t end = newline == std::string::npos ? pending_.size() : newline + 1;
    block.assign(pending_, 0, end);
    pending_.erase(0, end);
    return true;
  }

 private:
  std::ifstream in_;
  std::string pending_;
  bool eof_ = false;
};

struct Outputs {
  std::unique_ptr<TokenFileWriter> train, eval;
  int64_t eval_from_byte = 0;  // text from this byte of the input on goes to eval
};

int64_t encode_files(const Tokenizer& tokenizer, const std::vector<std::string>& files, int64_t total, Outputs& out) {
  ByteProgress progress("tokenizing", total, true);
  int64_t done = 0;
  std::string block;
  for (const std::string& file : files) {
    LineBlocks blocks(file);
    while (true) {
      const bool to_eval = out.eval && done >= out.eval_from_byte;
      // Up to the eval split, then in blocks again: the split falls at the first line's end after it.
      const int64_t until_split = out.eval && !to_eval ? out.eval_from_byte - done : int64_t{kBlockBytes};
      if (!blocks.next(static_cast<size_t>(std::clamp<int64_t>(until_split, 1, kBlockBytes)), block)) break;
      (to_eval ? *out.eval : *out.train).append(tokenizer.encode(block), static_cast<int64_t>(block.size()));
      done += static_cast<int64_t>(block.size());
      progress.update(done, grouped(out.train->tokens() + (out.eval ? out.eval->tokens() : 0)) + " tokens");
    }
    if (tokenizer.eos_id() >= 0) {  // the end of a document: never inside one
      const bool to_eval = out.eval && done >= out.eval_from_byte;
      (to_eval ? *out.eval : *out.train).append({tokenizer.eos_id()});
    }
  }
  progress.finish();
  return done;
}

}  // namespace

std::string eval_output_path(const std::string& output) {
  const std::string ext = ".bin";
  if (output.size() > ext.size() && output.compare(output.size() - ext.size(), ext.size(), ext) == 0) {
    return output.substr(0, output.size() - ext.size()) + "_val.bin";
  }
  return output + "_val.bin";
}

int run_tokenize_command(const TokenizeArgs& args) {
  check_arguments(args);
  int64_t bytes = 0;
  const std::vector<std::string> files = input_files(args.inputs, bytes);
  if (bytes == 0) {
    throw UserError("--input " + join_inputs(args.inputs) + ": " + std::to_string(files.size()) +
                    " file(s), all empty: no text to tokenize; give files that hold text");
  }
  if (!tokenizer_built()) Tokenizer::load("");  // says what this build lacks
  const Tokenizer tokenizer = make_tokenizer(args, files, bytes);
  if (args.output.empty()) return 0;
  const auto start = std::chrono::steady_clock::now();
  Outputs out;
  out.train = std::make_unique<TokenFileWriter>(args.output, tokenizer.vocab_size());
  if (args.eval_fraction > 0) {
    out.eval = std::make_unique<TokenFileWriter>(eval_output_path(args.output), tokenizer.vocab_size());
    out.eval_from_byte = static_cast<int64_t>(static_cast<double>(bytes) * (1 - args.eval_fraction));
  }
  encode_files(tokenizer, files, bytes, out);
  out.train->commit();
  if (out.eval) out.eval->commit();
  const int64_t tokens = out.train->tokens() + (out.eval ? out.eval->tokens() : 0);
  std::printf("wrote %s: %s tokens", args.output.c_str(), grouped(out.train->tokens()).c_str());
  if (out.eval) std::printf("; %s: %s tokens", out.eval->path().c_str(), grouped(out.eval->tokens()).c_str());
  std::printf(" (%s) in %.1f s\n%s of text in %zu file(s): %.2f bytes per token; vocabulary %lld\n",
              out.train->format().name().c_str(), seconds_since(start), decimal_bytes(bytes).c_str(), files.size(),
              tokens > 0 ? static_cast<double>(bytes) / static_cast<double>(tokens) : 0.0,
              static_cast<long long>(tokenizer.vocab_size()));
  return 0;
}

}  // namespace ht
