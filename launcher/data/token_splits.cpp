// data.dataset = "tokens": the training and evaluation splits from data.path and data.eval_path
// (or the tail of data.path's windows), every file checked once when opened (token_files.h).
#include "launcher/data/byte_progress.h"
#include "launcher/data/file_glob.h"
#include "launcher/data/token_files.h"
#include "launcher/tokenize/tokenizer.h"
#include "base/user_error.h"

#include <filesystem>
#include <sstream>

namespace ht {
namespace {

// Checks below this many bytes in all say nothing: they take well under a second.
constexpr int64_t kQuietCheckBytes = int64_t{256} << 20;

// A UserError while reading a key's files, prefixed with the config and the key.
template <typename F>
auto reading_key(const Config& c, const char* key, const std::string& value, F&& read) {
  try {
    return read();
  } catch (const UserError& e) {
    throw UserError(c.source + ": " + key + " = \"" + value + "\": " + e.what());
  }
}

std::vector<TokenShard> open_shards(const std::string& pattern, TokenDtype dtype) {
  const std::vector<std::string> paths = match_files(pattern);
  if (paths.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(pattern, ec)) {
      throw UserError("a folder, and token files are named one by one or by a glob: give e.g. \"" +
                      (std::filesystem::path(pattern) / "*.bin").string() + "\" (hybrid_train tokenize writes them from text)");
    }
    throw UserError(has_wildcards(pattern)
                        ? "no file matches this pattern; check the folder and the names (e.g. \"data/fineweb_train_*.bin\")"
                        : "no such file; give a token file or a glob of shards (hybrid_train tokenize writes them from text)");
  }
  std::vector<TokenShard> shards;
  for (const std::string& p : paths) shards.emplace_back(p, dtype);
  return shards;
}

// Every shard must hold the same kind of tokens as the first training shard.
void check_same_format(const std::vector<TokenShard>& shards, const TokenShard& first) {
  for (const TokenShard& s : shards) {
    if (s.format().magic == first.format().magic && s.format().token_bytes == first.format().token_bytes) continue;
    throw UserError(s.path() + ": byte 0: " + s.format().name() + ", but " + first.path() + " is " +
                    first.format().name() + ": every file must hold the same vocabulary's tokens");
  }
}

// Every id below the vocabulary: one pass over each file, with a progress line for big corpora.
void check_ids(const TokenCorpus& corpus, int64_t vocab, const std::string& vocab_source, bool show_progress) {
  ByteProgress progress("checking token ids", corpus.bytes(), show_progress && corpus.bytes() >= kQuietCheckBytes);
  int64_t before = 0;
  for (const TokenShard& s : corpus.shards()) {
    const int64_t bad = s.first_id_at_least(vocab, [&](int64_t done) { progress.update(before + done, s.path()); });
    if (bad >= 0) {
      int64_t id = 0;
      s.read(bad, 1, &id);
      throw UserError(s.path() + ": byte " + std::to_string(s.byte_of(bad)) + " (token " + std::to_string(bad) +
                      "): id " + std::to_string(id) + " is not below the vocabulary size " + std::to_string(vocab) +
                      " (" + vocab_source + "); set data.vocab_size to at least " + std::to_string(id + 1) +
                      " if the tokenizer has that many ids, or regenerate the file");
    }
    before += s.bytes();
  }
  progress.finish();
}

std::string fraction_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

std::string corpus_words(const TokenCorpus& c, const std::string& pattern) {
  return std::to_string(c.shards().size()) + (c.shards().size() == 1 ? " file " : " files ") + pattern + ", " +
         grouped(c.tokens()) + " tokens";
}

// Bytes of text per token over the shards, when every shard's header says how many bytes it encodes.
double text_bytes_per_token(const TokenCorpus& c) {
  int64_t bytes = 0;
  for (const TokenShard& s : c.shards()) {
    if (s.format().text_bytes <= 0) return 0;
    bytes += s.format().text_bytes;
  }
  return static_cast<double>(bytes) / static_cast<double>(c.tokens());
}

}  // namespace

DataSplits make_token_splits(const Config& config, bool show_progress) {
  const DataConfig& d = config.data;
  const int64_t block = config.model.block_size;
  std::vector<TokenShard> train = reading_key(config, "data.path", d.path, [&] { return open_shards(d.path, d.token_dtype); });
  reading_key(config, "data.path", d.path, [&] { check_same_format(train, train.front()); });
  std::vector<TokenShard> eval;
  if (!d.eval_path.empty()) {
    eval = reading_key(config, "data.eval_path", d.eval_path, [&] { return open_shards(d.eval_path, d.token_dtype); });
    reading_key(config, "data.eval_path", d.eval_path, [&] { check_same_format(eval, train.front()); });
  }
  const TokenFormat format = train.front().format();
  const int64_t vocab = d.vocab_size > 0 ? d.vocab_size : format.vocab_size;
  const std::string vocab_source = d.vocab_size > 0     ? "data.vocab_size"
                                   : format.vocab_stated ? "the header's vocabulary size, header[3]"
                                                         : "the header's magic " + std::to_string(format.magic);
  if (!d.tokenizer.empty()) {  // named for `sample`: it must be the one that made the files
    const int64_t ids = reading_key(config, "data.tokenizer", d.tokenizer, [&] { return Tokenizer::load(d.tokenizer).vocab_size(); });
    if (ids != vocab) {
      throw UserError(config.source + ": data.tokenizer = \"" + d.tokenizer + "\" has " + std::to_string(ids) +
                      " ids, but the token files' vocabulary is " + std::to_string(vocab) + " (" + vocab_source +
                      "): name the SentencePiece model that made " + d.path + ", or none");
    }
  }
  auto checked = [&](const char* key, const std::string& pattern, std::vector<TokenShard>& shards) {
    return reading_key(config, key, pattern, [&] {
      auto c = std::make_shared<const TokenCorpus>(std::move(shards), block);
      check_ids(*c, vocab, vocab_source, show_progress);
      return c;
    });
  };
  const std::shared_ptr<const TokenCorpus> train_corpus = checked("data.path", d.path, train);
  const std::shared_ptr<const TokenCorpus> eval_corpus =
      d.eval_path.empty() ? train_corpus : checked("data.eval_path", d.eval_path, eval);
  // Without data.eval_path: the last eval_fraction of the windows, at least one.
  const int64_t held_out =
      !d.eval_path.empty()
          ? 0
          : std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(train_corpus->windows()) * d.eval_fraction));
  const int64_t train_windows = train_corpus->windows() - held_out;
  if (train_windows < 1) {
    throw UserError(config.source + ": data.path = \"" + d.path + "\": " + std::to_string(train_corpus->windows()) +
                    " window(s) of model.block_size + 1 tokens are too few to hold out data.eval_fraction = " +
                    fraction_text(d.eval_fraction) + "; use more tokens, a smaller block_size, or data.eval_path");
  }
  DataSplits splits;
  splits.train = std::make_unique<TokenWindows>(train_corpus, 0, train_windows);
  splits.eval = d.eval_path.empty() ? std::make_unique<TokenWindows>(train_corpus, train_windows, held_out)
                                    : std::make_unique<TokenWindows>(eval_corpus, 0, eval_corpus->windows());
  splits.info = {Task::kLanguageModel, {block}, vocab,
                 "tokens of " + corpus_words(*train_corpus, d.path) +
                     (d.eval_path.empty() ? "" : " (eval: " + corpus_words(*eval_corpus, d.eval_path) + ")") + ", " +
                     format.name() + ", vocabulary " + std::to_string(vocab) + " (" + vocab_source + "), " +
                     std::to_string(train_windows) + " train and " + std::to_string(splits.eval->size()) +
                     " eval windows of " + std::to_string(block)};
  splits.info.eval_bytes_per_token = text_bytes_per_token(*eval_corpus);
  return splits;
}

}  // namespace ht
