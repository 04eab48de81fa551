#include "planner/dtr_replay.h"

#include "alloc/byte_size.h"
#include "alloc/cpu_arena.h"
#include "memory/eviction_score.h"
#include "memory/eviction_window.h"
#include "schedule/block_recorder.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace ht {
namespace {

using End = CpuArena::End;
using Kind = TraceEvent::Kind;

std::string str(int64_t v) { return std::to_string(v); }

// kDropped: allocated once, not resident now (evicted, or freed by the step).
enum class State : uint8_t { kUnborn, kResident, kDropped };

struct Slot {
  State state = State::kUnborn;
  bool freed = false;  // the step let go of it: resident again only while a regeneration reads it
  bool on_host = false;  // offloaded by its block's plan: comes back by copy, not recomputation
  bool prefetched = false;  // brought back ahead of its read: no candidate until read (not a root in the engine)
  int pins = 0;        // a kernel about to run (or running) reads it: not evictable
  void* data = nullptr;
  uint64_t last_access = 0;
};

class Replay {
 public:
  Replay(const StepTrace& trace, const ReplayOptions& options)
      : trace_(trace), options_(options), arena_(options.budget_bytes), slots_(trace.tensors.size()),
        users_(trace.tensors.size()), outputs_(trace.kernels.size()), made_in_(trace.kernels.size()),
        root_slot_(trace.tensors.size(), -1), mark_(trace.kernels.size(), 0) {
    arena_.follow_capacity();  // ReplayResult::budget_acted
    for (int k = 0; k < static_cast<int>(trace.kernels.size()); ++k) {
      if (trace.kernels[k].backward) continue;  // a tape entry is no ComputePath: nobody's user
      for (int in : trace.kernels[k].inputs) {
        if (users_[in].empty() || users_[in].back() != k) users_[in].push_back(k);
      }
    }
    for (int t = 0; t < static_cast<int>(trace.tensors.size()); ++t) {
      if (trace.tensors[t].producer >= 0) outputs_[trace.tensors[t].producer].push_back(t);
    }
    if (options.block_link.on()) {
      backward_at_.assign(trace.kernels.size(), -1);
      for (const TraceEvent& e : trace.events) {
        if (e.kind != Kind::kKernelBegins || !trace.kernels[e.index].backward || backward_at_[e.index] >= 0) continue;
        backward_at_[e.index] = static_cast<int>(backward_.size());
        backward_.push_back(e.index);
      }
    }
  }

  ~Replay() {  // the arena leaks its mapping (and warns) if destroyed with blocks in use
    for (Slot& s : slots_) arena_.deallocate(s.data);
    arena_.deallocate(persistent_);
  }

  ReplayResult run() {
    arena_.reset_peak();
    if (trace_.persistent_bytes > 0) {
      persistent_ = place(trace_.persistent_bytes, End::kHigh);
      if (persistent_ == nullptr) fail_for_room("the persistent state", trace_.persistent_bytes);
    }
    for (size_t i = 0; i < trace_.events.size() && result_.feasible; ++i) {
      const TraceEvent& e = trace_.events[i];
      switch (e.kind) {
        case Kind::kAllocated:
          if (!on_allocated(e.index)) {
            // As run_with_room: the kernel that threw is run again from its start, after room
            // for what it asked and what it held (its allocations, gone with the throw).
            const int k = open_.empty() ? -1 : open_.back();
            const int64_t asked = trace_.tensors[e.index].bytes;
            int64_t held = 0;
            if (k >= 0 && open_.size() == 1 && ++reruns_[k] <= 8 && room_to_rerun(k, asked, held)) {
              i = first_event_[k] - 1;
              continue;
            }
            // What the kernel needs at once: the request and what it held when it threw.
            fail_for_room(k < 0 ? "an allocation outside kernels" : kernel_words(k), asked + held);
          }
          break;
        case Kind::kKernelBegins:
          first_event_[e.index] = i + 1;
          on_kernel_begins(e.index);
          break;
        case Kind::kKernelEnds: on_kernel_ends(e.index); break;
        case Kind::kFreed:
          if (slots_[e.index].state == State::kResident) release(e.index);
          slots_[e.index].freed = true;
          break;
      }
    }
    result_.peak_bytes = arena_.stats().peak_in_use;
    result_.budget_acted = result_.budget_acted || arena_.placed_by_capacity();
    result_.blocks.assign(block_plans_.solved_blocks().begin(), block_plans_.solved_blocks().end());
    return result_;
  }

 private:
  // False: no room, everything evictable evicted.
  bool on_allocated(int t) {
    const TraceTensor& tt = trace_.tensors[t];
    void* data = place(tt.bytes, arena_.end_for(static_cast<size_t>(tt.bytes), tt.low_end));
    if (data == nullptr) return false;
    make_resident(t, data);
    // The engine attaches a kernel's outputs only when it returns: until then no policy sees them.
    if (!open_.empty()) {
      ++slots_[t].pins;
      made_in_[open_.back()].push_back(t);
    }
    return true;
  }

  // MemoryManager::make_room_after for kernel `k`, whose allocation of `requested` bytes found no
  // room: what `k` allocated goes (its temporaries and outputs die with the throw; they are
  // allocated again when it reruns), then room for all of it in one block, or else for the
  // request in one block and the rest in pieces. False where not even that can be made.
  bool room_to_rerun(int k, int64_t requested, int64_t& held) {
    held = 0;
    for (int t : made_in_[k]) {
      Slot& slot = slots_[t];
      if (slot.state == State::kResident) {
        held += arena_.block_bytes(slot.data);
        release(t);
      }
      slot = Slot{};
    }
    made_in_[k].clear();
    const int64_t need = CpuArena::rounded_size(static_cast<size_t>(requested));
    if (make_room(need + held)) return true;
    return make_room(need) && arena_.stats().free_bytes >= need + held;
  }

  void on_kernel_begins(int k) {
    const TraceKernel& kernel = trace_.kernels[k];
    if (kernel.backward && !backward_seen_) {
      backward_seen_ = true;
      settle_offloads();  // as at block_begins(-1), where no forward kernel followed the last block
      result_.forward_end_bytes = arena_.stats().in_use;
    }
    if (options_.checkpoint_blocks > 0 && !kernel.backward && kernel.block != block_) {
      settle_offloads();
      if (block_ >= 0 && block_ + 1 < options_.checkpoint_blocks) drop_block();
      block_made_.clear();
      last_made_.clear();
      block_ = kernel.block;
    }
    if (!backward_at_.empty() && kernel.backward) prefetch_saved(backward_at_[k]);
    open_.push_back(k);
    const std::vector<int>& inputs = trace_.kernels[k].inputs;
    // Pin every input first, so that regenerating one cannot make room by dropping another; a
    // prefetched input is read: a candidate from now on, as the engine attaches it.
    for (int in : inputs) {
      ++slots_[in].pins;
      slots_[in].prefetched = false;
    }
    for (int in : inputs) {
      if (result_.feasible && slots_[in].state != State::kResident) regenerate(in, k);
    }
    if (!result_.feasible) return;
    ++now_;
    for (int in : inputs) slots_[in].last_access = now_;
    prepare(0);
  }

  void on_kernel_ends(int k) {
    if (options_.checkpoint_blocks > 0 && !trace_.kernels[k].backward && block_ >= 0) {
      // A view allocates nothing: its outputs are what it reads.
      last_made_ = outputs_[k].empty() ? trace_.kernels[k].inputs : outputs_[k];
      std::vector<uint64_t> reads;
      for (int in : trace_.kernels[k].inputs) reads.push_back(static_cast<uint64_t>(in) + 1);
      std::vector<std::pair<uint64_t, int64_t>> made;
      for (int t : outputs_[k]) made.emplace_back(static_cast<uint64_t>(t) + 1, trace_.tensors[t].bytes);
      block_made_.op(trace_.kernels[k].op, trace_.kernels[k].modeled_ms, reads, made);
    }
    for (int in : trace_.kernels[k].inputs) unpin(in);
    for (int t : made_in_[k]) unpin(t);
    made_in_[k].clear();
    auto it = std::find(open_.rbegin(), open_.rend(), k);
    if (it != open_.rend()) open_.erase(std::next(it).base());
  }

  // residency.cpp's materialize: a frame is expanded once (its producer's inputs pinned and the
  // missing ones pushed), then run once they are all resident. Pins keep regenerated inputs
  // alive exactly as long as a pending frame will read them.
  void regenerate(int target, int reader) {
    struct Frame { int t; bool expanded; };
    std::vector<Frame> stack{{target, false}};
    ++slots_[target].pins;
    while (!stack.empty() && result_.feasible) {
      const int t = stack.back().t;
      if (!stack.back().expanded) {
        if (slots_[t].state == State::kResident) {  // regenerated meanwhile, as another output
          stack.pop_back();
          continue;
        }
        if (slots_[t].on_host) {  // as the engine's swap_in: its bytes back, nothing run
          bring_back(t, reader);
          stack.pop_back();
          continue;
        }
        if (!regenerable(t)) {
          const std::string lineage = t == target ? "" : ", whose lineage holds tensor " + str(t);
          return fail(kernel_words(reader) + " needs tensor " + str(target) + lineage +
                      ", freed and with no recomputable producer");
        }
        stack.back().expanded = true;
        for (int in : producer_of(t).inputs) ++slots_[in].pins;
        for (int in : producer_of(t).inputs) {
          if (slots_[in].state != State::kResident) stack.push_back({in, false});
        }
        continue;
      }
      if (slots_[t].state != State::kResident) rerun(trace_.tensors[t].producer, reader);
      stack.pop_back();
      for (int in : producer_of(t).inputs) unpin(in);
    }
    if (!result_.feasible) return;
    slots_[target].last_access = now_;
    unpin(target);
  }

  // As Tape::prefetch_saved with planned offload: before backward kernel `now` (its place in
  // backward) runs, the offloaded values the kernels from it to `kLookahead` ahead read come back,
  // in order, while they fit under the eviction threshold without regenerating anything; to make
  // room for one, values read later than it that have a host copy are dropped (HostSwap's
  // later_victim: the one made first). The first that does not fit ends it until the next kernel.
  // With room to spare the device fills with them: the measured peak, which the plan's need
  // alone missed by a third (GPT-large, keeping nothing on the device, 2026-12-05).
  static constexpr int kLookahead = 24;  // as SwapOptions::lookahead_entries
  void prefetch_saved(int now) {
    ahead_ = std::max(ahead_, now);
    for (; ahead_ < static_cast<int>(backward_.size()) && ahead_ - now < kLookahead; ++ahead_) {
      for (int t : trace_.kernels[backward_[static_cast<size_t>(ahead_)]].inputs) {
        if (!prefetch(t)) return;
      }
    }
  }

  bool prefetch(int t) {
    Slot& slot = slots_[t];
    if (slot.state == State::kResident || !slot.on_host || slot.freed) return true;
    const int64_t need = CpuArena::rounded_size(static_cast<size_t>(trace_.tensors[t].bytes));
    const auto target = static_cast<int64_t>(options_.eviction_threshold * static_cast<double>(arena_.capacity()));
    while (arena_.stats().in_use + need > target) {
      result_.budget_acted = true;
      int later = -1;
      for (int v : roots_) {
        if (v < t && slots_[v].on_host && evictable(v) && (later < 0 || v < later)) later = v;
      }
      if (later < 0) return false;
      evict(later);
    }
    const auto bytes = static_cast<size_t>(trace_.tensors[t].bytes);
    void* data = arena_.allocate(bytes, arena_.end_for(bytes, true, /*recomputed=*/true));
    if (data == nullptr) {  // no free block fits without evicting: later
      result_.budget_acted = true;
      return false;
    }
    make_resident(t, data);
    slot.prefetched = true;
    prefetching_.push_back(t);
    result_.offload_in_bytes += trace_.tensors[t].bytes;
    return true;
  }

  // As HostSwap::cancel_prefetch, where memory is short and nothing with a host copy can be
  // dropped: the bytes of the prefetch started last (read furthest ahead) go back, uncounted as
  // an eviction; it is copied again when read.
  bool cancel_prefetch() {
    while (!prefetching_.empty()) {
      const int t = prefetching_.back();
      prefetching_.pop_back();
      Slot& slot = slots_[t];
      if (!slot.prefetched || slot.state != State::kResident) continue;
      if (slot.pins > 0) continue;
      slot.prefetched = false;
      release(t);
      result_.offload_in_bytes -= trace_.tensors[t].bytes;
      return true;
    }
    return false;
  }

  void bring_back(int t, int reader) {
    ++now_;
    const auto bytes = static_cast<size_t>(trace_.tensors[t].bytes);
    void* data = place(trace_.tensors[t].bytes, arena_.end_for(bytes, true, /*recomputed=*/true));
    if (data == nullptr) return fail_for_room("tensor " + str(t) + ", copied back from host for " + kernel_words(reader) + ",", trace_.tensors[t].bytes);
    make_resident(t, data);
    result_.offload_in_bytes += trace_.tensors[t].bytes;
  }

  void rerun(int k, int reader) {
    ++now_;
    for (int in : trace_.kernels[k].inputs) slots_[in].last_access = now_;
    // As before_kernel for a recomputation: its outputs are known, so room is made for them too.
    int64_t expected = 0;
    for (int out : outputs_[k]) expected += attaches(out) ? trace_.tensors[out].bytes : 0;
    prepare(expected);
    std::vector<int> placed;
    for (int out : outputs_[k]) {
      if (!attaches(out)) continue;
      const auto bytes = static_cast<size_t>(trace_.tensors[out].bytes);
      void* data = place(trace_.tensors[out].bytes, arena_.end_for(bytes, true, /*recomputed=*/true));
      if (data == nullptr) {
        const std::string who = kernel_words(k) + ", regenerated for " + kernel_words(reader) + ",";
        return fail_for_room(who, trace_.tensors[out].bytes);
      }
      make_resident(out, data);
      ++slots_[out].pins;  // the kernel has not returned: its outputs are no candidates yet
      placed.push_back(out);
    }
    for (int out : placed) --slots_[out].pins;
    ++result_.recomputations;
    result_.recompute_ms += trace_.kernels[k].ms;
  }

  void* place(int64_t bytes, End end) {
    const auto n = static_cast<size_t>(bytes);
    void* data = arena_.allocate(n, end);
    if (data == nullptr && make_room(CpuArena::rounded_size(n))) data = arena_.allocate(n, end);
    return data;
  }

  // Why a block of `bytes` found no room with everything evictable evicted: the budget is too
  // small for what must be held at once, or its free memory is in pieces. The numbers add up.
  void fail_for_room(const std::string& who, int64_t bytes) {
    const ArenaStats s = arena_.stats();
    const int64_t need = CpuArena::rounded_size(static_cast<size_t>(bytes)), budget = arena_.capacity();
    if (s.in_use + need > budget) {
      return fail(who + " needs " + format_bytes(need) + " beside " + format_bytes(s.in_use) +
                  " that cannot be evicted: " + exact(s.in_use + need) + ", more than the budget's " + exact(budget));
    }
    fail(who + " needs a block of " + exact(need) + "; the " + format_bytes(s.in_use) + " that cannot be evicted leave " +
         format_bytes(budget - s.in_use) + " of the budget's " + format_bytes(budget) + " free, but in pieces, the largest " +
         exact(s.largest_free_block) + ": fragmentation");
  }

  // Bytes two of which are compared: "8.00 MiB (8388608 bytes)".
  static std::string exact(int64_t bytes) { return format_bytes(bytes) + " (" + str(bytes) + " bytes)"; }

  // "kernel 45 (linear's backward, block 2)"
  std::string kernel_words(int k) const {
    const TraceKernel& kernel = trace_.kernels[static_cast<size_t>(k)];
    std::string words = "kernel " + str(k) + " (" + kernel.op + (kernel.backward ? "'s backward" : "");
    return words + (kernel.block >= 0 ? ", block " + str(kernel.block) : std::string()) + ")";
  }

  bool make_room(int64_t need) {
    result_.budget_acted = true;
    while (true) {
      const ArenaStats s = arena_.stats();
      if (s.largest_free_block >= need) return true;
      if (evict_window(need)) continue;
      // A block of `need` may be one eviction away (a tensor between free neighbours) even when
      // the policy's favourite is elsewhere; failing that, the policy frees memory step by step.
      int victim = best_where([&](int t) { return evictable(t) && arena_.free_span_if_freed(slots_[t].data) >= need; });
      if (victim < 0) victim = pick_victim();
      if (victim == kCancelled) continue;
      if (victim < 0) {
        // Everything evictable is gone: what remains is needed now, so no smaller budget works.
        result_.min_budget_bytes = std::max(result_.min_budget_bytes, s.in_use + need);
        return false;
      }
      evict(victim);
    }
  }

  // As MemoryManager::evict_window: the arena in address order, each resident evictable tensor
  // at its score times its block, the cheapest window that spans `need` evicted whole.
  bool evict_window(int64_t need) {
    if (!options_.window || !weighs_costs(options_.policy)) return false;
    std::unordered_map<int64_t, int> evictable_at;  // block offset -> tensor
    for (int t : roots_) {
      if (evictable(t)) evictable_at.emplace(arena_.offset_of_block(slots_[t].data), t);
    }
    if (evictable_at.empty()) return false;
    const std::vector<int64_t> window = cheapest_window_offsets(arena_, need, [&](int64_t offset) -> std::optional<double> {
      auto it = evictable_at.find(offset);
      if (it == evictable_at.end()) return std::nullopt;
      return window_cost(score(it->second), arena_.block_bytes(slots_[it->second].data));
    });
    bool evicted = false;
    for (int64_t offset : window) {
      const int t = evictable_at.at(offset);
      if (!evictable(t)) continue;
      evict(t);
      ++result_.window_evictions;
      evicted = true;
    }
    return evicted;
  }

  void prepare(int64_t expected_bytes) {
    const auto target = static_cast<int64_t>(options_.eviction_threshold * static_cast<double>(arena_.capacity()));
    while (arena_.stats().in_use + expected_bytes > target) {
      result_.budget_acted = true;
      const int victim = pick_victim();
      if (victim == kCancelled) continue;
      if (victim < 0) break;  // what is left is pinned; an allocation may still fail
      evict(victim);
    }
  }

  // The engine's choice (eviction_score.h), over the trace's tensors; with offload, as host swap's
  // pick_victim: the largest with a copy on host first.
  static constexpr int kCancelled = -2;  // pick_victim gave back a prefetch's bytes instead
  int pick_victim() {
    if (options_.block_link.on()) {
      int best = -1;
      for (int t : roots_) {
        if (!slots_[t].on_host || !evictable(t)) continue;
        if (best < 0 || trace_.tensors[t].bytes > trace_.tensors[best].bytes ||
            (trace_.tensors[t].bytes == trace_.tensors[best].bytes && t < best)) {
          best = t;
        }
      }
      if (best >= 0) return best;
      if (cancel_prefetch()) return kCancelled;
    }
    const int64_t v = choose_victim(
        roots_, options_.ignore_small, [&](int t) { return trace_.tensors[t].bytes; },
        [&](int t) { return evictable(t); }, [&](int t) { return score(t); });
    return v >= 0 ? roots_[static_cast<size_t>(v)] : -1;
  }

  template <typename Usable>
  int best_where(Usable&& usable) const {
    const int64_t v = lowest_score(roots_, usable, [&](int t) { return score(t); });
    return v >= 0 ? roots_[static_cast<size_t>(v)] : -1;
  }

  double score(int t) const {
    // dtr_eq and megengine are replayed as dtr (dtr_replay.h).
    const EvictionHeuristic h = weighs_costs(options_.policy) ? EvictionHeuristic::kDtr : options_.policy;
    EvictionCandidate c;
    c.cost_ms = cost_of(t);
    c.bytes = trace_.tensors[t].bytes;
    c.last_access = slots_[t].last_access;
    if (h == EvictionHeuristic::kDtr) {
      Neighbours graph(*this);
      c.neighbourhood_ms = evicted_neighbourhood_cost(graph, t);
    }
    return eviction_score(h, c, now_);
  }

  // The trace as eviction_score.h walks it (e*): a tensor's neighbours are its producer's inputs
  // and its users' outputs. Kernels are marked with a generation, not put in a set: this runs for
  // every candidate at every eviction.
  struct Neighbours {
    const Replay& r;
    uint32_t generation;
    explicit Neighbours(const Replay& replay) : r(replay), generation(++replay.generation_) {
      if (generation == 0) {  // wrapped: old marks could match
        std::fill(r.mark_.begin(), r.mark_.end(), 0);
        generation = r.generation_ = 1;
      }
    }
    template <typename Fn>
    void for_each_neighbour(int n, Fn&& fn) const {
      if (r.trace_.tensors[n].producer >= 0) {
        for (int in : r.producer_of(n).inputs) fn(in);
      }
      for (int user : r.users_[n]) {
        for (int out : r.outputs_[user]) fn(out);
      }
    }
    bool evicted(int n) const { return r.slots_[n].state == State::kDropped && r.trace_.tensors[n].producer >= 0; }
    bool mark_producer(int n) {
      uint32_t& mark = r.mark_[r.trace_.tensors[n].producer];
      if (mark == generation) return false;
      mark = generation;
      return true;
    }
    double cost(int n) const { return r.cost_of(n); }
  };

  void make_resident(int t, void* data) {
    slots_[t].state = State::kResident;
    slots_[t].data = data;
    slots_[t].last_access = now_;
    if (trace_.tensors[t].producer < 0) return;
    root_slot_[t] = static_cast<int>(roots_.size());
    roots_.push_back(t);
  }

  // Evicted or freed alike: the block goes back to the arena and the tensor leaves the candidates.
  void release(int t) {
    arena_.deallocate(slots_[t].data);
    slots_[t].data = nullptr;
    slots_[t].state = State::kDropped;
    const int slot = root_slot_[t];
    if (slot < 0) return;
    roots_[slot] = roots_.back();  // swap-remove, as the engine's roots_
    root_slot_[roots_[slot]] = slot;
    roots_.pop_back();
    root_slot_[t] = -1;
  }

  void evict(int t) {
    result_.victim_scores.push_back(score(t));
    release(t);
    ++result_.evictions;
    result_.victims.push_back(t);
  }

  // checkpoint_blocks: as MemoryManager::drop_block.
  void drop_block() {
    const std::vector<uint64_t>& made = block_made_.values();
    std::vector<bool> saved(made.size(), false);
    for (size_t i = 0; i < made.size(); ++i) {
      const int t = static_cast<int>(made[i]) - 1;
      saved[i] = evictable(t) && std::find(last_made_.begin(), last_made_.end(), t) == last_made_.end();
    }
    const schedule::BlockPlan* plan = options_.block_keep_bytes > 0 || options_.block_keep_share > 0 || options_.block_link.on()
                                          ? &block_plans_.plan(block_made_.graph(saved))
                                          : nullptr;
    for (size_t i = 0; i < made.size(); ++i) {
      if (!saved[i] || (plan != nullptr && plan->keep[i])) continue;
      const int t = static_cast<int>(made[i]) - 1;
      if (plan != nullptr && plan->offload[i]) {  // copied out beside the next block: dropped after it
        slots_[t].on_host = true;
        result_.offload_out_bytes += trace_.tensors[t].bytes;
        copying_.push_back(t);
      } else {
        evict(t);
      }
    }
    if (plan != nullptr) result_.offload_exposed_ms += plan->link_ms;
  }

  // As MemoryManager::settle_offloads, when forward enters another block (or leaves the last):
  // the values the block before last offloaded, copied out beside the block that just ended,
  // leave the device (those DTR took meanwhile are gone already). The engine settles them there
  // whether their copies finished early or not, so they hold their bytes through one block.
  void settle_offloads() {
    for (int t : copying_) {
      if (slots_[t].state == State::kResident && evictable(t)) evict(t);
    }
    copying_.clear();
  }

  void unpin(int t) {  // as release_if_unused: a freed tensor goes once no frame reads it
    if (--slots_[t].pins == 0 && slots_[t].freed && slots_[t].state == State::kResident) release(t);
  }

  void fail(const std::string& sentence) {
    if (result_.feasible) result_.feasible = false, result_.failure = sentence;
  }

  const TraceKernel& producer_of(int t) const { return trace_.kernels[trace_.tensors[t].producer]; }
  double cost_of(int t) const {
    const TraceKernel& k = producer_of(t);
    return regeneration_cost(options_.modeled_costs ? k.modeled_ms : k.ms);
  }
  bool regenerable(int t) const {
    return slots_[t].state == State::kDropped && trace_.tensors[t].producer >= 0 && producer_of(t).recomputable;
  }
  bool evictable(int t) const {
    const Slot& s = slots_[t];
    return s.state == State::kResident && !s.freed && !s.prefetched && s.pins == 0 && trace_.tensors[t].producer >= 0 &&
           producer_of(t).recomputable;
  }
  // A regeneration attaches the outputs the step still holds, and a freed one a pending frame reads.
  bool attaches(int t) const { return slots_[t].state == State::kDropped && (!slots_[t].freed || slots_[t].pins > 0); }

  const StepTrace& trace_;
  const ReplayOptions options_;
  CpuArena arena_;
  std::vector<Slot> slots_;
  std::unordered_map<int, size_t> first_event_;  // kernel -> the event after its beginning
  std::unordered_map<int, int> reruns_;           // kernel -> times run again for room (at most 8)
  std::vector<std::vector<int>> users_;    // tensor -> forward kernels that read it
  std::vector<std::vector<int>> outputs_;  // kernel -> tensors it produces
  std::vector<std::vector<int>> made_in_;  // kernel -> tensors allocated while it ran
  // Resident tensors with a producer: the engine's roots_, kept in its order so that ties
  // between equal scores fall the same way.
  std::vector<int> roots_, root_slot_;
  std::vector<int> open_;  // kernels begun and not ended
  mutable std::vector<uint32_t> mark_;  // by kernel: Neighbours' generation
  mutable uint32_t generation_ = 0;
  void* persistent_ = nullptr;
  uint64_t now_ = 0;
  bool backward_seen_ = false;
  int block_ = -1;                         // checkpoint_blocks: the block forward is in
  // block_link: backward's kernels in the order they begin, each one's place there, and the next
  // place whose offloaded values to prefetch (Tape::prefetch_saved's `ahead`).
  std::vector<int> backward_, backward_at_;
  int ahead_ = 0;
  std::vector<int> copying_;  // offloaded by the last block dropped: on the device until settled
  std::vector<int> prefetching_;  // prefetched, in order (cancel_prefetch gives back the last)
  schedule::BlockRecorder block_made_;  // what it made (as the engine records it)
  std::vector<int> last_made_;          // its last kernel's outputs
  schedule::BlockPlans block_plans_{options_.block_keep_bytes, options_.block_keep_share, options_.block_link};
  ReplayResult result_;
};

}  // namespace

ReplayResult replay_step(const StepTrace& trace, const ReplayOptions& options) {
  if (options.budget_bytes <= 0) {
    throw std::invalid_argument("replay_step: budget_bytes must be positive, got " + str(options.budget_bytes));
  }
  check_step_trace(trace, "replay_step");
  return Replay(trace, options).run();
}

}  // namespace ht
