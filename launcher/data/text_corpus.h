#pragma once
// A corpus from any text file (or the files a glob or folder names, joined in path order, as
// `hybrid_train tokenize --input` takes them), cut into windows of block_size + 1 tokens (input, and the same
// shifted by one as target), the last eval_fraction of the file held out. Its tokens are its
// characters (its distinct bytes are the vocabulary), or, with a SentencePiece model
// (data.tokenizer), that model's tokens of the whole file, encoded in memory at start (fine for
// files of tens of megabytes; larger corpora are tokenized once into token files, token_files.h).

#include <ATen/ATen.h>

#include <string>

namespace ht {

struct TextCorpus {
  at::Tensor train_inputs, train_targets;  // (N, T) int64 each
  at::Tensor eval_inputs, eval_targets;
  int64_t vocab_size = 0;
  double bytes_per_token = 1;  // of the text as a whole: 1 per character, more per SentencePiece token
  std::string description;
};

class Tokenizer;

// tokenizer: null for characters.
TextCorpus load_text_corpus(const std::string& path, int64_t block_size, double eval_fraction,
                            const Tokenizer* tokenizer = nullptr);

}  // namespace ht
