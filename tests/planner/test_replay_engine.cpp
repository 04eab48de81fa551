// The planner's replay against the engine it predicts, on one step of a small model without
// views: recorded once with room to spare, then run by the engine under a budget and replayed
// offline at the same budget. Both choose by memory/eviction_score.h, on the same clock, so they
// must evict the same tensors in the same order, each at the same score. Where the replay still
// departs from the engine (planner/dtr_replay.h: views, a regenerated kernel's other outputs and
// temporaries, freed records in e*, dtr_eq's classes and megengine's free neighbours) this step
// does not go: an MLP has no views, and its regenerations make one output each.
#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "memory/memory_manager.h"
#include "models/mlp.h"
#include "planner/dtr_replay.h"
#include "planner/step_recorder.h"
#include "runtime/interpreter.h"
#include "runtime/tensor_info.h"

#include <gtest/gtest.h>

#include <map>
#include <utility>
#include <vector>

namespace ht {
namespace {

// A tensor by what made it: the forward op call's place in the step, and which of its outputs.
using Made = std::pair<int, int>;

struct Evicted {
  Made made;
  double score = 0;
};

std::shared_ptr<Model> mlp() {
  at::manual_seed(3);
  MlpOptions o;
  o.in_features = 64;
  o.hidden = {256, 256, 256, 256};
  return std::make_shared<Mlp>(o);
}

// One forward and backward of the model on a fixed batch, in `arena`: the model and the batch are
// made on host memory (what making them allocates on the way is no step's) and copied in, so
// that the arena holds them in one run of blocks, as the replay's persistent block.
struct Step {
  std::shared_ptr<CpuArena> arena;
  std::shared_ptr<Model> model = mlp();
  at::Tensor x = at::randn({512, 64}), y = at::randint(0, 10, {512}, at::TensorOptions().dtype(at::kLong));
  ArenaScope scope;
  explicit Step(int64_t capacity) : arena(std::make_shared<CpuArena>(capacity)), scope(arena) {
    at::NoGradGuard no_grad;
    for (at::Tensor p : model->parameters()) p.set_data(p.detach().clone());
    x = x.clone();
    y = y.clone();
  }
  void run(Interpreter& interp) {
    Tensor loss = model->loss(model->forward(interp.input(x)), interp.input(y));
    interp.backward(loss);
  }
};

// Numbers forward op calls as they first run, and notes each eviction with its score.
class Victims final : public KernelObserver {
 public:
  Victims(MemoryManager& memory, const Interpreter& interp) : memory_(memory), interp_(interp) {}
  void kernel_begins(const ComputePath& path, bool recompute, bool backward) override {
    if (!recompute && !backward) ordinal_.emplace(&path, static_cast<int>(ordinal_.size()));
  }
  void kernel_ends(const ComputePath&, bool, bool) override {}
  void evicted(const TensorInfo& t) override {
    const double score = memory_.evictor()->policy().score(t, interp_.now());
    out.push_back({{ordinal_.at(t.producer.get()), t.output_index}, score});
  }
  std::vector<Evicted> out;

 private:
  MemoryManager& memory_;
  const Interpreter& interp_;
  std::map<const ComputePath*, int> ordinal_;
};

// The same naming for the trace's tensors: forward kernels in order, outputs in allocation order.
std::vector<Made> made_of(const StepTrace& trace) {
  std::vector<int> ordinal(trace.kernels.size(), -1), outputs(trace.kernels.size(), 0);
  int forward = 0;
  for (size_t k = 0; k < trace.kernels.size(); ++k)
    if (!trace.kernels[k].backward) ordinal[k] = forward++;
  std::vector<Made> made(trace.tensors.size(), {-1, -1});
  for (const TraceEvent& e : trace.events) {
    if (e.kind != TraceEvent::Kind::kAllocated) continue;
    const int p = trace.tensors[static_cast<size_t>(e.index)].producer;
    if (p >= 0) made[static_cast<size_t>(e.index)] = {ordinal[static_cast<size_t>(p)], outputs[static_cast<size_t>(p)]++};
  }
  return made;
}

TEST(ReplayAgainstTheEngine, EvictsTheSameTensorsInTheSameOrderAtTheSameScores) {
  // The step as the profiler records it: room to spare, nothing evicted.
  StepTrace trace;
  int64_t peak = 0;
  {
    Step step(int64_t{256} << 20);
    MemoryManager memory;
    Interpreter interp({}, &memory);
    memory.configure(MemoryOptions::budget(step.arena, std::nullopt));
    StepRecorder recorder(memory, step.arena->stats().in_use);
    step.arena->reset_peak();
    step.run(interp);
    trace = recorder.take();
    peak = step.arena->stats().peak_in_use;
  }
  const int64_t activations = peak - trace.persistent_bytes;
  ASSERT_GT(activations, 0);
  int compared = 0, fitted = 0, refused = 0;
  int64_t windowed = 0;
  // Threshold 1.0 leaves every eviction to a request that finds no block: there the window
  // (Coop's) or the one-by-one choice decides them all.
  const std::pair<double, bool> configs[] = {{0.9, true}, {0.9, false}, {1.0, true}, {1.0, false}};
  for (const auto& [threshold, window] : configs)
  for (double share : {0.9, 0.8, 0.7, 0.6}) {
    const int64_t budget = trace.persistent_bytes + static_cast<int64_t>(share * static_cast<double>(activations));
    SCOPED_TRACE("budget: persistent + " + std::to_string(share) + " of the activations, threshold " +
                 std::to_string(threshold) + (window ? ", windows" : ", one by one"));
    Step step(budget);
    MemoryManager memory;
    Interpreter interp({}, &memory);
    MemoryOptions m = MemoryOptions::budget(step.arena, EvictionHeuristic::kDtr);
    m.eviction_threshold = threshold;
    m.eviction->window = window;
    memory.configure(m);
    ASSERT_EQ(step.arena->stats().in_use, trace.persistent_bytes) << "both start from the same state";
    Victims engine(memory, interp);
    memory.set_kernel_observer(&engine);
    bool engine_fits = true;
    try {
      step.run(interp);
    } catch (const OutOfBudget&) {
      engine_fits = false;
    }
    memory.set_kernel_observer(nullptr);

    ReplayOptions options;
    options.budget_bytes = budget;
    options.policy = EvictionHeuristic::kDtr;
    options.eviction_threshold = threshold;
    options.window = window;
    const ReplayResult replayed = replay_step(trace, options);
    EXPECT_EQ(replayed.feasible, engine_fits) << replayed.failure;
    (engine_fits ? fitted : refused)++;
    // Up to where both went: the replay stops at its failure, the engine at its exception.
    const std::vector<Made> made = made_of(trace);
    if (engine_fits) {
      ASSERT_EQ(replayed.victims.size(), engine.out.size());
    }
    ASSERT_EQ(replayed.victim_scores.size(), replayed.victims.size());
    for (size_t i = 0; i < std::min(engine.out.size(), replayed.victims.size()); ++i) {
      EXPECT_EQ(made[static_cast<size_t>(replayed.victims[i])], engine.out[i].made) << "eviction " << i;
      EXPECT_DOUBLE_EQ(replayed.victim_scores[i], engine.out[i].score) << "eviction " << i;
    }
    if (engine_fits) {
      EXPECT_EQ(replayed.recomputations, memory.stats().recomputations);
      EXPECT_EQ(replayed.window_evictions, memory.stats().window_evictions);
      windowed += memory.stats().window_evictions;
    }
    compared += static_cast<int>(std::min(engine.out.size(), replayed.victims.size()));
  }
  EXPECT_GT(fitted, 0);
  EXPECT_GT(compared, 0) << "the budgets evict";
  EXPECT_GT(windowed, 0) << "some budget evicts a window";
}

}  // namespace
}  // namespace ht
