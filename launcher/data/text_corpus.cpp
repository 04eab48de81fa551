#include "launcher/data/text_corpus.h"

#include "launcher/user_error.h"

#include <array>
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

TextCorpus load_text_corpus(const std::string& path, int64_t block_size, double eval_fraction) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot read this text file; give data.path a readable text file, e.g. "
                           "\"/usr/share/common-licenses/GPL-3\"");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The vocabulary: the bytes that occur, numbered in byte order.
  std::array<bool, 256> present{};
  for (unsigned char ch : text) present[ch] = true;
  std::array<int64_t, 256> id{};
  int64_t vocab = 0;
  for (size_t b = 0; b < 256; ++b) id[b] = present[b] ? vocab++ : -1;
  at::Tensor ids = at::empty({static_cast<int64_t>(text.size())}, at::kLong);
  int64_t* out = ids.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) out[i] = id[static_cast<unsigned char>(text[i])];

  const int64_t eval_chars = static_cast<int64_t>(static_cast<double>(text.size()) * eval_fraction);
  const int64_t train_chars = static_cast<int64_t>(text.size()) - eval_chars;
  if (eval_chars < block_size + 1 || train_chars < block_size + 1) {
    throw UserError(std::to_string(text.size()) + " characters are too few for model.block_size = " +
                    std::to_string(block_size) + " with data.eval_fraction = " + std::to_string(eval_fraction) +
                    "; use a longer file or a smaller block_size");
  }
  TextCorpus c;
  windows(ids.narrow(0, 0, train_chars), block_size, c.train_inputs, c.train_targets);
  windows(ids.narrow(0, train_chars, eval_chars), block_size, c.eval_inputs, c.eval_targets);
  c.vocab_size = vocab;
  c.description = "characters of " + path + " (" + std::to_string(text.size()) + " chars, vocabulary " +
                  std::to_string(vocab) + ", " + std::to_string(c.train_inputs.size(0)) + " train and " +
                  std::to_string(c.eval_inputs.size(0)) + " eval windows of " + std::to_string(block_size) + ")";
  return c;
}

}  // namespace ht
