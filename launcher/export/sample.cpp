#include "launcher/export/sample.h"

#include "launcher/tokenize/tokenizer.h"
#include "base/user_error.h"
#include "runtime/interpreter.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>

namespace ht {
namespace sample_impl {

// The characters of `path` as text_corpus.cpp numbers them: the bytes that occur, in byte order.
std::vector<unsigned char> bytes_present(const Config& c) {
  std::ifstream in(c.data.path, std::ios::binary);
  if (!in) {
    throw UserError(c.source + ": data.path = \"" + c.data.path + "\": cannot read it, and the run's vocabulary is "
                    "that text's distinct characters; sample where the text is, or put it back");
  }
  std::array<bool, 256> present{};
  for (auto it = std::istreambuf_iterator<char>(in); it != std::istreambuf_iterator<char>(); ++it) {
    present[static_cast<unsigned char>(*it)] = true;
  }
  std::vector<unsigned char> bytes;
  for (int b = 0; b < 256; ++b) {
    if (present[b]) bytes.push_back(static_cast<unsigned char>(b));
  }
  return bytes;
}

std::string char_text(unsigned char ch) {
  char buf[32];
  if (ch >= 0x20 && ch < 0x7f) {
    std::snprintf(buf, sizeof(buf), "'%c' (byte 0x%02x)", ch, ch);
  } else {
    std::snprintf(buf, sizeof(buf), "byte 0x%02x", ch);
  }
  return buf;
}

// The next id from the last position's logits (V).
int64_t next_id(const at::Tensor& last_logits, int64_t usable, const Sampling& s, at::Generator& gen) {
  at::Tensor logits = last_logits.to(at::kFloat).narrow(0, 0, usable);
  if (s.greedy) return logits.argmax().item<int64_t>();
  logits = logits / s.temperature;
  if (s.top_k > 0 && s.top_k < usable) {
    const at::Tensor kth = std::get<0>(logits.topk(s.top_k)).min();
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
  }
  return at::multinomial(at::softmax(logits, 0), 1, /*replacement=*/false, gen).item<int64_t>();
}

}  // namespace sample_impl

TextCodec TextCodec::for_run(const Config& c, int64_t model_vocab) {
  TextCodec codec;
  const bool tokens_with_model = c.data.dataset == DatasetKind::kTokens && !c.data.tokenizer.empty();
  if (c.data.dataset != DatasetKind::kText && !tokens_with_model) {
    throw UserError(c.source + ": data.dataset = \"" + choice_name(c.data.dataset) + "\": sample turns text into "
                    "tokens as the run's data did, which it can for data.dataset = \"text\" (characters, or "
                    "data.tokenizer's SentencePiece model), or token files whose data.tokenizer names the "
                    "SentencePiece model that made them");
  }
  if (!c.data.tokenizer.empty()) {
    try {
      codec.tokenizer_ = std::make_shared<const Tokenizer>(Tokenizer::load(c.data.tokenizer));
    } catch (const UserError& e) {
      throw UserError(c.source + ": data.tokenizer = \"" + c.data.tokenizer + "\": " + e.what());
    }
    codec.size_ = codec.tokenizer_->vocab_size();
    codec.description_ = "SentencePiece tokens of " + c.data.tokenizer;
  } else {
    codec.id_byte_ = sample_impl::bytes_present(c);
    codec.byte_id_.fill(-1);
    for (size_t i = 0; i < codec.id_byte_.size(); ++i) codec.byte_id_[codec.id_byte_[i]] = static_cast<int64_t>(i);
    codec.size_ = static_cast<int64_t>(codec.id_byte_.size());
    codec.description_ = "characters of " + c.data.path;
  }
  const bool padded = c.model.vocab_size > 0;
  if (codec.size_ > model_vocab || (!padded && codec.size_ != model_vocab)) {
    throw UserError(c.source + ": the run's model has " + std::to_string(model_vocab) + " token ids but the " +
                    codec.description_ + " are " + std::to_string(codec.size_) + ": the data changed since the run "
                    "trained; sample with the text (or tokenizer) it trained on");
  }
  return codec;
}

std::vector<int64_t> TextCodec::encode(const std::string& text) const {
  if (tokenizer_) {
    const std::vector<int> ids = tokenizer_->encode(text);
    return {ids.begin(), ids.end()};
  }
  std::vector<int64_t> ids;
  for (unsigned char ch : text) {
    if (byte_id_[ch] < 0) {
      throw UserError("--prompt: " + sample_impl::char_text(ch) + " is not in the run's vocabulary (the " +
                      std::to_string(size_) + " distinct characters of its text); use characters of that text");
    }
    ids.push_back(byte_id_[ch]);
  }
  return ids;
}

std::string TextCodec::decode(const std::vector<int64_t>& ids) const {
  if (tokenizer_) return tokenizer_->decode(std::vector<int>(ids.begin(), ids.end()));
  std::string text;
  for (int64_t id : ids) text += static_cast<char>(id_byte_.at(static_cast<size_t>(id)));
  return text;
}

std::vector<int64_t> generate(Model& model, int64_t block_size, const std::vector<int64_t>& prompt, int64_t usable_vocab,
                              const Sampling& s, const at::Device& device,
                              const std::function<void(const std::vector<int64_t>&)>& on_token) {
  TORCH_CHECK(!prompt.empty() && usable_vocab > 0, "generate: an empty prompt or vocabulary");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(s.seed);
  Interpreter interp;
  NoGradGuard no_grad(interp);
  std::vector<int64_t> context = prompt, generated;
  for (int64_t i = 0; i < s.tokens; ++i) {
    const int64_t t = std::min<int64_t>(block_size, static_cast<int64_t>(context.size()));
    const at::Tensor window = at::tensor(at::ArrayRef<int64_t>(context.data() + context.size() - t, t), at::kLong);
    const Tensor logits = model.logits(model.forward(interp.input(window.view({1, t}).to(device))));
    const int64_t id = sample_impl::next_id(logits.value()[0][t - 1].to(at::kCPU), usable_vocab, s, gen);
    context.push_back(id);
    generated.push_back(id);
    if (on_token) on_token(generated);
  }
  return generated;
}

}  // namespace ht
