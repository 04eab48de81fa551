#pragma once
// Progress of long work measured in bytes (checking token files, tokenizing text): on a terminal
// one line redrawn at most four times a second ("label: 3.2/10.0 GB, 32%, 0:00:41, ETA 0:01:27"),
// otherwise (a log file, a cluster job) a line at every tenth of the total, like the training
// loop's progress (training/run_output.h).

#include <chrono>
#include <cstdint>
#include <string>

namespace ht {

class ByteProgress {
 public:
  // enabled = false prints nothing (tests, small inputs, ranks other than the root).
  ByteProgress(std::string label, int64_t total_bytes, bool enabled);
  ~ByteProgress() { finish(); }
  ByteProgress(const ByteProgress&) = delete;
  ByteProgress& operator=(const ByteProgress&) = delete;

  // `done` bytes of the total are done; `detail` follows the numbers (e.g. "1,234 tokens").
  void update(int64_t done, const std::string& detail = "");
  // Ends a redrawn line; later updates print nothing.
  void finish();

 private:
  std::string label_;
  int64_t total_;
  bool enabled_, tty_;
  bool line_open_ = false;
  int64_t next_tenth_ = 1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "12.3 MB", "4.1 GB": decimal units, as file sizes are usually given.
std::string decimal_bytes(int64_t bytes);
// 1234567 as "1,234,567".
std::string grouped(int64_t n);

}  // namespace ht
