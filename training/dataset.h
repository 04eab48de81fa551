#pragma once
// What the trainer draws batches from: samples by index (the sampler's order) or a run of them
// (evaluation). The datasets themselves (Fashion-MNIST, generated data, text, memory-mapped token
// files) and the factory that builds a job's splits are launcher/data/.

#include "runtime/context_parallel.h"

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

// A context-parallel rank's part of a batch of sequences (runtime/context_parallel.h): its head and
// tail chunks of every sequence's tokens and next tokens; the batch itself without context
// parallelism.
Batch context_part(const Batch& batch, const ContextLayout& layout);

// The batch where its copies to `device` need not hold the host: for a GPU, in page-locked host
// memory (each micro-batch then copied with non_blocking, queued behind the step's kernels, where
// a blocking copy waits for every one of them: a host synchronisation per micro-batch); for the
// CPU, the batch itself.
Batch staged_for(const Batch& batch, at::Device device);

// A micro-batch's tensor on `device`, copied without blocking the host (staged_for's memory).
at::Tensor on_device(const at::Tensor& staged, at::Device device);

// What the model needs to know about the data.
struct DataInfo {
  Task task = Task::kClassification;
  std::vector<int64_t> sample_shape;  // one input: (C, H, W) or (T)
  int64_t classes = 0;                // classes, or vocabulary size for a language model
  std::string description;            // for the log
  // Language models: bytes of text per token in the evaluation split, so that its loss reads as
  // bits per byte (losses over different vocabularies compare only so). 0: not known.
  double eval_bytes_per_token = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Batch batch(const at::Tensor& indices) const = 0;  // indices (n) int64
  virtual Batch slice(int64_t start, int64_t count) const = 0;
};

// Every sample in memory: inputs (N, ...) and targets (N, ...).
class TensorDataset : public Dataset {
 public:
  TensorDataset(at::Tensor inputs, at::Tensor targets);
  int64_t size() const override { return inputs_.size(0); }
  Batch batch(const at::Tensor& indices) const override;
  Batch slice(int64_t start, int64_t count) const override;

 private:
  at::Tensor inputs_, targets_;
};

struct DataSplits {
  std::unique_ptr<Dataset> train, eval;
  DataInfo info;
};

}  // namespace ht
