#include "memory/memory_manager.h"

#include "memory/eviction_window.h"

#include "alloc/cpu_arena.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/memory_timeline.h"
#include "runtime/op.h"
#include "runtime/parameter_source.h"
#include "runtime/tensor_info.h"

#include <algorithm>

namespace ht {

namespace {

// Host swap keeps a tenth of the budget free, whatever the threshold: its drops take no window
// (they come in the order its copies finish), and prefetches need room beside the kernels. At a
// threshold of 1.0, a tensor-parallel Llama under `hybrid` found 11.7 MiB free in pieces no larger
// than 896 KiB.
constexpr double kSwapShare = 0.9;

uint64_t id_of(const TensorInfo* t) { return reinterpret_cast<uint64_t>(t); }

}  // namespace

// Planned offload (per_block's) takes the threshold as configured: its drops come at block ends,
// and a block's values return together, not in the order copies finish.
double MemoryManager::threshold() const {
  if (!swap_ || swap_->options().rule == SwapRule::kPlanned) return options_.eviction_threshold;
  return std::min(options_.eviction_threshold, kSwapShare);
}

namespace {

const void* data_of(const TensorInfo& t) {
  return t.value.defined() && t.value.has_storage() ? t.value.storage().data() : nullptr;
}

}  // namespace

MemoryManager::~MemoryManager() {
  if (out_of_memory_handler() == this) set_out_of_memory_handler(nullptr);
}

void MemoryManager::bind(Rematerializer* interpreter) {
  TORCH_CHECK(interpreter == nullptr || remat_ == nullptr, "MemoryManager: one interpreter per manager");
  remat_ = interpreter;
}

bool MemoryManager::make_room_after(const OutOfBudget& failure) {
  const int64_t held = std::max<int64_t>(failure.in_use - arena_in_use(), 0);
  if (make_room(static_cast<size_t>(failure.requested + held))) return true;  // the rerun fits in one block
  // Nothing more to evict, and no one block for all the kernel held: its blocks need not be one.
  // Room for the request itself and, in pieces, for the rest: the rerun (run_with_room) may then
  // fit, as a kernel whose temporaries lie in holes between what cannot move (the 6-layer GPT at
  // 0.3 of its activations with eviction down to the whole budget trains so, and was refused).
  return options_.arena != nullptr && make_room(static_cast<size_t>(failure.requested)) &&
         options_.arena->stats().free_bytes >= failure.requested + held;
}

void MemoryManager::configure(MemoryOptions options) {
  TORCH_CHECK(remat_ != nullptr, "MemoryManager::configure: make the interpreter with this manager first");
  TORCH_CHECK(stats_.kernels == 0, "MemoryManager::configure: call it before the first kernel");
  TORCH_CHECK(options.arena != nullptr || !options.eviction,
              "MemoryManager::configure: eviction needs a budget (an arena)");
  options_ = std::move(options);
  owner_ = std::this_thread::get_id();
  evictor_ = options_.eviction ? std::make_unique<Evictor>(*options_.eviction, options_.arena.get()) : nullptr;
  TORCH_CHECK(options_.arena != nullptr || !options_.static_plans,
              "MemoryManager::configure: static plans need a budget (an arena)");
  TORCH_CHECK(options_.checkpoint_blocks == 0 || evictor_ != nullptr,
              "MemoryManager::configure: dropping blocks needs eviction (DTR regenerates them)");
  TORCH_CHECK(!options_.swap || (options_.arena != nullptr && evictor_ != nullptr),
              "MemoryManager::configure: host swap needs a budget and an eviction policy");
  block_ = -1;  // what an earlier configuration recorded is not this one's
  block_made_.clear();
  last_made_.clear();
  offloading_.clear();
  // A model without blocks has no block ends to offload at: its values stay or are evicted.
  const bool offloads = options_.swap && options_.swap->rule == SwapRule::kPlanned && options_.checkpoint_blocks > 0;
  block_plans_ = options_.checkpoint_blocks > 0 && (options_.block_keep_bytes > 0 || options_.block_keep_share > 0 || offloads)
                     ? std::make_unique<schedule::BlockPlans>(options_.block_keep_bytes, options_.block_keep_share,
                                                              offloads ? block_link(*options_.swap, options_.checkpoint_blocks)
                                                                       : schedule::BlockLink{})
                     : nullptr;
  swap_ = options_.swap ? std::make_unique<HostSwap>(*options_.swap) : nullptr;
  if (swap_) swap_->set_timeline(options_.timeline);
  planner_ = options_.static_plans
                 ? std::make_unique<StaticPlanner>(*options_.static_plans, *options_.arena, *remat_,
                                                   [this](TensorInfo& t) { evict(t, /*planned=*/true); })
                 : nullptr;
}

schedule::BlockLink block_link(const SwapOptions& swap, int blocks) {
  TORCH_CHECK(swap.link != nullptr, "block_link: no host link");
  schedule::BlockLink link;
  constexpr int64_t kMiB = int64_t{1} << 20;
  link.ms_per_byte = swap.link->transfer_ms(kMiB) / static_cast<double>(kMiB);
  link.host_bytes = swap.host_budget_bytes / std::max(1, blocks - 1);
  link.min_bytes = swap.min_bytes;
  return link;
}

void MemoryManager::begin_step() {
  backward_seen_ = false;
  offloading_.clear();
  if (swap_) swap_->step_begins();
  if (planner_) planner_->begin_step();
}

void MemoryManager::end_step(bool completed) {
  if (!planner_) return;
  const StaticPlanStats before = planner_->stats();
  planner_->end_step(completed);
  const StaticPlanStats& after = planner_->stats();
  if (options_.timeline != nullptr && after.plans != before.plans) {
    options_.timeline->marker("static plan made (" + after.last_solver + ", " + after.last_status + ")");
  }
}

void MemoryManager::block_begins(int block) {
  if (planner_) planner_->block_begins(block);
  if (options_.checkpoint_blocks <= 0) return;
  settle_offloads();
  if (block_ >= 0 && block_ + 1 < options_.checkpoint_blocks) drop_block();
  block_made_.clear();
  last_made_.clear();
  block_ = block;
}

void MemoryManager::drop_block() {
  const std::vector<uint64_t>& made = block_made_.values();
  std::vector<bool> saved(made.size(), false);
  for (size_t i = 0; i < made.size(); ++i) {
    auto* t = reinterpret_cast<TensorInfo*>(made[i]);
    // Still a root this manager holds, resident, droppable, and not the block's output.
    saved[i] = t != nullptr && root_slot_.count(t) != 0 && t->resident() && t->evictable() &&
               std::find(last_made_.begin(), last_made_.end(), t) == last_made_.end();
  }
  const schedule::BlockPlan* plan = block_plans_ ? &block_plans_->plan(block_made_.graph(saved)) : nullptr;
  for (size_t i = 0; i < made.size(); ++i) {
    if (!saved[i] || (plan != nullptr && plan->keep[i])) continue;
    auto& t = *reinterpret_cast<TensorInfo*>(made[i]);
    // Offloaded: dropped once its copy is done (settle_offloads); one the host cannot take, now.
    if (plan != nullptr && plan->offload[i] && swap_->offload(t)) {
      offloading_.push_back({&t, t.id, block_});
    } else {
      evict(t);
    }
  }
}

void MemoryManager::settle_offloads() {
  std::vector<Offloading> running;
  for (const Offloading& o : offloading_) {
    if (root_slot_.count(o.t) == 0 || o.t->id != o.id) continue;
    TensorInfo& t = *o.t;
    if (!t.resident() || t.host == nullptr) continue;
    // Called as a block begins, before the block that just ended starts its own copies: these
    // started a block ago and ran beside it, and what still copies is waited for, so that one
    // block's offloads at most wait on the device (the replay counts none). The last block's
    // are not settled: backward reads them first.
    if (!swap_->copied_out(t, /*wait=*/o.block < block_)) {
      running.push_back(o);
    } else if (t.evictable()) {
      evict(t);
    }
  }
  offloading_ = std::move(running);
}

void MemoryManager::forward_outputs(const ComputePath& path, const std::vector<Tensor>& outputs, bool taped) {
  if (planner_) planner_->forward_op(path, outputs, taped);
  if (options_.checkpoint_blocks > 0 && taped && block_ >= 0) {
    last_made_.clear();
    std::vector<std::pair<uint64_t, int64_t>> made;
    for (TensorInfo* out : path.outputs) {
      if (out == nullptr) continue;
      // A view owns no bytes: its root was made before (perhaps by the block before, whose output
      // this block reads), and is kept if the view is the block's output.
      last_made_.push_back(out->is_view() ? out->base : out);
      if (!out->is_view()) made.emplace_back(id_of(out), static_cast<int64_t>(CpuArena::rounded_size(out->nbytes)));
    }
    std::vector<uint64_t> reads;
    for (const auto& in : path.inputs)
      if (in) reads.push_back(id_of(in->is_view() ? in->base : in.get()));
    block_made_.op(path.op->traits().name, path.modeled_ms, reads, made);
  }
  if (!swap_ || !taped) return;
  // What this op's backward will read: candidates for a copy to host.
  const OpTraits& traits = path.op->traits();
  const bool heavy = traits.work != Work::kMemory;  // a convolution or a matmul reads it
  auto consider = [&](TensorInfo* t) {
    if (t != nullptr) swap_->consider(t->is_view() ? *t->base : *t, heavy);
  };
  for (size_t i = 0; i < path.inputs.size(); ++i)
    if (traits.saves_inputs & (1u << i)) consider(path.inputs[i].get());
  for (size_t j = 0; j < path.outputs.size(); ++j)
    if (traits.saves_outputs & (1u << j)) consider(path.outputs[j]);
}

void MemoryManager::backward_stage_begins(const ComputePath& path, const std::vector<const TensorInfo*>& saved) {
  if (planner_) planner_->backward_stage_begins(path, saved);
}

void MemoryManager::backward_stage_ends(const ComputePath& path) {
  if (planner_) planner_->backward_stage_ends();
}

void MemoryManager::reset_peak() {
  if (swap_) swap_->reset_peak();
  stats_.peak_resident_bytes = stats_.resident_bytes;
  stats_.fragmentation_at_peak = 0;
  fragmentation_sampled_at_ = -1;
}

int64_t MemoryManager::arena_in_use() const { return options_.arena ? options_.arena->stats().in_use : 0; }

void MemoryManager::before_kernel(const ComputePath& path, bool recompute) {
  int64_t expected = 0;
  if (recompute) {  // a regeneration's outputs are known in advance: make room for them too
    for (const TensorInfo* out : path.outputs) {
      if (out != nullptr && !out->resident() && (out->handle_refs > 0 || out->pin_count > 0)) expected += out->nbytes;
    }
  }
  prepare(expected);
  if (planner_) planner_->kernel_begins(recompute, /*backward=*/false);
  if (kernel_observer_ != nullptr) kernel_observer_->kernel_begins(path, recompute, /*backward=*/false);
}

void MemoryManager::before_backward(const ComputePath& path) {
  if (swap_ && !backward_seen_) swap_->backward_begins();
  backward_seen_ = true;
  prepare(0);
  if (planner_) planner_->kernel_begins(/*recompute=*/false, /*backward=*/true);
  if (kernel_observer_ != nullptr) kernel_observer_->kernel_begins(path, /*recompute=*/false, /*backward=*/true);
}

void MemoryManager::after_backward(const ComputePath& path) {
  if (planner_) planner_->kernel_ends(/*recompute=*/false, /*backward=*/true);
  if (kernel_observer_ != nullptr) kernel_observer_->kernel_ends(path, /*recompute=*/false, /*backward=*/true);
}

void MemoryManager::prepare(int64_t expected_bytes) {
  if (!options_.arena) return;
  const ArenaStats s = options_.arena->stats();
  if (s.in_use > fragmentation_sampled_at_) {
    fragmentation_sampled_at_ = s.in_use;
    stats_.fragmentation_at_peak = s.fragmentation();
  }
  // Several interpreters may share the device (training, evaluation): the one running a kernel
  // answers for the arena.
  set_out_of_memory_handler(this);
  // A plan running the step keeps it within the budget by itself; DTR only answers the
  // allocator if the arena is ever short (make_room).
  if (!evictor_ || (planner_ && planner_->executing())) return;
  const double share = threshold();
  const auto target = static_cast<int64_t>(share * static_cast<double>(options_.arena->capacity()));
  while (options_.arena->stats().in_use + expected_bytes > target) {
    bool freed = false;
    TensorInfo* victim = next_victim(&freed);
    if (victim == nullptr && freed) continue;
    if (victim == nullptr) break;  // what is left is pinned; an allocation may still fail
    evict(*victim);
  }
}

void MemoryManager::after_kernel(const ComputePath& path, bool recompute, double kernel_ms) {
  if (planner_) planner_->kernel_ends(recompute, /*backward=*/false);
  if (kernel_observer_ != nullptr) kernel_observer_->kernel_ends(path, recompute, /*backward=*/false);
  ++stats_.kernels;
  if (recompute) {
    ++stats_.recomputations;
    stats_.recompute_ms += kernel_ms;
  }
  if (options_.timeline != nullptr) options_.timeline->kernel(path.op->traits().name, recompute, kernel_ms);
}

bool MemoryManager::make_room(size_t bytes) {
  // Eviction touches the interpreter, which belongs to one thread; an allocation on an ATen
  // worker fails instead, and the interpreter retries the kernel after making room here.
  if (!evictor_ || making_room_ || prefetching_ || std::this_thread::get_id() != owner_) return false;
  // Another interpreter's device memory (benchmarks switch arenas): not ours to free.
  if (active_arena() != options_.arena.get()) return false;
  making_room_ = true;
  const int64_t need = CpuArena::rounded_size(bytes);
  bool ok = false;
  while (true) {
    const ArenaStats s = options_.arena->stats();
    if (s.largest_free_block >= need) {
      ok = true;
      break;
    }
    if (!swap_ && evict_window(need)) continue;
    // A block of `need` may be one eviction away (a tensor between free neighbours) even when
    // the policy's favourite is elsewhere; failing that, the policy frees memory step by step.
    TensorInfo* victim = pick_for_fragmentation(need);
    bool freed = false;
    if (victim == nullptr) victim = next_victim(&freed);
    if (victim == nullptr && freed) continue;
    if (victim == nullptr && park_a_gradient()) continue;
    if (victim == nullptr) {
      // Everything evictable is gone: what remains is needed now, so no smaller budget works.
      stats_.min_budget_bytes = std::max(stats_.min_budget_bytes, s.in_use + need);
      break;
    }
    evict(*victim);
  }
  making_room_ = false;
  return ok;
}

bool MemoryManager::evict_window(int64_t bytes) {
  const EvictionOptions& options = evictor_->options();
  if (!options.window || !weighs_costs(options.heuristic)) return false;
  const CpuArena& arena = *options_.arena;
  std::unordered_map<int64_t, TensorInfo*> evictable;  // block offset -> its tensor
  for (TensorInfo* t : roots_) {
    const void* data = data_of(*t);
    if (data != nullptr && arena.contains(data) && t->evictable()) evictable.emplace(arena.offset_of_block(data), t);
  }
  if (evictable.empty()) return false;
  const uint64_t now = remat_->now();
  const std::vector<int64_t> window = cheapest_window_offsets(arena, bytes, [&](int64_t offset) -> std::optional<double> {
    auto it = evictable.find(offset);
    if (it == evictable.end()) return std::nullopt;
    return window_cost(evictor_->policy().score(*it->second, now), arena.block_bytes(data_of(*it->second)));
  });
  bool evicted = false;
  for (int64_t offset : window) {
    TensorInfo* t = evictable.at(offset);
    // Evicting one may have released another (its last reader was a view): still a candidate?
    if (root_slot_.count(t) == 0 || !t->evictable()) continue;
    evict(*t);
    ++stats_.window_evictions;
    evicted = true;
  }
  return evicted;
}

TensorInfo* MemoryManager::pick_for_fragmentation(int64_t bytes) {
  // Among the tensors whose block, joined with its free neighbours, makes a hole of `bytes`,
  // the policy's favourite (eviction_score.h); null if evicting no single tensor does.
  const CpuArena& arena = *options_.arena;
  const int64_t v = lowest_score(
      roots_,
      [&](const TensorInfo* t) {
        const void* data = data_of(*t);
        return data != nullptr && arena.contains(data) && t->evictable() && arena.free_span_if_freed(data) >= bytes;
      },
      [&](const TensorInfo* t) { return evictor_->policy().score(*t, remat_->now()); });
  return v >= 0 ? roots_[static_cast<size_t>(v)] : nullptr;
}

TensorInfo* MemoryManager::next_victim(bool* freed) {
  if (swap_) {
    while (true) {
      if (TensorInfo* copied = swap_->pick_victim(roots_)) return copied;
      if (!swap_->wait_for_copy_out(roots_)) break;
    }
    // Bytes copied back ahead of their read cost a copy to get again; a recomputation costs more.
    if (swap_->cancel_prefetch()) {
      *freed = true;
      return nullptr;
    }
  }
  TensorInfo* victim = evictor_->pick_victim(roots_, remat_->now());
  if (drop_parameters_before(victim)) {
    *freed = true;
    return nullptr;
  }
  if (victim != nullptr && swap_) {
    // What recomputing it would cost: its producer, and the evicted neighbourhood it depends on.
    const EvictionCandidate c = candidate_of(*victim, options_.eviction->costs);
    swap_->copy_before_drop(*victim, c.cost_ms + c.neighbourhood_ms);
  }
  return victim;
}

bool MemoryManager::drop_parameters_before(TensorInfo* victim) {
  ParameterSource* source = remat_->parameter_source();
  if (source == nullptr) return false;
  const std::vector<DroppableParameters> gathered = source->droppable();
  if (gathered.empty()) return false;
  const uint64_t now = remat_->now();
  const EvictionHeuristic heuristic = options_.eviction->heuristic;
  const DroppableParameters* best = nullptr;
  double best_score = 0;
  for (const DroppableParameters& g : gathered) {
    EvictionCandidate c;
    c.cost_ms = regeneration_cost(g.cost_ms);
    c.bytes = g.bytes;
    c.last_access = g.last_access;
    const double score = eviction_score(heuristic, c, now);
    if (best == nullptr || score < best_score) {
      best = &g;
      best_score = score;
    }
  }
  if (victim != nullptr && evictor_->policy().score(*victim, now) <= best_score) return false;
  source->drop(best->id);
  ++stats_.evictions;
  return true;
}

at::Tensor MemoryManager::swap_in(TensorInfo& t) {
  TORCH_INTERNAL_ASSERT(swap_ != nullptr, "swap_in without host swap");
  // Its bytes are allocated here, on this thread: the arena makes room by evicting if it must.
  set_out_of_memory_handler(this);
  return swap_->bring_back(t);
}

bool MemoryManager::prefetch(TensorInfo& t) {
  if (!swap_) return false;
  const double share = threshold();  // as before_kernel's
  const auto target = static_cast<int64_t>(share * static_cast<double>(options_.arena->capacity()));
  return swap_->prefetch(t, [&](int64_t bytes) {
    if (active_arena() != options_.arena.get()) return at::Tensor();  // not ours to allocate in now
    const int64_t need = CpuArena::rounded_size(static_cast<size_t>(bytes));
    // Room for a value backward reads sooner: drop copied values it reads later (they come back
    // by their own prefetch); nothing is ever recomputed for a prefetch.
    while (options_.arena->stats().in_use + need > target) {
      TensorInfo* later = swap_->later_victim(roots_, t);
      if (later == nullptr) return at::Tensor();
      evict(*later);
    }
    set_out_of_memory_handler(this);
    prefetching_ = true;
    at::Tensor out;
    try {
      out = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(t.device));
    } catch (const OutOfBudget&) {
      // no block large enough without evicting: try again later
    }
    prefetching_ = false;
    return out;
  });
}

void MemoryManager::gradient_pending(TensorInfo& t) {
  if (swap_ && !t.is_leaf && t.grad.defined()) pending_grads_.push_back(&t);
}

at::Tensor MemoryManager::take_gradient(TensorInfo& t) {
  if (!swap_) return std::move(t.grad);
  auto it = std::find(pending_grads_.begin(), pending_grads_.end(), &t);
  if (it != pending_grads_.end()) pending_grads_.erase(it);
  if (t.parked_grad == nullptr) return std::move(t.grad);
  set_out_of_memory_handler(this);  // its bytes are allocated here, on this thread
  return swap_->unpark_gradient(t);
}

bool MemoryManager::park_a_gradient() {
  if (!swap_) return false;
  // Backward runs the tape in reverse, so the record made first in forward (the smallest id)
  // has its gradient read last.
  std::vector<TensorInfo*> order(pending_grads_);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->id < b->id; });
  for (TensorInfo* t : order) {
    if (swap_->park_gradient(*t)) return true;
  }
  return false;
}

void MemoryManager::evict(TensorInfo& victim, bool planned) {
  if (swap_ && victim.on_host()) swap_->dropped(victim);
  if (options_.timeline != nullptr) {
    options_.timeline->evicted(victim.producer ? victim.producer->op->traits().name : "?", victim.id, victim.nbytes);
  }
  if (!planned && kernel_observer_ != nullptr) kernel_observer_->evicted(victim);
  remat_->evict(victim);
  if (!planned) ++stats_.evictions;
}

void MemoryManager::on_resident(TensorInfo& t) {
  ++stats_.resident_tensors;
  stats_.resident_bytes += t.nbytes;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, stats_.resident_bytes);
  if (!t.is_view() && t.nbytes > 0) {
    root_slot_.emplace(&t, roots_.size());
    roots_.push_back(&t);
  }
  if (evictor_) evictor_->policy().on_resident(t);
  if (planner_) planner_->on_resident(t);
}

void MemoryManager::forget(TensorInfo& t) {
  --stats_.resident_tensors;
  stats_.resident_bytes -= t.nbytes;
  auto it = root_slot_.find(&t);
  if (it == root_slot_.end()) return;
  // Swap-remove keeps roots_ dense, so sampling stays O(1).
  const size_t slot = it->second;
  root_slot_.erase(it);
  if (slot + 1 != roots_.size()) {
    roots_[slot] = roots_.back();
    root_slot_[roots_[slot]] = slot;
  }
  roots_.pop_back();
}

void MemoryManager::on_dropped(TensorInfo& t) {
  forget(t);
  if (evictor_) evictor_->policy().on_dropped(t);
  if (planner_) planner_->on_dropped(t);
}

void MemoryManager::on_destroyed(TensorInfo& t) {
  if (t.resident()) forget(t);
  if (options_.checkpoint_blocks > 0) block_made_.forget(id_of(&t));
  if (swap_ && t.has_gradient()) {
    auto it = std::find(pending_grads_.begin(), pending_grads_.end(), &t);
    if (it != pending_grads_.end()) pending_grads_.erase(it);
  }
  if (swap_) swap_->release(t);
  if (evictor_) evictor_->policy().on_destroyed(t);
  if (planner_) planner_->on_destroyed(t);
}

int64_t MemoryManager::evict_all() {
  // Roots only: a view owns no bytes, and evicting its root drops it. Evicting a root can release
  // others (their last reader was a view), so re-scan until nothing changes.
  int64_t evicted = 0;
  for (bool again = true; again;) {
    again = false;
    for (TensorInfo* t : std::vector<TensorInfo*>(roots_)) {
      if (root_slot_.count(t) != 0 && t->evictable()) {
        evict(*t);
        ++evicted;
        again = true;
      }
    }
  }
  return evicted;
}

}  // namespace ht
