#pragma once
// Writes a timeline of memory events (alloc, free, evict, recompute, kernels) and a bytes-in-use
// counter as Chrome trace-event JSON, which chrome://tracing and Perfetto open directly.
// Events stream to disk as they come, since a training run's trace outgrows memory; the file
// takes its final name only in close(), so a crashed run never leaves a truncated trace there.

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>

namespace ht {

class MemoryTrace {
 public:
  using Args = std::initializer_list<std::pair<const char*, double>>;

  // Writes to `path` + ".tmp" and renames it to `path` in close(). Throws std::runtime_error
  // naming the path if the file cannot be opened.
  explicit MemoryTrace(std::string path);
  ~MemoryTrace();  // closes if not closed (never throws)
  MemoryTrace(const MemoryTrace&) = delete;
  MemoryTrace& operator=(const MemoryTrace&) = delete;

  // Times are in microseconds, the unit of the format. Non-finite numbers are written as 0,
  // since JSON has no NaN or infinity. Recording after close() throws std::logic_error.

  // ph "X": a span [ts_us, ts_us + dur_us) with a name, a category and numeric args, on track
  // `tid` (1: compute; spans that overlap compute, such as copies, get tracks of their own).
  void span(const std::string& name, const char* category, double ts_us, double dur_us,
            Args args = {}, int tid = 1);
  // ph "i" (scope "t"): an instant event.
  void instant(const std::string& name, const char* category, double ts_us, Args args = {});
  // ph "C": a counter sample; each arg is one series of the counter track named `name`.
  void counter(const char* name, double ts_us, Args series);

  // Ends the JSON and renames the file. Throws std::runtime_error naming the path if writing
  // or renaming fails. Later calls do nothing.
  void close();
  int64_t events() const;
  const std::string& path() const;

 private:
  // Appends one complete event object; thread-safe, as memory events come from ATen's workers.
  void write_event(const std::string& event);

  std::string path_;
  std::string tmp_path_;
  std::FILE* file_ = nullptr;
  int64_t events_ = 0;
  mutable std::mutex mutex_;
};

}  // namespace ht
