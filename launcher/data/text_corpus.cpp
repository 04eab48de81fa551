#include "launcher/data/text_corpus.h"

#include "launcher/data/file_glob.h"
#include "launcher/tokenize/tokenizer.h"
#include "base/user_error.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace ht {
namespace {

// Non-overlapping windows of block_size + 1 tokens, stepping by block_size.
void windows(const at::Tensor& ids, int64_t block_size, at::Tensor& inputs, at::Tensor& targets) {
  const int64_t n = (ids.size(0) - 1) / block_size;
  inputs = at::empty({n, block_size}, at::kLong);
  targets = at::empty({n, block_size}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    inputs[i].copy_(ids.narrow(0, i * block_size, block_size));
    targets[i].copy_(ids.narrow(0, i * block_size + 1, block_size));
  }
}

}  // namespace

namespace {

// Characters as tokens: the bytes that occur, numbered in byte order. Returns the vocabulary size.
int64_t characters_as_ids(const std::string& text, at::Tensor& ids) {
  std::array<bool, 256> present{};
  for (unsigned char ch : text) present[ch] = true;
  std::array<int64_t, 256> id{};
  int64_t vocab = 0;
  for (size_t b = 0; b < 256; ++b) id[b] = present[b] ? vocab++ : -1;
  ids = at::empty({static_cast<int64_t>(text.size())}, at::kLong);
  int64_t* out = ids.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) out[i] = id[static_cast<unsigned char>(text[i])];
  return vocab;
}

// The file's bytes, or those of every file a glob or folder names, one after another.
std::string read_text(const std::string& path) {
  std::vector<std::string> files = match_files(path, /*folders_recursively=*/true);
  std::error_code ec;
  if (files.empty() && std::filesystem::is_directory(path, ec)) {
    throw UserError("a folder with no files in it (its subfolders searched too); give data.path a text file, a glob "
                    "or a folder that holds text files, e.g. \"/usr/share/common-licenses/GPL-3\"");
  }
  if (files.empty() && !has_wildcards(path)) files.push_back(path);  // the error below names it
  if (files.empty()) throw UserError("no file matches this pattern; check the folder and the names");
  std::string text;
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      throw UserError("cannot read " + file + "; give data.path a readable text file, a glob or a folder of them, "
                      "e.g. \"/usr/share/common-licenses/GPL-3\"");
    }
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

}  // namespace

TextCorpus load_text_corpus(const std::string& path, int64_t block_size, double eval_fraction,
                            const Tokenizer* tokenizer) {
  const std::string text = read_text(path);
  at::Tensor ids;
  int64_t vocab = 0;
  if (tokenizer != nullptr) {
    const std::vector<int> encoded = tokenizer->encode(text);
    ids = at::tensor(at::ArrayRef<int>(encoded), at::kInt).to(at::kLong);
    vocab = tokenizer->vocab_size();
  } else {
    vocab = characters_as_ids(text, ids);
  }
  const std::string unit = tokenizer != nullptr ? " tokens" : " characters";
  const int64_t n = ids.size(0);
  const int64_t eval_ids = static_cast<int64_t>(static_cast<double>(n) * eval_fraction);
  const int64_t train_ids = n - eval_ids;
  if (eval_ids < block_size + 1 || train_ids < block_size + 1) {
    throw UserError(std::to_string(n) + unit + " are too few for model.block_size = " + std::to_string(block_size) +
                    " with data.eval_fraction = " + std::to_string(eval_fraction) +
                    "; use a longer file or a smaller block_size");
  }
  TextCorpus c;
  windows(ids.narrow(0, 0, train_ids), block_size, c.train_inputs, c.train_targets);
  windows(ids.narrow(0, train_ids, eval_ids), block_size, c.eval_inputs, c.eval_targets);
  c.vocab_size = vocab;
  c.bytes_per_token = static_cast<double>(text.size()) / static_cast<double>(n);
  c.description = (tokenizer != nullptr ? "SentencePiece tokens of " : "characters of ") + path + " (" +
                  std::to_string(n) + unit + (tokenizer != nullptr ? " of " + std::to_string(text.size()) + " bytes" : "") +
                  ", vocabulary " + std::to_string(vocab) + ", " + std::to_string(c.train_inputs.size(0)) +
                  " train and " + std::to_string(c.eval_inputs.size(0)) + " eval windows of " +
                  std::to_string(block_size) + ")";
  return c;
}

}  // namespace ht
