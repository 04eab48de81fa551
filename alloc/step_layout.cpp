#include "alloc/step_layout.h"

#include "alloc/cpu_arena.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ht {

void StepLayout::begin_recording(const CpuArena& arena) {
  // Read before taking our lock: the arena's lock is never held inside ours.
  begin_recording(arena.allocated_blocks(), arena.capacity());
}

void StepLayout::begin_recording(const std::vector<std::pair<int64_t, int64_t>>& live_blocks, int64_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_idle("begin_recording");
  tick_ = 0;
  capacity_ = capacity;
  blocks_.clear();
  live_blocks_.clear();
  obstacles_.clear();
  live_obstacles_.clear();
  for (const auto& [offset, bytes] : live_blocks) {
    live_obstacles_[offset] = obstacles_.size();
    obstacles_.push_back({LayoutBlock{bytes, 0, 0}, offset});  // end set when freed or at the end
  }
  planned_ = false;
  planned_peak_ = 0;
  lower_bound_ = 0;
  mode_ = Mode::kRecording;
}

void StepLayout::end_recording() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (mode_ != Mode::kRecording) throw std::logic_error("StepLayout::end_recording: not recording");
  mode_ = Mode::kIdle;
  // What is still live lives to the end of the step: the last tick, which follows every event.
  for (const auto& live : live_blocks_) blocks_[live.second].end = tick_;
  for (const auto& live : live_obstacles_) obstacles_[live.second].block.end = tick_;
  live_blocks_.clear();
  live_obstacles_.clear();

  std::vector<LayoutBlock> lifetimes;
  lifetimes.reserve(blocks_.size());
  for (const Block& b : blocks_) lifetimes.push_back({b.bytes, b.begin, b.end});
  const Layout layout = pack_blocks(lifetimes, obstacles_);
  for (size_t i = 0; i < blocks_.size(); ++i) blocks_[i].offset = layout.offsets[i];
  planned_peak_ = layout.peak_bytes;
  lower_bound_ = live_bytes_lower_bound(lifetimes);
  planned_ = true;
}

void StepLayout::begin_replay() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_idle("begin_replay");
  if (!planned_) throw std::logic_error("StepLayout::begin_replay: nothing recorded to replay");
  served_.assign(blocks_.size(), 0);
  next_ = 0;
  hits_ = 0;
  misses_ = 0;
  matched_ = false;
  mode_ = Mode::kReplaying;
}

void StepLayout::end_replay() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (mode_ != Mode::kReplaying) throw std::logic_error("StepLayout::end_replay: not replaying");
  mode_ = Mode::kIdle;
  // Every hit served a distinct block, so hits equal to the count means each was served once.
  matched_ = misses_ == 0 && hits_ == static_cast<int64_t>(blocks_.size());
}

bool StepLayout::has_plan() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return planned_;
}

int64_t StepLayout::planned_peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return planned_peak_;
}

int64_t StepLayout::lower_bound_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lower_bound_;
}

bool StepLayout::plan_fits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return planned_ && planned_peak_ <= capacity_;
}

std::vector<StepLayout::Block> StepLayout::blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blocks_;
}

std::vector<PlacedBlock> StepLayout::obstacles() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return obstacles_;
}

int64_t StepLayout::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

int64_t StepLayout::misses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return misses_;
}

bool StepLayout::replay_matched() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return matched_;
}

std::optional<int64_t> StepLayout::offset_for(int64_t rounded_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (mode_ != Mode::kReplaying) return std::nullopt;
  // The window counts blocks not yet served: ones served out of order behind the expected one
  // do not shrink it.
  size_t candidates = 0;
  for (size_t j = next_; j < blocks_.size() && candidates < kLookahead; ++j) {
    if (served_[j] != 0) continue;
    ++candidates;
    if (blocks_[j].bytes != rounded_bytes) continue;
    served_[j] = 1;
    // A block passed over while kLookahead later ones were served is not coming (the step
    // diverged there): give it up, so the window moves on with the step.
    while (next_ < blocks_.size() && (served_[next_] != 0 || next_ + kLookahead < j)) ++next_;
    return blocks_[j].offset;
  }
  return std::nullopt;
}

void StepLayout::on_allocated(int64_t offset, int64_t rounded_bytes, bool as_advised) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (mode_ == Mode::kReplaying) {
    ++(as_advised ? hits_ : misses_);
    return;
  }
  if (mode_ != Mode::kRecording) return;
  const auto obstacle = live_obstacles_.find(offset);
  if (obstacle != live_obstacles_.end()) {
    // Listed by the arena before its allocation was reported: it belongs to the step, so it
    // stops being an obstacle from the first tick (an empty lifetime conflicts with nothing).
    obstacles_[obstacle->second].block.end = 0;
    live_obstacles_.erase(obstacle);
  }
  live_blocks_[offset] = blocks_.size();
  blocks_.push_back({rounded_bytes, tick_, tick_, offset, offset});
  ++tick_;
}

void StepLayout::on_freed(int64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (mode_ != Mode::kRecording) return;
  if (const auto block = live_blocks_.find(offset); block != live_blocks_.end()) {
    blocks_[block->second].end = tick_++;
    live_blocks_.erase(block);
  } else if (const auto obstacle = live_obstacles_.find(offset); obstacle != live_obstacles_.end()) {
    obstacles_[obstacle->second].block.end = tick_++;
    live_obstacles_.erase(obstacle);
  }
}

bool StepLayout::holds_low_end() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mode_ == Mode::kReplaying;
}

void StepLayout::check_idle(const char* what) const {
  if (mode_ == Mode::kRecording) throw std::logic_error(std::string("StepLayout::") + what + ": still recording");
  if (mode_ == Mode::kReplaying) throw std::logic_error(std::string("StepLayout::") + what + ": still replaying");
}

}  // namespace ht
