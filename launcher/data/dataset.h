#pragma once
// Datasets held in memory as (input, target) tensors, and the factory that builds the training
// and evaluation splits named by [data].

#include "launcher/config/config.h"

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

namespace ht {

enum class Task { kClassification, kLanguageModel };

struct Batch {
  at::Tensor input;   // images (B, C, H, W) float, or tokens (B, T) int64
  at::Tensor target;  // labels (B) int64, or next tokens (B, T) int64
};

// What the model needs to know about the data.
struct DataInfo {
  Task task = Task::kClassification;
  std::vector<int64_t> sample_shape;  // one input: (C, H, W) or (T)
  int64_t classes = 0;                // classes, or vocabulary size for a language model
  std::string description;            // for the log
};

class Dataset {
 public:
  Dataset(at::Tensor inputs, at::Tensor targets);
  int64_t size() const { return inputs_.size(0); }
  Batch batch(const at::Tensor& indices) const;  // indices (n) int64
  Batch slice(int64_t start, int64_t count) const;

 private:
  at::Tensor inputs_, targets_;
};

struct DataSplits {
  std::unique_ptr<Dataset> train, eval;
  DataInfo info;
};

// Reads or generates the splits of config.data; throws UserError for missing or bad data.
DataSplits make_datasets(const Config& config);

}  // namespace ht
