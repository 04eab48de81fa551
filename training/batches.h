#pragma once
// The training batches in the sampler's order, each this rank's part (context_part) staged for
// the device (staged_for). On a GPU the next step's batch is drawn, gathered and pinned while the
// device runs this step's kernels: between reading a step's loss and queueing the next step's
// first kernel the device would otherwise wait for the host to do it. A CPU rank draws each batch
// as its step begins (its batch is device memory, which a batch drawn ahead would hold beside the
// step's); the batches and the sampler's positions are the same either way.

#include "training/dataset.h"
#include "training/sampler.h"

#include <optional>

namespace ht {

class Batches {
 public:
  // `ahead`: draw_ahead draws (the trainer's choice: on a GPU).
  Batches(const Dataset& train, Sampler& sampler, const ContextLayout& context, at::Device device, bool ahead);
  // This step's batch: the one drawn ahead, or drawn now.
  Batch take();
  // Draws and stages the next step's batch now (where `ahead`; else nothing).
  void draw_ahead();
  // Where the sampler stands past the batches taken (a batch drawn ahead is not taken): what a
  // checkpoint records.
  SamplerPosition position() const;
  // Resumes at `position`, forgetting a batch drawn ahead.
  void seek(SamplerPosition position);

 private:
  Batch draw();

  const Dataset& train_;
  Sampler& sampler_;
  const ContextLayout& context_;
  at::Device device_;
  bool ahead_allowed_;
  std::optional<Batch> ahead_;
  SamplerPosition before_ahead_;  // the sampler's position before ahead_ was drawn
};

}  // namespace ht
