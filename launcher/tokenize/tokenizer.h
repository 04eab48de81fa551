#pragma once
// A subword tokenizer: SentencePiece (Kudo and Richardson 2018), BPE or unigram, trained on the
// user's text or loaded from a .model file. Trained so that decoding gives back the text it
// encoded: no normalization (identity), whitespace kept as it is (no dummy prefix, no collapsing
// of runs), newlines a piece of their own, and byte fallback, so every byte of UTF-8 text has
// tokens (what the pieces do not cover is spelled as <0xNN> bytes). Two exceptions: bytes that are
// not valid UTF-8 come back as U+FFFD, and the character U+2581 (SentencePiece's own mark for a
// space) comes back as a space.
//
// `hybrid_train tokenize` (tokenize_command.h) and data.tokenizer use it; a later `sample`
// command decodes with it. Without SentencePiece at build time (the GPU machine's build, no
// Debian packages) every entry point is a UserError saying so (tokenizer_built()).

#include "base/choice.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ht {

enum class TokenizerModel : uint8_t { kBpe, kUnigram };
template <>
struct ChoiceNames<TokenizerModel> {
  static constexpr std::pair<TokenizerModel, const char*> table[] = {{TokenizerModel::kBpe, "bpe"},
                                                                     {TokenizerModel::kUnigram, "unigram"}};
};

struct TokenizerTraining {
  std::vector<std::string> files;  // the text, line by line (empty lines skipped)
  int64_t vocab_size = 4096;
  TokenizerModel model = TokenizerModel::kBpe;
  // At most this many lines are sampled (uniformly, SentencePiece's reservoir) to train on:
  // bounds training's time and memory on a big corpus; the encoding covers every line.
  int64_t max_sentences = 1000000;
  int threads = 0;  // 0: the hardware's
};

class Tokenizer {
 public:
  // Throws UserError naming the file when it is missing or not a SentencePiece model.
  static Tokenizer load(const std::string& model_path);
  // Throws UserError with SentencePiece's complaint (e.g. a vocabulary too large for the text).
  static Tokenizer train(const TokenizerTraining& training);

  // Writes PREFIX.model and PREFIX.vocab (one "piece<TAB>score" line per id), each atomically.
  void save(const std::string& prefix) const;

  // Text to ids; long text is cut at newlines into pieces encoded on several threads.
  std::vector<int> encode(std::string_view text) const;
  std::string decode(const std::vector<int>& ids) const;
  int64_t vocab_size() const;
  int eos_id() const;  // the end-of-document id, or -1

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Whether this build has SentencePiece.
bool tokenizer_built();

}  // namespace ht
