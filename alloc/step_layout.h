#pragma once
// A static memory layout for a repeating step (a training step): record the step's arena
// allocations and frees once, pack them offline (alloc/static_layout.h), then serve the packed
// offsets to the allocator on every later step. A replayed step puts each block where the plan
// does, so it cannot fragment: at every moment the arena's blocks are the plan's, and its
// footprint is the planned one, step after step. Bytes and offsets only; it never sees a tensor.
//
// Blocks already in the arena when recording begins (parameters at its top, a batch) keep their
// addresses, so the plan is packed around them: each is an obstacle until it is freed (or for
// the whole step), and the step's blocks fill the gaps between them as well as the space below.
// The alternative, packing from offset 0 as if the arena were empty and letting the allocator
// refuse what collides, would turn every collision into a miss on every step.
//
// Replay matches by order and size: the i-th allocation of a step is expected to be the i-th
// recorded one. ATen's worker threads may reorder the allocations of one kernel, so an
// allocation takes the first recorded block of its size among the next kLookahead not yet
// served; a block passed over while kLookahead later ones were served is given up. What does
// not match (another size, another count, a range not free) is a miss and is allocated as
// usual; the advisor never makes an allocation fail. (A refused range counts in the arena's
// failed_allocations, as any refusal does.)
//
// Limits. A block allocated in one step and freed in the next (a batch prefetched for the next
// step) cannot sit at one offset every step, since its successor is allocated while it lives:
// keep such blocks out of the recorded window, or accept their misses. Likewise a block the
// recorded step leaves allocated holds its address into the replays, where the plan may want it
// for something else. Recording assumes no allocation is in flight on another thread when it
// begins.

#include "alloc/cpu_device_allocator.h"
#include "alloc/static_layout.h"

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ht {

class CpuArena;

class StepLayout final : public PlacementAdvisor {
 public:
  // How far ahead of the expected block an allocation may match (reordering by worker threads).
  static constexpr size_t kLookahead = 16;

  struct Block {
    int64_t bytes = 0;            // rounded
    int64_t begin = 0;            // tick of its allocation
    int64_t end = 0;              // tick of its free, or the last tick if not freed while recording
    int64_t offset = 0;           // planned (before end_recording(), the recorded one)
    int64_t recorded_offset = 0;  // where the recorded step had it
  };

  // Starts recording, around the blocks `arena` holds now (they are obstacles). Throws
  // std::logic_error while recording or replaying. Install the StepLayout with
  // set_placement_advisor() for it to see anything.
  void begin_recording(const CpuArena& arena);
  // The same around explicit (offset, bytes) blocks, in an arena of `capacity` bytes.
  void begin_recording(const std::vector<std::pair<int64_t, int64_t>>& live_blocks, int64_t capacity);
  // Stops recording and packs what was recorded: the plan the next replays serve. Packs under
  // the lock (milliseconds for thousands of blocks): call it between steps.
  void end_recording();

  // Serves the plan until end_replay(). Throws std::logic_error without a plan or while
  // recording or replaying. Resets hits() and misses().
  void begin_replay();
  void end_replay();

  bool has_plan() const;
  // The highest address the plan uses (bytes from the arena's base), obstacles' gaps included.
  int64_t planned_peak_bytes() const;
  // The most bytes the step's own blocks had live at one time.
  int64_t lower_bound_bytes() const;
  // Whether the planned peak is within the arena recorded in; if not, the blocks beyond miss.
  bool plan_fits() const;
  // The step's blocks in allocation order, with their planned offsets.
  std::vector<Block> blocks() const;
  // The blocks that were in the arena at begin_recording(), live until freed or the end.
  std::vector<PlacedBlock> obstacles() const;

  // Of the current or last replay.
  int64_t hits() const;
  int64_t misses() const;
  // After end_replay(): every allocation was a hit, and as many as were recorded.
  bool replay_matched() const;

  // PlacementAdvisor.
  std::optional<int64_t> offset_for(int64_t rounded_bytes) override;
  void on_allocated(int64_t offset, int64_t rounded_bytes, bool as_advised) override;
  void on_freed(int64_t offset) override;
  bool holds_low_end() const override;  // while replaying: the plan packs blocks from offset 0

 private:
  enum class Mode { kIdle, kRecording, kReplaying };
  void check_idle(const char* what) const;  // caller holds the lock

  mutable std::mutex mutex_;
  Mode mode_ = Mode::kIdle;

  // Recording.
  int64_t tick_ = 0;
  int64_t capacity_ = 0;
  std::vector<Block> blocks_;
  std::vector<PlacedBlock> obstacles_;
  std::unordered_map<int64_t, size_t> live_blocks_;     // offset -> index in blocks_
  std::unordered_map<int64_t, size_t> live_obstacles_;  // offset -> index in obstacles_

  // The plan.
  bool planned_ = false;
  int64_t planned_peak_ = 0;
  int64_t lower_bound_ = 0;

  // Replay.
  std::vector<char> served_;  // per block: its offset was handed out
  size_t next_ = 0;           // no block before it is still expected
  int64_t hits_ = 0;
  int64_t misses_ = 0;
  bool matched_ = false;
};

}  // namespace ht
