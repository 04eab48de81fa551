#pragma once
// Builds the model named by [model] for the data it will see (channels, image size, classes or
// vocabulary come from the data, not the config).

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"
#include "models/decoder_options.h"
#include "models/model.h"

#include <memory>

namespace ht {

// The decoder's shape from [model] (model.name = "gpt" or "llama"), for a vocabulary of
// `data_vocab` tokens unless model.vocab_size says more.
DecoderOptions decoder_options(const ModelConfig& model, int64_t data_vocab);

// Throws UserError when the model and the data do not fit together. With
// parallel.tensor_parallel > 1, the part of a decoder that rank `tensor_rank` of its group holds
// (models/decoder_split.h).
std::shared_ptr<Model> make_model(const Config& config, const DataInfo& data, int tensor_rank = 0, int context_rank = 0);

}  // namespace ht
