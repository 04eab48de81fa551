#pragma once
// Everything a run writes: the output folder with config.resolved.toml, metrics.jsonl (one JSON
// object per logged step or evaluation) and summary.json; and what it shows: a progress line on a
// terminal, a log line every log interval otherwise.

#include "base/json.h"

#include <chrono>
#include <fstream>
#include <string>

namespace ht {

// Writes `text` to `path` through a temporary name, fsync and rename: never half written.
void write_file_atomically(const std::string& path, const std::string& text);

class RunOutput {
 public:
  // Creates the folder and writes config.resolved.toml. `append` keeps an existing metrics.jsonl
  // (resuming); otherwise it starts empty.
  RunOutput(const std::string& dir, const std::string& resolved_config, bool append);

  void metrics(const JsonObject& record);
  // Written atomically (temporary name, fsync, rename).
  void summary(const JsonObject& summary) const;
  const std::string& dir() const { return dir_; }
  // The run stopped before its first step completed (an impossible budget): remove what this
  // run wrote (and the folders it created, if left empty), so nothing half written remains.
  void abandon();

 private:
  std::string dir_;
  std::string first_created_;  // the outermost folder this run created, or empty
  bool append_;
  std::ofstream metrics_;
};

// Seconds as h:mm:ss, as progress lines print elapsed time and ETA.
std::string clock_text(double seconds);
// Prints a progress line: redrawn in place on a terminal (line_open then says a newline is owed),
// one line each otherwise (logs).
void draw_progress_line(const char* text, bool tty, bool& line_open);

class Progress {
 public:
  Progress(int64_t total_steps, int64_t log_interval);
  // A silent one prints nothing (ranks other than the root of a data-parallel job).
  void set_silent(bool silent) { silent_ = silent; }
  bool silent() const { return silent_; }
  // Log lines, never a refreshed line: under mpirun a rank's stdout is a terminal even when
  // mpirun's own output goes to a file.
  void use_log_lines() { tty_ = false; }
  // After optimizer step `step` (1-based): a refreshed line on a terminal, else every log_interval.
  void step(int64_t step, double loss, double lr, double samples_per_s);
  // A whole line (an evaluation, a checkpoint, a warning), printed above the progress line.
  void line(const std::string& text);
  void finish();

 private:
  int64_t total_, interval_;
  bool tty_;
  bool line_open_ = false;
  bool silent_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  int64_t first_step_ = -1;
};

}  // namespace ht
