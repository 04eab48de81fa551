#pragma once
// What the tokenizer asks of SentencePiece, as an interface with no SentencePiece type in it.
//
// Why: Debian's libsentencepiece carries its own copy of protobuf and exports its symbols, and
// libtorch loads the system's libprotobuf. Linked into hybrid_train, the two copies bind to each
// other's functions and the process crashes before main (in libprotobuf's static initialization).
// So SentencePiece lives in a library of its own (libht_sentencepiece.so, made from
// sentencepiece_backend.cpp), which tokenizer.cpp loads with dlopen(RTLD_LOCAL | RTLD_DEEPBIND)
// (DEEPBIND only where a shared libprotobuf is loaded: tokenizer.cpp says why):
// its symbols stay out of the process's global scope, and it binds to its own protobuf first.
// Calls cross by virtual functions only, which need no symbol lookup.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ht {

class SentencePieceBackend {
 public:
  virtual ~SentencePieceBackend() = default;
  // Each returns "" on success, else SentencePiece's complaint.
  virtual std::string load(const std::string& serialized_model) = 0;
  // Trains on every non-empty line of `files` with SentencePiece's options; on success the model
  // is loaded and `serialized_model` holds it.
  virtual std::string train(const std::vector<std::pair<std::string, std::string>>& options,
                            const std::vector<std::string>& files, std::string& serialized_model) = 0;
  virtual std::string encode(std::string_view text, std::vector<int>& ids) const = 0;
  virtual std::string decode(const std::vector<int>& ids, std::string& text) const = 0;
  virtual int size() const = 0;
  virtual std::string piece(int id) const = 0;
  virtual float score(int id) const = 0;
  virtual int eos_id() const = 0;
};

// The library's one exported function: a new backend, owned by the caller.
constexpr const char* kSentencePieceBackendFactory = "ht_new_sentencepiece_backend";
using SentencePieceBackendFactory = SentencePieceBackend* (*)();

}  // namespace ht
