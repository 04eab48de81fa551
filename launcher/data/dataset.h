#pragma once
// The datasets of [data] (the trainer's interface to them is training/dataset.h). Two kinds: held
// in memory as (input, target) tensors (Fashion-MNIST, generated data, a text file), and windows of
// memory-mapped token files (launcher/data/token_files.h), which a corpus of many gigabytes needs.
// The factory builds the training and evaluation splits named by [data].

#include "launcher/config/config.h"
#include "training/dataset.h"

namespace ht {

// Reads or generates the splits of config.data; throws UserError for missing or bad data.
// show_progress: a progress line while token files are checked (one rank prints it).
DataSplits make_datasets(const Config& config, bool show_progress = false);

}  // namespace ht
