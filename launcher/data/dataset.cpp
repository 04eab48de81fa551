#include "launcher/data/dataset.h"

#include "launcher/data/fashion_mnist.h"
#include "launcher/data/synthetic.h"
#include "launcher/data/text_corpus.h"
#include "launcher/data/token_files.h"
#include "launcher/tokenize/tokenizer.h"
#include "base/user_error.h"

#include <optional>

namespace ht {

namespace {

DataSplits read_splits(const Config& config, const Tokenizer* tokenizer) {
  const DataConfig& d = config.data;
  DataSplits splits;
  if (d.dataset == DatasetKind::kFashionMnist) {
    ImageSet train = load_fashion_mnist(d.path, "train");
    ImageSet test = load_fashion_mnist(d.path, "test");
    splits.train = std::make_unique<TensorDataset>(train.images, train.labels);
    splits.eval = std::make_unique<TensorDataset>(test.images, test.labels);
    splits.info = {Task::kClassification, {1, 28, 28}, 10,
                   "Fashion-MNIST from " + d.path + " (60000 train, 10000 test)"};
  } else if (d.dataset == DatasetKind::kText) {
    TextCorpus corpus = load_text_corpus(d.path, config.model.block_size, d.eval_fraction, tokenizer);
    splits.train = std::make_unique<TensorDataset>(corpus.train_inputs, corpus.train_targets);
    splits.eval = std::make_unique<TensorDataset>(corpus.eval_inputs, corpus.eval_targets);
    splits.info = {Task::kLanguageModel, {config.model.block_size}, corpus.vocab_size, corpus.description,
                   corpus.bytes_per_token};
  } else {
    const bool tokens = !takes_images(config.model.name);
    SyntheticData data = tokens ? make_synthetic_tokens(d, config.model.block_size, config.job.seed)
                                : make_synthetic_images(d, config.job.seed);
    splits.train = std::make_unique<TensorDataset>(data.train_inputs, data.train_targets);
    splits.eval = std::make_unique<TensorDataset>(data.eval_inputs, data.eval_targets);
    splits.info = data.info;
  }
  return splits;
}

}  // namespace

DataSplits make_datasets(const Config& config, bool show_progress) {
  if (config.data.dataset == DatasetKind::kTokens) return make_token_splits(config, show_progress);  // names its keys
  std::optional<Tokenizer> tokenizer;
  if (config.data.dataset == DatasetKind::kText && !config.data.tokenizer.empty()) {
    try {
      tokenizer = Tokenizer::load(config.data.tokenizer);
    } catch (const UserError& e) {
      throw UserError(config.source + ": data.tokenizer = \"" + config.data.tokenizer + "\": " + e.what());
    }
  }
  try {
    return read_splits(config, tokenizer ? &*tokenizer : nullptr);
  } catch (const UserError& e) {
    if (config.data.dataset == DatasetKind::kSynthetic) throw;
    throw UserError(config.source + ": data.path = \"" + config.data.path + "\": " + e.what());
  }
}

}  // namespace ht
