#include "training/run_output.h"

#include "base/user_error.h"

#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <unistd.h>

#include <vector>

namespace ht {

void write_file_atomically(const std::string& path_text, const std::string& text) {
  const std::filesystem::path path(path_text);
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out.flush()) throw UserError(tmp.string() + ": write failed; is the disk full?");
  }
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  std::filesystem::rename(tmp, path);
}

void draw_progress_line(const char* text, bool tty, bool& line_open) {
  if (tty) {
    std::printf("\r\033[K%s", text);
    line_open = true;
  } else {
    std::printf("%s\n", text);
  }
  std::fflush(stdout);
}

std::string clock_text(double seconds) {
  const long s = static_cast<long>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

RunOutput::RunOutput(const std::string& dir, const std::string& resolved_config, bool append)
    : dir_(dir), append_(append) {
  for (std::filesystem::path p = std::filesystem::absolute(dir); !p.empty() && !std::filesystem::exists(p);
       p = p.parent_path()) {
    first_created_ = p.string();
    if (p == p.parent_path()) break;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UserError("job.output_dir = \"" + dir + "\": cannot create it (" + ec.message() + ")");
  write_file_atomically((std::filesystem::path(dir) / "config.resolved.toml").string(), resolved_config);
  metrics_.open(std::filesystem::path(dir) / "metrics.jsonl", append ? std::ios::app : std::ios::trunc);
  if (!metrics_) throw UserError(dir + "/metrics.jsonl: cannot open for writing");
}

void RunOutput::metrics(const JsonObject& record) {
  metrics_ << record.str() << '\n';
  metrics_.flush();  // a crashed run keeps every line written so far
}

void RunOutput::abandon() {
  namespace fs = std::filesystem;
  metrics_.close();
  std::error_code ec;
  std::vector<std::string> ours{"config.resolved.toml", "summary.json", "memory_trace.json", "memory_trace.json.tmp"};
  if (!append_) ours.push_back("metrics.jsonl");
  for (const std::string& name : ours) fs::remove(fs::path(dir_) / name, ec);
  if (first_created_.empty()) return;
  // fs::remove takes only empty folders: anything not ours stays.
  for (fs::path p = fs::absolute(dir_); fs::remove(p, ec) && p.string() != first_created_; p = p.parent_path()) {
  }
}

void RunOutput::summary(const JsonObject& summary) const {
  write_file_atomically((std::filesystem::path(dir_) / "summary.json").string(), summary.str() + "\n");
}

Progress::Progress(int64_t total_steps, int64_t log_interval)
    : total_(total_steps), interval_(log_interval), tty_(::isatty(::fileno(stdout)) != 0),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

void Progress::step(int64_t step, double loss, double lr, double samples_per_s) {
  if (silent_) return;
  const auto now = std::chrono::steady_clock::now();
  if (first_step_ < 0) {
    first_step_ = step - 1;
    start_ = now;
  }
  const bool last = step == total_;
  if (tty_ && !last && now - last_draw_ < std::chrono::milliseconds(250)) return;
  if (!tty_ && !last && step % interval_ != 0) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double per_step = elapsed / static_cast<double>(std::max<int64_t>(1, step - first_step_));
  char text[200];
  std::snprintf(text, sizeof(text), "step %lld/%lld  loss %.4f  lr %.3g  %.0f samples/s  elapsed %s  ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_), loss, lr, samples_per_s,
                clock_text(elapsed).c_str(), clock_text(per_step * static_cast<double>(total_ - step)).c_str());
  draw_progress_line(text, tty_, line_open_);
}

void Progress::line(const std::string& text) {
  if (silent_) return;
  if (line_open_) std::printf("\r\033[K");
  std::printf("%s\n", text.c_str());
  line_open_ = false;
  std::fflush(stdout);
}

void Progress::finish() {
  if (silent_) return;
  if (line_open_) std::printf("\n");
  line_open_ = false;
  std::fflush(stdout);
}

}  // namespace ht
