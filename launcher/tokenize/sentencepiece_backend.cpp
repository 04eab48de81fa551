// libht_sentencepiece.so: SentencePieceBackend over SentencePiece's C++ library (Debian's
// libsentencepiece-dev). Loaded by tokenizer.cpp with RTLD_DEEPBIND; see sentencepiece_backend.h.
#include "launcher/tokenize/sentencepiece_backend.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fstream>
#include <unordered_map>

namespace ht {
namespace {

// The training text: every non-empty line of the files, one after another.
class FileLines : public sentencepiece::SentenceIterator {
 public:
  explicit FileLines(const std::vector<std::string>& files) : files_(files) { Next(); }
  bool done() const override { return done_; }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return status_; }
  void Next() override {
    while (true) {
      if (in_.is_open() && std::getline(in_, line_)) {
        if (!line_.empty()) return;
        continue;
      }
      if (next_ == files_.size()) {
        done_ = true;
        return;
      }
      in_.close();
      in_.clear();
      in_.open(files_[next_], std::ios::binary);
      if (!in_) {
        status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kNotFound, files_[next_] + ": cannot read");
        done_ = true;
        return;
      }
      ++next_;
    }
  }

 private:
  const std::vector<std::string>& files_;
  size_t next_ = 0;
  std::ifstream in_;
  std::string line_;
  bool done_ = false;
  sentencepiece::util::Status status_;
};

std::string complaint(const sentencepiece::util::Status& s) { return s.ok() ? "" : s.ToString(); }

class Backend : public SentencePieceBackend {
 public:
  std::string load(const std::string& serialized_model) override {
    return complaint(processor_.LoadFromSerializedProto(serialized_model));
  }
  std::string train(const std::vector<std::pair<std::string, std::string>>& options, const std::vector<std::string>& files,
                    std::string& serialized_model) override {
    sentencepiece::SetRandomGeneratorSeed(1);  // the same lines sampled, the same model, every time
    FileLines lines(files);
    const std::unordered_map<std::string, std::string> kwargs(options.begin(), options.end());
    const std::string trained = complaint(sentencepiece::SentencePieceTrainer::Train(kwargs, &lines, &serialized_model));
    return trained.empty() ? load(serialized_model) : trained;
  }
  std::string encode(std::string_view text, std::vector<int>& ids) const override {
    return complaint(processor_.Encode(text, &ids));
  }
  std::string decode(const std::vector<int>& ids, std::string& text) const override {
    return complaint(processor_.Decode(ids, &text));
  }
  int size() const override { return processor_.GetPieceSize(); }
  std::string piece(int id) const override { return processor_.IdToPiece(id); }
  float score(int id) const override { return processor_.GetScore(id); }
  int eos_id() const override { return processor_.eos_id(); }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace
}  // namespace ht

extern "C" __attribute__((visibility("default"))) ht::SentencePieceBackend* ht_new_sentencepiece_backend() {
  return new ht::Backend();
}
