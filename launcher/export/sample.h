#pragma once
// Generation: a run's decoder continues a prompt, token by token. Each step runs the model
// forward in evaluation mode on the last block_size tokens (no cache of keys and values: the
// window is recomputed, which for the models a workstation trains is fast enough and needs no
// second code path through attention), then takes the most likely token (greedy) or draws one
// from the temperature-scaled, top-k-cut distribution with a generator of its own seed, so a
// seed gives the same text every time.
//
// Text becomes tokens as the run's data did: characters (data.dataset = "text": the distinct
// bytes of data.path, numbered in byte order, as launcher/data/text_corpus.cpp numbers them) or
// the SentencePiece model data.tokenizer names.

#include "launcher/config/config.h"
#include "models/model.h"

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ht {

class Tokenizer;

struct Sampling {
  int64_t tokens = 200;      // to generate
  double temperature = 1.0;  // > 0; divides the logits
  int64_t top_k = 0;         // draw among the k most likely; 0: all
  bool greedy = false;       // the most likely token, always (temperature and top_k unused)
  uint64_t seed = 1;
};

// The run's text <-> token ids.
class TextCodec {
 public:
  // UserError naming the key when the run's data has no text form here (token files, synthetic).
  static TextCodec for_run(const Config& config, int64_t model_vocab);
  // UserError naming the character when it is not in the vocabulary.
  std::vector<int64_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int64_t>& ids) const;
  // Ids below this mean something; a padded embedding (model.vocab_size) has more rows.
  int64_t size() const { return size_; }
  const std::string& description() const { return description_; }

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;  // null: characters
  std::array<int64_t, 256> byte_id_{};          // -1: not in the text
  std::vector<unsigned char> id_byte_;
  int64_t size_ = 0;
  std::string description_;
};

// Continues `prompt` by s.tokens ids, drawn only among the first `usable_vocab`; `on_token` sees
// each as it comes. The model must be in evaluation mode, on `device`.
std::vector<int64_t> generate(Model& model, int64_t block_size, const std::vector<int64_t>& prompt, int64_t usable_vocab,
                              const Sampling& s, const at::Device& device,
                              const std::function<void(const std::vector<int64_t>&)>& on_token = {});

}  // namespace ht
