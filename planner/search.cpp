#include "planner/search.h"

#include "planner/gradient_blocks.h"
#include "planner/weight_copy_terms.h"

#include "planner/shard_terms.h"
#include "alloc/byte_size.h"
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <tuple>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <optional>
#include <exception>
#include <mutex>
#include <thread>

namespace ht {
namespace {

std::string fixed(double v, int digits = 2) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

bool better(const RankedPlan& a, const RankedPlan& b, Objective objective) {
  if (a.prediction.fits != b.prediction.fits) return a.prediction.fits;
  if (!a.prediction.fits) return a.prediction.peak_bytes < b.prediction.peak_bytes;
  const Prediction &x = a.prediction, &y = b.prediction;
  if (objective == Objective::kCost && x.device_hours_per_epoch != y.device_hours_per_epoch) {
    return x.device_hours_per_epoch < y.device_hours_per_epoch;
  }
  if (x.step_ms != y.step_ms) return x.step_ms < y.step_ms;
  return a.plan.devices() < b.plan.devices();
}

// The best fitting plan that `pick` accepts, or null.
template <typename Pick>
const RankedPlan* best_where(const std::vector<RankedPlan>& ranked, Pick&& pick) {
  for (const RankedPlan& r : ranked) {
    if (r.prediction.fits && pick(r)) return &r;
  }
  return nullptr;
}

}  // namespace

std::string describe_plan(const Plan& p) {
  std::string s = std::to_string(p.devices()) + (p.devices() == 1 ? " rank" : " ranks");
  if (p.stages > 1) {
    s += " (" + std::to_string(p.stages) + " " + choice_name(p.schedule) + " stages";
    if (p.schedule == ScheduleKind::kInterleaved1f1b && p.virtual_stages > 1) s += " of " + std::to_string(p.virtual_stages) + " chunks";
    s += " x " + std::to_string(p.ranks) + ")";
  }
  if (p.tensor > 1) {
    s += ", layers split " + std::to_string(p.tensor) + " ways" + (p.sequence_parallel ? " with sequence parallelism" : "");
  }
  if (p.context > 1) {
    s += ", sequences split " + std::to_string(p.context) + " ways (" + choice_name(p.context_exchange) + ")";
  }
  s += ", micro-batch " + std::to_string(p.micro_batch);
  if (p.accumulation > 1) s += " x " + std::to_string(p.accumulation);
  s += p.precision == MixedPrecision::kOff ? std::string(", fp32") : std::string(", ") + choice_name(p.precision);
  if (bf16_gradients(p)) s += " with bf16 gradients";
  if (evicts(p.policy)) s += std::string(", ") + choice_name(p.policy);
  if (p.policy == MemoryPolicy::kPerBlock && !p.stage_block_keep.empty()) {
    s += " keeping " + stage_keep_words(p.stage_block_keep) + " of each block by stage";
  } else if (p.policy == MemoryPolicy::kPerBlock && p.block_keep_by_stage) {
    s += " keeping a share of each block by stage";
  } else if (p.policy == MemoryPolicy::kPerBlock && p.block_keep_share > 0) {
    char kept[48];
    std::snprintf(kept, sizeof kept, " keeping %.1f%% of each block", 100 * p.block_keep_share);
    s += kept;
  } else if (p.policy == MemoryPolicy::kPerBlock && p.block_keep_bytes > 0) {
    s += " keeping " + format_bytes(p.block_keep_bytes) + " of each block";
  }
  if (p.policy == MemoryPolicy::kPerBlock && p.block_offload) s += ", offloading to host";
  if (evicts(p.policy) && p.eviction_threshold != Plan{}.eviction_threshold) {
    char threshold[48];
    std::snprintf(threshold, sizeof threshold, " evicting down to %.0f%%", 100 * p.eviction_threshold);
    s += threshold;
  }
  if (p.state_on_host && swaps(p.policy)) s += ", optimizer state on host";
  if (p.weight_replicas() > 1 && p.shard == ShardLevel::kOptimizer) s += ", optimizer state sharded";
  if (p.weight_replicas() > 1 && p.shard == ShardLevel::kGradients) s += ", gradients and optimizer state sharded";
  if (p.weight_replicas() > 1 && p.shard == ShardLevel::kParameters) {
    s += ", parameters, gradients and optimizer state sharded";
    const int ahead = prefetch_depth(p);
    if (ahead > 0) s += ", gathered " + std::to_string(ahead) + (ahead == 1 ? " block" : " blocks") + " ahead";
  }
  return s;
}

double fastest_block_keep(const Plan& plan, const std::function<Prediction(const Plan&)>& predict_plan,
                          std::string& words) {
  double best = 0;
  std::optional<double> best_ms;
  std::vector<double> shares(std::begin(kBlockKeepLadder), std::end(kBlockKeepLadder));
  shares.push_back(0);
  for (const double share : shares) {
    Plan q = plan;
    q.block_keep_share = share;
    q.block_keep_bytes = 0;
    const Prediction p = predict_plan(q);
    char cell[96];
    std::snprintf(cell, sizeof cell, "%skept %.1f%% %s", words.empty() ? "" : ", ", 100 * share,
                  p.fits ? (std::to_string(static_cast<int64_t>(p.step_ms + 0.5)) + " ms").c_str() : "does not fit");
    words += cell;
    if (p.fits && (!best_ms || p.step_ms < *best_ms)) {
      best = share;
      best_ms = p.step_ms;
    }
  }
  return best;
}

Prediction predict_stage_keeps(Plan& plan, const std::function<Prediction(Plan&)>& predict_plan) {
  const std::vector<double> ladder(std::begin(kStageKeepLadder), std::end(kStageKeepLadder));
  const size_t stages = static_cast<size_t>(std::max(plan.stages, 1));
  const Plan first = plan;
  auto at = [&](const std::vector<size_t>& rungs, Plan& q) {
    q = first;
    q.stage_block_keep.clear();
    for (size_t r : rungs) q.stage_block_keep.push_back(ladder[r]);
    q.block_keep_share = q.stage_block_keep[0];
    q.block_keep_bytes = 0;
    return predict_plan(q);
  };
  std::optional<Prediction> best;
  // From each share on every stage that fits (the uniform plans; the two highest: all four took
  // the 70B search from 53 to 80 s for a median 1.4% more), the stages raised a rung at a time,
  // the raise that makes the step fastest first, while one does: the later stages hold fewer
  // micro-batches in flight and have room to keep more.
  int starts = 0;
  for (size_t u = 0; u < ladder.size() && starts < 2; ++u) {
    std::vector<size_t> rung(stages, u);
    Plan q;
    Prediction p = at(rung, q);
    if (!p.fits) {
      if (!best) {
        plan = q;  // the first tried, where nothing fits
        best = p;
        best->fits = false;
      }
      continue;
    }
    ++starts;
    while (true) {
      std::optional<size_t> raised;
      Plan raised_plan;
      Prediction raised_p = p;
      for (size_t r = 0; r < stages; ++r) {
        if (rung[r] == 0) continue;
        std::vector<size_t> higher = rung;
        --higher[r];
        Plan h;
        Prediction ph = at(higher, h);
        if (ph.fits && ph.step_ms < raised_p.step_ms) {
          raised = r;
          raised_p = std::move(ph);
          raised_plan = std::move(h);
        }
      }
      if (!raised) break;
      --rung[*raised];
      p = std::move(raised_p);
      q = std::move(raised_plan);
    }
    if (!best || !best->fits || p.step_ms < best->step_ms) {
      best = std::move(p);
      plan = std::move(q);
    }
  }
  return *best;
}

std::string stage_keep_words(const std::vector<double>& shares) {
  std::string s;
  for (double share : shares) {
    char cell[16];
    std::snprintf(cell, sizeof cell, "%s%.0f%%", s.empty() ? "" : ", ", 100 * share);
    s += cell;
  }
  return s;
}

std::string policy_cell(const Plan& p) {
  if (p.policy != MemoryPolicy::kPerBlock) return choice_name(p.policy);
  if (p.block_offload) {
    Plan kept = p;
    kept.block_offload = false;
    const std::string cell = policy_cell(kept);
    return (cell == "per_block" ? "per_block 0%" : cell) + " +offload";
  }
  if (!p.stage_block_keep.empty()) {
    std::string s = "per_block ";
    for (size_t r = 0; r < p.stage_block_keep.size(); ++r)
      s += (r > 0 ? "/" : "") + std::to_string(std::lround(100 * p.stage_block_keep[r]));
    return s + "%";
  }
  if (p.block_keep_share > 0) return "per_block " + std::to_string(std::lround(100 * p.block_keep_share)) + "%";
  if (p.block_keep_bytes > 0) return "per_block " + format_bytes(p.block_keep_bytes);
  return choice_name(p.policy);
}

std::string plan_words(const Plan& p) {
  return describe_plan(p) + (p.budget_bytes > 0 ? " at " + format_bytes(p.budget_bytes) : "");
}

namespace {

// Micro-batches per step for a rank's `local` samples: powers of two that divide it, and those
// that leave a power-of-two micro-batch (a global batch of 1536 on 512 replicas reaches
// micro-batch 1 as 3 x 1), at most `most`.
std::vector<int64_t> accumulations(int64_t local, int64_t most) {
  std::vector<int64_t> out;
  for (int64_t a = 1; a <= std::min(local, most); ++a) {
    if (local % a != 0) continue;
    const int64_t micro = local / a;
    const bool power = (a & (a - 1)) == 0, micro_power = (micro & (micro - 1)) == 0;
    if (power || micro_power) out.push_back(a);
  }
  return out;
}

}  // namespace

std::vector<Plan> candidate_plans(int64_t global_batch, int64_t device_memory, const SearchOptions& options) {
  std::vector<Plan> plans;
  for (int devices : options.ranks) {
   for (int stages : options.stages) {
    for (const RankSplit& split : options.splits) {
    const int tensor = split.tensor, context = std::max(1, split.context);
    if (devices < 1 || stages < 1 || tensor < 1 || devices % (stages * tensor * context) != 0) continue;
    const int ranks = devices / (stages * tensor * context);
    if (global_batch % ranks != 0) continue;
    const int64_t local = global_batch / ranks;
    for (int64_t accumulation : accumulations(local, options.max_accumulation)) {
      if (stages > 1 && accumulation < stages) continue;  // a pipeline with fewer micro-batches than stages idles
      for (MixedPrecision precision : options.precisions) {
        for (MemoryPolicy policy : options.policies) {
          if (evicts(policy) && device_memory <= 0) continue;  // eviction needs a budget
          // Stages each run DTR as one rank does, but the replay models one rank's whole model:
          // pipelines are searched without eviction, but for full recomputation, whose drops are
          // the blocks' own (each stage's share of them: planner/cost_model.cpp).
          if (stages > 1 && evicts(policy) && !recomputes_blocks(policy)) continue;
          for (ShardLevel shard : options.shards) {
            // Sharding splits a replica group's state: several replicas. Within pipeline stages only
            // the optimizer state (ZeRO-2 and 3 are refused with stages, as DeepSpeed refuses them).
            if (shard != ShardLevel::kNone && ranks * context == 1) continue;
            if (shard > ShardLevel::kOptimizer && stages > 1) continue;
            // Sharded gradients' blocks and gathered parameters are made outside the ops a static
            // plan captures; gathers must come at the same points on every rank, which host
            // swap's timing does not give (both refused by the config).
            if (shard >= ShardLevel::kGradients && plans_statically(policy)) continue;
            if (shard == ShardLevel::kParameters && swaps(policy)) continue;
            // A tensor-parallel group: DTR alone of the memory policies (under the others a rank
            // keeps its collectives' outputs, which the replay does not model).
            if (tensor > 1 && (plans_statically(policy) || swaps(policy))) continue;
            // A context group: the same; ZeRO-3's gathers follow DTR's evictions, which differ
            // between its ranks (runtime/ops/context_attention.cpp).
            if (context > 1 && (plans_statically(policy) || swaps(policy))) continue;
            if (context > 1 && shard == ShardLevel::kParameters && evicts(policy)) continue;
            Plan p;
            p.ranks = ranks;
            p.stages = stages;
            p.tensor = tensor;
            p.sequence_parallel = tensor > 1 && options.sequence_parallel;
            p.context = context;
            p.context_exchange = split.exchange;
            p.async_checkpoint = options.async_checkpoint;
            p.micro_batch = local / accumulation;
            p.accumulation = accumulation;
            p.precision = precision;
            p.gradient_dtype = options.gradient_dtype;
            p.policy = policy;
            p.budget_bytes = device_memory;
            p.shard = shard;
            // Where gathers may run ahead (sharded parameters, no eviction): gathered where read
            // first, then prefetched a block ahead (one block more gathered, for the time it hides).
            const bool prefetches = prefetch_depth(p) > 0;
            if (prefetches) p.prefetch = 0;
            // per_block: the ladder of what each block keeps, each a plan of its own (the frontier).
            const std::vector<double> shares = policy == MemoryPolicy::kPerBlock
                                                   ? std::vector<double>(std::begin(kBlockKeepLadder), std::end(kBlockKeepLadder))
                                                   : std::vector<double>{0.0};
            const Plan first = p;
            std::vector<std::pair<double, bool>> keeps;  // share, offload
            for (double share : shares) keeps.emplace_back(share, false);
            if (policy == MemoryPolicy::kPerBlock && options.block_offload && tensor == 1 && context == 1 &&
                shard != ShardLevel::kParameters) {
              for (double share : shares) keeps.emplace_back(share, true);
              keeps.emplace_back(0.0, true);  // nothing kept on the device: offloaded or recomputed
            }
            for (const auto& [share, offload] : keeps) {
              p = first;
              p.block_keep_share = share;
              p.block_offload = offload;
              plans.push_back(p);
              if (prefetches) {
                p.prefetch = 1;
                plans.push_back(p);
              }
              const ScheduleShape chunked{stages, static_cast<int>(accumulation), options.virtual_stages};
              if (stages > 1 && options.virtual_stages > 1 &&
                  schedule_refusal(ScheduleKind::kInterleaved1f1b, chunked).empty()) {
                p.schedule = ScheduleKind::kInterleaved1f1b;
                p.virtual_stages = options.virtual_stages;
                plans.push_back(p);
              }
            }
            // On stages, a share per stage too (predict_stage_keeps), on the schedule's own layout.
            if (policy == MemoryPolicy::kPerBlock && stages > 1) {
              p = first;
              p.block_keep_by_stage = true;
              plans.push_back(p);
            }
          }
        }
      }
    }
    }
   }
  }
  return plans;
}

namespace {

// A per-stage plan's shares chosen with each way of holding the 16-bit weights a search weighs
// (predict_with_weights_that_fit): as the plan says, its twin that keeps copies (where auto casts
// under recomputation; weight_kept_twin) and its twin that casts (weight_cast_twin). The faster
// that fits: with copies kept the 70B's 8-stage plan was 12% faster than casting at each read.
Prediction predict_stage_keeps_either_weights(Plan& plan, const std::function<Prediction(const Plan&)>& predict_plan) {
  auto plain = [&](Plan& q) { return predict_plan(q); };
  std::vector<Plan> ways{plan};
  if (const std::optional<Plan> kept = weight_kept_twin(plan)) ways.push_back(*kept);
  if (const std::optional<Plan> cast = weight_cast_twin(plan)) ways.push_back(*cast);
  std::optional<Prediction> best;
  Plan chosen = plan;
  for (Plan& way : ways) {
    Prediction p = predict_stage_keeps(way, plain);
    if (!best || (p.fits && (!best->fits || p.step_ms < best->step_ms))) {
      best = std::move(p);
      chosen = way;
    }
  }
  plan = std::move(chosen);
  return *best;
}

// The 16-bit weights that fit (kept copies under full recomputation where they fit, and where
// kept copies do not fit, the same plan casting at each read may); and where the plan does not fit
// with fp32 gradients and auto leaves their type open, the same with bf16 gradients (half their
// bytes, at accumulation's accuracy: chosen only where memory decides).
Prediction predict_with_gradients_that_fit(Plan& plan, const std::function<Prediction(const Plan&)>& predict_plan) {
  auto predict = [&](Plan& q) {
    return q.block_keep_by_stage ? predict_stage_keeps_either_weights(q, predict_plan)
                                 : predict_with_weights_that_fit(q, predict_plan);
  };
  Prediction prediction = predict(plan);
  if (prediction.fits) return prediction;
  std::optional<Plan> twin = bf16_gradients_twin(plan);
  if (!twin) return prediction;
  // bf16 gradients save at most half the gradients' bytes: a plan over its room by more is not
  // predicted twice (most of a large search's layouts do not fit).
  if (prediction.usable_bytes > 0 && prediction.peak_bytes - prediction.gradient_bytes / 2 > prediction.usable_bytes)
    return prediction;
  Prediction narrow = predict(*twin);
  if (!narrow.fits) return prediction;
  plan = std::move(*twin);
  return narrow;
}

}  // namespace

std::vector<RankedPlan> rank_plans(const std::vector<Plan>& plans,
                                   const std::function<Prediction(const Plan&)>& predict_plan,
                                   Objective objective, int threads) {
  // Predictions are independent of each other (the profile's one cache is locked,
  // recompute_terms.cpp): on every core. A 70B model's 3,000 layouts of 64 devices took 4.8 s on
  // one core here. Each plan keeps its slot, so the ranking is the same at any thread count.
  std::vector<RankedPlan> ranked(plans.size());
  // Predicted in the order of the step they price (a profile keeps the last few traces at a
  // plan's sizes: planner/cost_model.h, shared_trace_for), each into its own slot.
  std::vector<size_t> order(plans.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Plan &p = plans[a], &q = plans[b];
    return std::make_tuple(p.tensor, static_cast<int>(p.precision), p.micro_batch, p.accumulation) <
           std::make_tuple(q.tensor, static_cast<int>(q.precision), q.micro_batch, q.accumulation);
  });
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    try {
      for (size_t k = next++; k < plans.size(); k = next++) {
        const size_t i = order[k];
        // The 16-bit weights that fit: kept copies under full recomputation where they fit, and
        // where kept copies do not fit, the same plan casting at each read may.
        Plan plan = plans[i];
        Prediction prediction = predict_with_gradients_that_fit(plan, predict_plan);
        ranked[i] = {std::move(plan), std::move(prediction)};
        // The cut it was predicted for, so that the plan written trains on it (the trainer would
        // otherwise balance by its own timing of the blocks, and cut elsewhere on a busy machine).
        if (ranked[i].plan.stages > 1 && ranked[i].plan.stage_blocks.empty())
          ranked[i].plan.stage_blocks = ranked[i].prediction.stage_blocks;
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = plans.size();
    }
  };
  // At most 16. The caller's count, not the host's: a container limited to 2 of 64 cores would
  // otherwise run 16 threads in turns.
  const size_t cores = static_cast<size_t>(std::clamp(threads, 1, 16));
  const size_t workers = std::min(cores, (plans.size() + 63) / 64);  // a few plans: not worth a thread
  std::vector<std::thread> pool;
  for (size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [objective](const RankedPlan& a, const RankedPlan& b) { return better(a, b, objective); });
  return ranked;
}

std::string why_it_wins(const std::vector<RankedPlan>& ranked, Objective objective) {
  if (ranked.empty() || !ranked[0].prediction.fits) return "";
  const RankedPlan& win = ranked[0];
  const Prediction& w = win.prediction;
  std::string text;
  // Adding ranks: against the best plan with fewer ranks, or with more when the winner has fewer.
  const RankedPlan* fewer = best_where(ranked, [&](const RankedPlan& r) { return r.plan.devices() < win.plan.devices(); });
  const RankedPlan* more = best_where(ranked, [&](const RankedPlan& r) { return r.plan.devices() > win.plan.devices(); });
  if (fewer != nullptr) {
    const Prediction& f = fewer->prediction;
    text += std::to_string(win.plan.devices()) + " ranks give " + fixed(w.samples_per_s / f.samples_per_s) +
            "x the throughput of the best " + std::to_string(fewer->plan.devices()) + "-rank plan (" +
            describe_plan(fewer->plan) + ") for " + fixed(w.device_hours_per_epoch / f.device_hours_per_epoch) +
            "x the device-hours.";
  } else if (more != nullptr) {
    const Prediction& m = more->prediction;
    text += "The best " + std::to_string(more->plan.devices()) + "-rank plan (" + describe_plan(more->plan) + ") would give " +
            fixed(m.samples_per_s / w.samples_per_s) + "x the throughput for " +
            fixed(m.device_hours_per_epoch / w.device_hours_per_epoch) + "x the device-hours" +
            (objective == Objective::kCost ? ": not worth its cost." : ".");
  }
  // Trading compute for memory.
  if (evicts(win.plan.policy) && w.recompute_ms > 0) {
    text += std::string(text.empty() ? "" : " ") + "Recomputation (" + std::to_string(w.evictions) +
            " evictions a step) costs " + fixed(w.step_ms / (w.step_ms - w.recompute_ms)) +
            "x the step it would take with memory to spare.";
  } else {
    const RankedPlan* saver = best_where(ranked, [&](const RankedPlan& r) {
      return r.plan.devices() <= win.plan.devices() && evicts(r.plan.policy) && r.prediction.recompute_ms > 0;
    });
    if (saver != nullptr) {
      text += std::string(text.empty() ? "" : " ") + "Recomputation instead (" + describe_plan(saver->plan) +
              ") would cost " + fixed(saver->prediction.step_ms / w.step_ms) + "x per step.";
    }
  }
  if (win.plan.stages > 1 && w.compute_ms > 0) {
    text += std::string(text.empty() ? "" : " ") + "Its " + std::to_string(win.plan.stages) + " stages idle " +
            std::to_string(static_cast<int>(std::lround(100 * w.bubble_ms / w.compute_ms))) +
            "% of the step's compute (the pipeline's bubble); the slowest stage is " + fixed(w.stage_imbalance) +
            "x the mean.";
  }
  return text;
}

}  // namespace ht
