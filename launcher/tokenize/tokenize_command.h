#pragma once
// hybrid_train tokenize: text files to token files. Trains a SentencePiece model on the input
// (--model-prefix PREFIX writes PREFIX.model and PREFIX.vocab) or loads one (--model FILE), then
// encodes every input file, in order, into one llm.c token file (--output PATH.bin; with
// --eval-fraction F, the last F of the text, from a line's start, into PATH_val.bin), each input
// file ending with the end-of-document token. data.dataset = "tokens" trains on the result.

#include "launcher/tokenize/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ht {

struct TokenizeArgs {
  std::vector<std::string> inputs;  // files, globs (** crosses folders) or folders (every file below)
  std::string model;                // an existing PREFIX.model
  std::string model_prefix;         // train one and write PREFIX.model, PREFIX.vocab
  std::string output;               // PATH.bin; empty: train the model only
  int64_t vocab_size = 4096;
  TokenizerModel model_type = TokenizerModel::kBpe;
  double eval_fraction = 0;
  int64_t max_sentences = 1000000;
  bool overwrite = false;           // replace an existing PREFIX.model/.vocab and token files
};

// Runs the command; throws UserError naming the argument for bad input. Returns the exit status.
int run_tokenize_command(const TokenizeArgs& args);

// PATH.bin -> PATH_val.bin (any other name: NAME_val.bin).
std::string eval_output_path(const std::string& output);

}  // namespace ht
