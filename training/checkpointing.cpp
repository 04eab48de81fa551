// The two ways a checkpoint is written (training/checkpointing.h).
#include "training/checkpointing.h"

#include "alloc/byte_size.h"
#include "training/checkpoint_files.h"
#include "base/clock.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ht {
namespace {

// The folder of step `step`'s checkpoint where it is on disk ("" where not: a replica that does
// not write may look before rank 0 has published it).
std::string folder_of_step(const CheckpointStore& store, int64_t step) {
  for (const std::string& folder : store.list()) {
    if (checkpoint_files::step_of_folder(folder) == step) return folder;
  }
  return "";
}

class SyncCheckpointing final : public Checkpointing {
 public:
  SyncCheckpointing(CheckpointStore store, ModelState& state, Progress& progress, Published published)
      : store_(std::move(store)), state_(state), progress_(progress), published_(std::move(published)) {}
  void save(const TrainerState& state) override {
    const auto start = std::chrono::steady_clock::now();
    state_.save(store_, state, progress_);
    CheckpointRecord r;
    r.step = r.published_after = state.step;
    r.blocked_s = seconds_since(start);
    r.folder = folder_of_step(store_, state.step);
    published_(r);
  }
  void poll(int64_t) override {}
  void drain(int64_t) override {}

 private:
  CheckpointStore store_;
  ModelState& state_;
  Progress& progress_;
  Published published_;
};

// A test's hold on one write (tests/launcher/test_async_checkpoint.cpp): with
// HT_TEST_HOLD_CHECKPOINT_WRITE=<step>:<file>, the write of step <step>'s checkpoint, its files
// written, creates <file> and never returns, so that a test may kill the job while it is in flight.
void held_for_a_test(int64_t step) {
  const char* hold = std::getenv("HT_TEST_HOLD_CHECKPOINT_WRITE");
  if (hold == nullptr) return;
  const std::string text = hold;
  const size_t colon = text.find(':');
  if (colon == std::string::npos || std::strtoll(text.c_str(), nullptr, 10) != step) return;
  std::ofstream(text.substr(colon + 1)) << step << '\n';
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

class AsyncCheckpointing final : public Checkpointing {
 public:
  AsyncCheckpointing(CheckpointStore store, ModelState& state, RankGroups& groups, Progress& progress,
                     Published published)
      : store_(std::move(store)), state_(state), groups_(groups), progress_(progress), published_(std::move(published)) {}
  ~AsyncCheckpointing() override {
    if (pending_ && pending_->result.valid()) pending_->result.wait();  // its thread ends before what it reads goes
  }

  void save(const TrainerState& state) override {
    CheckpointRecord r;
    r.async = true;
    r.step = state.step;
    if (pending_) {  // at most one in flight
      const bool written = pending_->result.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
      const auto start = std::chrono::steady_clock::now();
      const int64_t writing = pending_->record.step;
      finish(state.step);
      if (!written) {
        r.waited_s = seconds_since(start);
        char text[160];
        std::snprintf(text, sizeof text, "checkpoint of step %lld: waited %.2f s for the checkpoint of step %lld to be "
                      "written (one is written at a time)", static_cast<long long>(state.step), r.waited_s,
                      static_cast<long long>(writing));
        progress_.line(text);
      }
    }
    if (!progress_.silent()) {
      if (const std::string note = store_.replacing(state.step); !note.empty()) progress_.line("warning: " + note);
    }
    const auto start = std::chrono::steady_clock::now();
    auto pending = std::make_unique<Pending>();
    pending->taken = state_.take(store_, state);
    r.blocked_s = seconds_since(start);
    r.host_bytes = pending->taken.host_bytes;
    pending->record = r;
    std::function<RankFiles()> write = pending->taken.write;
    const int64_t step = state.step;
    pending->result = std::async(std::launch::async, [write, step] {
      // Below training's threads: where they take every core, the write waits for a free moment
      // rather than slowing the steps (Linux: a thread's own nice value).
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
      const auto start = std::chrono::steady_clock::now();
      RankFiles files = write();
      held_for_a_test(step);
      return std::make_pair(files, seconds_since(start));
    });
    pending_ = std::move(pending);
  }

  void poll(int64_t step) override {
    if (!pending_) return;
    const bool mine = pending_->result.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    if (groups_.every_rank(mine, "whether the checkpoint's files are written")) finish(step);
  }

  void drain(int64_t step) override {
    if (pending_) finish(step);
  }

 private:
  struct Pending {
    ModelState::Taken taken;
    CheckpointRecord record;
    std::future<std::pair<RankFiles, double>> result;
  };

  // Waits for this rank's write, then publishes (every rank at once).
  void finish(int64_t step) {
    std::unique_ptr<Pending> pending = std::move(pending_);
    const auto [files, write_s] = pending->result.get();
    CheckpointRecord r = pending->record;
    r.write_s = write_s;
    r.published_after = step;
    std::string late = "written after it";
    if (step == r.step + 1) late = "written while step " + std::to_string(step) + " trained";
    if (step > r.step + 1) late = "written while steps " + std::to_string(r.step + 1) + " to " + std::to_string(step) + " trained";
    const auto start = std::chrono::steady_clock::now();
    r.folder = state_.publish(store_, pending->taken, files, late);
    r.publish_s = seconds_since(start);
    char text[200];
    std::snprintf(text, sizeof text, " (copied in %.2f s, %s in host memory; written in %.1f s while training went on; "
                  "published after step %lld)", r.blocked_s, format_bytes(r.host_bytes).c_str(), r.write_s,
                  static_cast<long long>(step));
    progress_.line("checkpoint " + r.folder + text);
    published_(r);
  }

  CheckpointStore store_;
  ModelState& state_;
  RankGroups& groups_;
  Progress& progress_;
  Published published_;
  std::unique_ptr<Pending> pending_;
};

}  // namespace

std::unique_ptr<Checkpointing> make_checkpointing(bool async, CheckpointStore store, ModelState& state,
                                                  RankGroups& groups, Progress& progress,
                                                  Checkpointing::Published published) {
  if (async) return std::make_unique<AsyncCheckpointing>(std::move(store), state, groups, progress, std::move(published));
  return std::make_unique<SyncCheckpointing>(std::move(store), state, progress, std::move(published));
}

}  // namespace ht
