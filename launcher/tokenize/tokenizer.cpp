// The tokenizer over SentencePiece, which lives in libht_sentencepiece.so, loaded on first use
// (sentencepiece_backend.h says why). A build without SentencePiece has no such library, and
// every entry point says so.
#include "launcher/tokenize/tokenizer.h"

#include "training/run_output.h"
#include "launcher/tokenize/sentencepiece_backend.h"
#include "base/user_error.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#ifndef HT_SENTENCEPIECE_LIBRARY
#define HT_SENTENCEPIECE_LIBRARY ""  // not built
#endif

namespace ht {

struct Tokenizer::Impl {
  std::unique_ptr<SentencePieceBackend> backend;
  std::string model;  // the serialized model, as PREFIX.model holds it
};

namespace {

int note_protobuf(struct dl_phdr_info* info, size_t, void* found) {
  if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "libprotobuf") != nullptr) *static_cast<bool*>(found) = true;
  return 0;
}

// RTLD_DEEPBIND where the process already holds a shared libprotobuf (Debian's libtorch loads
// the system's; sentencepiece_backend.h says why SentencePiece must not bind to it). Elsewhere
// not: with PyTorch's wheels (protobuf inside libtorch, hidden; the GPU machine's libtorch 2.11)
// a deep-bound libsentencepiece bound to libstdc++ apart from the process's own copies of its
// streams, and freed a locale it did not make ("free(): invalid pointer" in its static
// initialization, on the GPU machine's Ubuntu SentencePiece).
int backend_dlopen_flags() {
  bool protobuf = false;
  dl_iterate_phdr(note_protobuf, &protobuf);
  return RTLD_NOW | RTLD_LOCAL | (protobuf ? RTLD_DEEPBIND : 0);
}

// The library beside the executable or in ../lib (an installed build), else where this build made it.
SentencePieceBackendFactory load_backend_library(std::string& error) {
  std::vector<std::string> places;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    places.push_back((exe.parent_path() / "libht_sentencepiece.so").string());
    places.push_back((exe.parent_path().parent_path() / "lib" / "libht_sentencepiece.so").string());
  }
  places.emplace_back(HT_SENTENCEPIECE_LIBRARY);
  for (const std::string& path : places) {
    if (path.empty() || !std::filesystem::exists(path, ec)) continue;
    void* library = ::dlopen(path.c_str(), backend_dlopen_flags());  // kept for the process
    if (library == nullptr) {
      error = std::string("cannot load ") + path + ": " + ::dlerror();
      continue;
    }
    if (void* factory = ::dlsym(library, kSentencePieceBackendFactory)) {
      return reinterpret_cast<SentencePieceBackendFactory>(factory);
    }
    error = path + " lacks " + kSentencePieceBackendFactory;
  }
  if (error.empty()) {
    error = "this hybrid_train was built without SentencePiece, which tokenizing needs; install libsentencepiece-dev "
            "(bash scripts/install-deps.sh) and rebuild, or tokenize on a machine that has it and train on the token "
            "files (data.dataset = \"tokens\")";
  }
  return nullptr;
}

std::unique_ptr<SentencePieceBackend> new_backend() {
  static std::string error;
  static const SentencePieceBackendFactory factory = load_backend_library(error);
  if (factory == nullptr) throw UserError(error);
  return std::unique_ptr<SentencePieceBackend>(factory());
}

std::vector<std::pair<std::string, std::string>> trainer_options(const TokenizerTraining& t) {
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  return {{"vocab_size", std::to_string(t.vocab_size)},
          {"model_type", choice_name(t.model)},
          {"byte_fallback", "true"},                    // every byte has tokens
          {"normalization_rule_name", "identity"},      // decoding gives back the text ...
          {"remove_extra_whitespaces", "false"},        // ... with its runs of spaces
          {"add_dummy_prefix", "false"},                // ... and no space added in front
          {"allow_whitespace_only_pieces", "true"},     // indentation as pieces
          {"user_defined_symbols", "\n"},               // a newline is one piece, not a byte
          {"split_digits", "true"},
          {"input_sentence_size", std::to_string(t.max_sentences)},
          {"shuffle_input_sentence", "true"},
          {"num_threads", std::to_string(t.threads > 0 ? t.threads : static_cast<int>(hardware))},
          {"minloglevel", "3"}};  // no log of its own: its errors come back as statuses
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot read this file; give a SentencePiece model (PREFIX.model)");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Pieces of at least `bytes` bytes, each ending at a newline (or the text's end). A newline is a
// piece of its own in the vocabulary, so encoding the pieces apart gives the ids of the whole.
std::vector<std::string_view> pieces_at_newlines(std::string_view text, size_t bytes) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', std::min(text.size(), start + bytes));
    end = end == std::string_view::npos ? text.size() : end + 1;
    out.push_back(text.substr(start, end - start));
    start = end;
  }
  return out;
}

}  // namespace

bool tokenizer_built() {
  try {
    new_backend();
  } catch (const UserError&) {
    return false;
  }
  return true;
}

Tokenizer Tokenizer::load(const std::string& model_path) {
  auto impl = std::make_shared<Impl>();
  impl->backend = new_backend();
  impl->model = read_whole(model_path);
  const std::string complaint = impl->backend->load(impl->model);
  if (!complaint.empty()) {
    throw UserError(model_path + ": not a SentencePiece model (" + complaint +
                    "); give the PREFIX.model that hybrid_train tokenize --model-prefix PREFIX wrote");
  }
  return Tokenizer(impl);
}

namespace {

// The number after `after` in `text` ("... 10 vs 321 ...": after " vs "), or -1.
long long number_after(const std::string& text, const std::string& after) {
  const size_t at = text.find(after);
  if (at == std::string::npos) return -1;
  try {
    return std::stoll(text.substr(at + after.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

// What would work, read off SentencePiece's complaint: a vocabulary below the pieces its
// characters need wants a larger one, one above what the text can fill a smaller one (or more text).
std::string vocab_advice(const std::string& complaint) {
  if (complaint.find("smaller than required_chars") != std::string::npos) {
    const long long needed = number_after(complaint, " vs ");
    return "the text's characters and the special pieces need " +
           (needed > 0 ? std::to_string(needed) : std::string("more")) + " entries: give --vocab-size " +
           (needed > 0 ? std::to_string(needed) + " or more" : std::string("larger")) +
           " (with byte fallback at least 256 + 4 + the distinct characters)";
  }
  if (complaint.find("Vocabulary size too high") != std::string::npos) {
    const long long most = number_after(complaint, "value <= ");
    return "the text fills at most " + (most > 0 ? std::to_string(most) : std::string("fewer")) +
           " entries: give a smaller --vocab-size" + (most > 0 ? " (<= " + std::to_string(most) + ")" : std::string()) +
           ", or more text";
  }
  return "a smaller vocabulary or more text may work (with byte fallback it needs at least 256 + 4 + the distinct "
         "characters)";
}

}  // namespace

Tokenizer Tokenizer::train(const TokenizerTraining& training) {
  auto impl = std::make_shared<Impl>();
  impl->backend = new_backend();
  const std::string complaint = impl->backend->train(trainer_options(training), training.files, impl->model);
  if (!complaint.empty()) {
    throw UserError("--vocab-size " + std::to_string(training.vocab_size) + ": SentencePiece could not train a model: " +
                    vocab_advice(complaint) + " (SentencePiece: " + complaint + ")");
  }
  return Tokenizer(impl);
}

void Tokenizer::save(const std::string& prefix) const {
  std::ostringstream vocab;
  for (int id = 0; id < impl_->backend->size(); ++id) vocab << impl_->backend->piece(id) << '\t' << impl_->backend->score(id) << '\n';
  write_file_atomically(prefix + ".model", impl_->model);
  write_file_atomically(prefix + ".vocab", vocab.str());
}

std::vector<int> Tokenizer::encode(std::string_view text) const {
  const std::vector<std::string_view> pieces = pieces_at_newlines(text, 4096);  // fastest measured: 1-4 kB
  std::vector<std::vector<int>> ids(pieces.size());
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const std::string complaint = impl_->backend->encode(pieces[static_cast<size_t>(i)], ids[static_cast<size_t>(i)]);
      TORCH_INTERNAL_ASSERT(complaint.empty(), "SentencePiece failed to encode: ", complaint);
    }
  });
  std::vector<int> out;
  for (const auto& piece : ids) out.insert(out.end(), piece.begin(), piece.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string text;
  for (int id : ids) {
    if (id < 0 || id >= impl_->backend->size()) {
      throw UserError("token id " + std::to_string(id) + " is not in this tokenizer's vocabulary of " +
                      std::to_string(impl_->backend->size()) + "; decode ids the same model encoded");
    }
  }
  const std::string complaint = impl_->backend->decode(ids, text);
  TORCH_INTERNAL_ASSERT(complaint.empty(), "SentencePiece failed to decode: ", complaint);
  return text;
}

int64_t Tokenizer::vocab_size() const { return impl_->backend->size(); }

int Tokenizer::eos_id() const { return impl_->backend->eos_id(); }

}  // namespace ht
