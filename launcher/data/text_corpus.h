#pragma once
// A character-level corpus from any text file: its distinct bytes are the vocabulary, the
// file is cut into windows of block_size + 1 characters (input, and the same shifted by one as
// target), and the last eval_fraction of the file is held out.

#include <ATen/ATen.h>

#include <string>

namespace ht {

struct TextCorpus {
  at::Tensor train_inputs, train_targets;  // (N, T) int64 each
  at::Tensor eval_inputs, eval_targets;
  int64_t vocab_size = 0;
  std::string description;
};

TextCorpus load_text_corpus(const std::string& path, int64_t block_size, double eval_fraction);

}  // namespace ht
