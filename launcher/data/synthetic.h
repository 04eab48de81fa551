#pragma once
// Generated data with a fixed seed, learnable so that a run shows training progress: image
// classes as textures (vectors by a fixed linear teacher), token sequences from a fixed random
// Markov chain.

#include "launcher/config/config.h"
#include "launcher/data/dataset.h"

namespace ht {

struct SyntheticData {
  at::Tensor train_inputs, train_targets, eval_inputs, eval_targets;
  DataInfo info;
};

SyntheticData make_synthetic_images(const DataConfig& data, int64_t seed);
SyntheticData make_synthetic_tokens(const DataConfig& data, int64_t block_size, int64_t seed);

}  // namespace ht
