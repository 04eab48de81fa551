#pragma once
// A pipeline plan's terms (Plan::stages > 1): the profiled blocks cut into stages as the trainer
// cuts them (parallel/stage_partition.h, balanced by time), the step as the schedule's simulation
// runs those stages' times (parallel/pipeline_schedule.h: the bubble comes out of it), and each
// stage's memory: its share of parameters, gradients and optimizer state, and the activations of
// the micro-batches its schedule keeps in flight. With parallel.shard = "optimizer" the state
// terms it scales are already a replica's share (planner/shard_terms.h); the stage's share is
// taken against the blocks' unsharded state. Each micro-batch's activations cross every stage
// boundary forward and their gradients back, point to point: the bytes are the traced tensors one
// side of the cut makes and the other reads, the time alpha-beta over the link between the two
// stages' devices, a delay on the schedule's dependency (the sender computes on); the schedule's
// simulation then says how much of it the step waits for (Prediction::transfer_ms, in the bubble).
// Interleaving's extra boundaries are priced by the same rule. Where messages match in posting
// order (Machine::p2p_in_posting_order: NCCL), the ranks' streams are played instead, with the
// posting a stage takes (parallel/serial_streams.h): a message moves once both ends have posted
// it, and a send holds its rank until then; transfer_ms is then all the step loses to messages.

#include "planner/plan.h"
#include "planner/profile_at.h"

namespace ht {

// Under recomputation, one rank's: a micro-batch's forward and backward through the whole model
// as this rank runs it (its regenerations included), the activations its forward keeps of the
// whole model, and the working set its backward's recomputation adds once above them. Per-stage
// plans (Plan::stage_block_keep) give each rank its own; a stage's blocks are priced at its rank's,
// and the cut is balanced with them.
struct StageRecompute {
  double fb_ms = 0;
  int64_t kept_bytes = 0;
  int64_t working_bytes = 0;
};

// Replaces p's compute and memory terms by the pipeline's; `fb_ms` is one micro-batch's forward
// and backward through the whole model on one rank. p.activation_bytes, the plan's activations of
// a micro-batch, hold the weights' casts alive at their peak as the profile's do
// (`activations_hold_casts`), or none (full recomputation's kept block inputs). `per_rank`, one
// per pipeline rank, replaces fb_ms and p.activation_bytes rank by rank.
void pipeline_terms(const ModelProfile& profile, const Machine& machine, const Plan& plan, double fb_ms, Prediction& p,
                    bool activations_hold_casts = true, const std::vector<StageRecompute>* per_rank = nullptr);

// Per block b of `blocks`: the bytes the traced micro-batch sends forward across a cut after b
// (backward sends their gradients): the tensors made in blocks up to b and read by a forward
// kernel of a later block, a skip connection over the cut included. One pass over the trace; the
// profilers store it on each point (ProfilePoint::cut_bytes).
std::vector<int64_t> stage_cut_bytes(const StepTrace& trace, int blocks);

// Per model block, from one micro-batch's trace (the batch and the state left out): `held`, the
// bytes of the tensors its forward made (the loss's count with the last block) that are still
// alive when backward begins, which a pipeline stage keeps for every micro-batch in flight;
// `peak`, the most its kernels, forward or backward, see of its own held tensors and of every
// tensor not held (outputs on their way to the next block, temporaries, gradients flowing back),
// and `peak_backward` the same over its backward kernels only: a stage of blocks [f, e) peaks at
// (in flight - 1) x its held bytes plus, over its blocks c, the held bytes of f..c-1 and c's peak.
// A stage keeps its output until the micro-batch's backward ends (parallel/pipeline_stage.h:
// InFlight::output) where one rank frees it in the next block's backward: the variants without a
// right neighbour keep the block's held outputs to its end, and a stage adds `sent_held` after
// e - 1 to its other blocks' backward peaks. `sent_unheld` and `sent_held`, per cut after a
// block, the bytes crossing it that no block holds for backward and those one does: a stage that
// ends there keeps the first per micro-batch in flight beyond its held bytes. `weight_casts`, the
// part of `held` that is its weights' casts (is_weight_cast), which are not held per micro-batch
// at all where the weights' 16-bit copies are kept once a step (a stage holds each copy once,
// beside its state); and `peak` and `peak_backward` as they are without the casts.
// Empty vectors where the trace has no kernels.
struct BlockMemory {
  std::vector<int64_t> held, peak, peak_backward, sent_unheld, sent_held, weight_casts, peak_without_casts,
      peak_backward_without_casts;
};
BlockMemory block_memory(const StepTrace& trace, int blocks);

// Sets a point's pipeline terms from its trace: cut_bytes and the blocks' memory (block_memory).
void set_stage_terms(ProfilePoint& point);

// The cut after block `block` for a micro-batch of `micro_batch` samples, from the point's
// cut_bytes, in proportion to the samples; 0 where the point has none.
int64_t stage_boundary_bytes(const ProfilePoint& point, int block, int64_t micro_batch);

}  // namespace ht
