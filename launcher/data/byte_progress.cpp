#include "launcher/data/byte_progress.h"

#include "training/run_output.h"

#include <unistd.h>

#include <cstdio>

namespace ht {
std::string decimal_bytes(int64_t bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string grouped(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

ByteProgress::ByteProgress(std::string label, int64_t total_bytes, bool enabled)
    : label_(std::move(label)), total_(total_bytes), enabled_(enabled), tty_(::isatty(::fileno(stdout)) != 0),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

void ByteProgress::update(int64_t done, const std::string& detail) {
  if (!enabled_ || total_ <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = done >= total_;
  if (tty_ && !last && now - last_draw_ < std::chrono::milliseconds(250)) return;
  if (!tty_ && !last && done * 10 < next_tenth_ * total_) return;
  if (!tty_) next_tenth_ = done * 10 / total_ + 1;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double share = static_cast<double>(done) / static_cast<double>(total_);
  const double eta = share > 0 ? elapsed * (1 - share) / share : 0;
  char text[300];
  std::snprintf(text, sizeof(text), "%s: %s/%s, %.0f%%%s%s, %s, ETA %s", label_.c_str(), decimal_bytes(done).c_str(),
                decimal_bytes(total_).c_str(), 100 * share, detail.empty() ? "" : ", ", detail.c_str(),
                clock_text(elapsed).c_str(), clock_text(eta).c_str());
  draw_progress_line(text, tty_, line_open_);
}

void ByteProgress::finish() {
  if (line_open_) std::printf("\n");
  line_open_ = false;
  enabled_ = false;
  std::fflush(stdout);
}

}  // namespace ht
