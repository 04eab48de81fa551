#pragma once
// training.compute_weights = "kept" (alloc/weight_copies.h) in the cost model. Each weight a
// 16-bit op reads is cast once per optimizer step instead of once per micro-batch (and again in
// every recomputation); its gradient is added into the fp32 one as it widens, without a cast of
// its own; and the copies (2 bytes per weight cast) stay resident, through the optimizer step too,
// where the casts' copies were freed. Priced from the profile's trace: the forward casts that read
// no activation are the weights' (as bench_planner_at_scale and bench_activation_bytes count
// them), and the backward casts their share in the same proportion.

#include "planner/plan.h"
#include "planner/profile.h"

#include <functional>
#include <optional>

namespace ht {

bool keeps_weight_copies(const Plan& plan);
// Keeping copies under ZeRO-3 over several ranks: the shards' 16-bit copies, gathered where read
// (planner/shard_terms.h prices their memory and gathers; here only the casts saved).
bool gathers_16bit_copies(const Plan& plan);
// parallel/shard_layout.h's shards_masters of the plan: the fp32 weights sharded with the
// optimizer at ZeRO-1/2, and the 16-bit copies (the weights read in fp32 too) gathered once a step
// and held (planner/shard_terms.h prices their memory and gathers).
bool shards_masters(const Plan& plan);
// `trace` without the weights' casts (the tensors made by is_weight_cast kernels never allocated)
// and without their backward's fp32 gradients (backward casts that make parameters' gradients).
StepTrace without_weight_casts(const StepTrace& trace);
// The same, made once for each of the profile's last few traces: a search walks the same step
// without its casts for many keys (the 70B search on 64 devices made it 522 times from 5 traces).
SharedTrace shared_without_weight_casts(const ModelProfile& profile, const SharedTrace& trace);
// Whether `plan`'s step is walked without the weights' casts, its copies resident beside it: one
// rank or replicas of it keeping copies (not ZeRO-3's 16-bit gathers, not pipeline stages), with
// no policy (a policy's activations are its own replay's).
bool walks_without_casts(const Plan& plan);
// For such a plan, what the step's live peak loses at the plan's micro-batch and precision without
// the weights' casts and their backward's fp32 gradients (negative or zero): the activations a run
// keeping copies has, the copies apart (weight_copy_memory_terms adds them, resident all step).
int64_t activations_without_casts_change(const ModelProfile& profile, const Plan& plan);
// Where memory decides: a plan that keeps copies only because it left the choice to auto, as a
// twin that casts at each read (to predict when the plan does not fit); nullopt otherwise.
std::optional<Plan> weight_cast_twin(const Plan& plan);

// The weights' casts of one micro-batch at `precision` (ms, on the profile's device), and the
// copies' bytes.
struct WeightCasts {
  double forward_ms = 0, backward_ms = 0;
  int64_t copy_bytes = 0;
  // The casts' bytes alive at the trace's peak (its live peak less the peak without them): what
  // the copies replace there. Less than copy_bytes where the step peaks after backward freed some.
  int64_t alive_at_peak = 0;
};
// From the profile's point at `precision` nearest `micro_batch` with a trace.
WeightCasts weight_casts(const ModelProfile& profile, MixedPrecision precision, int64_t micro_batch);
// The weights' casts alive at `trace`'s live peak (its peak less its peak without them); 0
// without a trace.
int64_t weight_casts_alive_at_peak(const StepTrace& trace);
// The same of a point's trace, kept on the profile (a search asks it of every plan).
int64_t weight_casts_alive_at_peak(const ModelProfile& profile, const ProfilePoint& point);

// For a plan that keeps copies (`casts`: the profile's weight_casts): the copies beside the
// optimizer step's temporaries (a stage's share), or, asked for under a budget that evicts,
// beside the replay's peak; after the policy's terms, which set the peak.
void weight_copy_memory_terms(const WeightCasts& casts, const Plan& plan, Prediction& p);
// The casts saved, from compute_ms (and, under full recomputation, recompute_ms), at `slowdown`.
void weight_copy_time_terms(const WeightCasts& casts, const Plan& plan, double slowdown, bool replayed, Prediction& p);

// Under memory.policy = "full", where auto casts (the run has a budget), a 16-bit plan that
// leaves the choice to auto as a twin that asks for kept copies; nullopt otherwise. Full
// recomputation frees a block's activations at its end, so the copies sit beside one block's
// casts at most: its peak with copies is predicted to 0.2% (tests/launcher/test_planning.cpp,
// PredictsFullRecomputationWithKeptWeightCopies), where a replay that evicts by score only bounds it.
std::optional<Plan> weight_kept_twin(const Plan& plan);

// `plan` predicted with the 16-bit weights that fit, what a search chooses where memory decides
// (`plan` becomes the twin chosen): under "full", kept copies where they fit (weight_kept_twin);
// where the plan keeps copies by auto's choice and does not fit, its twin that casts, if that fits.
Prediction predict_with_weights_that_fit(Plan& plan, const std::function<Prediction(const Plan&)>& predict);

}  // namespace ht
