#pragma once
// A pipeline plan's terms (Plan::stages > 1): the profiled blocks cut into stages as the trainer
// cuts them (parallel/stage_partition.h, balanced by time), the step as the schedule's simulation
// runs those stages' times (parallel/pipeline_schedule.h: the bubble comes out of it), and each
// stage's memory: its share of parameters, gradients and optimizer state, and the activations of
// the micro-batches its schedule keeps in flight. With parallel.shard = "optimizer" the state
// terms it scales are already a replica's share (planner/shard_terms.h); the stage's share is
// taken against the blocks' unsharded state. Point-to-point time is not modelled: it is small beside a block's compute on
// one host, and grows with the network between hosts (measured by bench_pipeline).

#include "planner/cost_model.h"

namespace ht {

// Replaces p's compute and memory terms by the pipeline's; `fb_ms` is one micro-batch's forward
// and backward through the whole model on one rank.
void pipeline_terms(const ModelProfile& profile, const Plan& plan, double fb_ms, Prediction& p);

}  // namespace ht
