#include "alloc/memory_trace.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace ht {
namespace {

void append_escaped(std::string& out, const char* text) {
  out += '"';
  for (const char* c = text == nullptr ? "" : text; *c != '\0'; ++c) {
    const unsigned char ch = static_cast<unsigned char>(*c);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (ch < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  out += '"';
}

void append_number(std::string& out, double value) {
  if (!std::isfinite(value)) value = 0.0;
  // 15 significant digits: byte counts below 10^15 and microsecond times stay exact.
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", value);
  out += buf;
}

// The fields every event shares, up to and including "ts".
std::string event_head(const char* name, const char* category, const char* ph, double ts_us) {
  std::string event = "{\"name\":";
  append_escaped(event, name);
  if (category != nullptr) {
    event += ",\"cat\":";
    append_escaped(event, category);
  }
  event += ",\"ph\":\"";
  event += ph;
  event += "\",\"ts\":";
  append_number(event, ts_us);
  return event;
}

void append_tail(std::string& event, MemoryTrace::Args args, int tid = 1) {
  event += ",\"pid\":1,\"tid\":" + std::to_string(tid);
  if (args.size() != 0) {
    event += ",\"args\":{";
    bool first = true;
    for (const auto& [key, value] : args) {
      if (!first) event += ',';
      first = false;
      append_escaped(event, key);
      event += ':';
      append_number(event, value);
    }
    event += '}';
  }
  event += '}';
}

}  // namespace

MemoryTrace::MemoryTrace(std::string path) : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  file_ = std::fopen(tmp_path_.c_str(), "w");
  if (file_ == nullptr) {
    throw std::runtime_error("MemoryTrace: cannot open " + tmp_path_ + " for " + path_ + ": " +
                             std::strerror(errno));
  }
  std::fputs("{\"traceEvents\":[", file_);
}

MemoryTrace::~MemoryTrace() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: %s\n", e.what());
  }
}

void MemoryTrace::span(const std::string& name, const char* category, double ts_us,
                       double dur_us, Args args, int tid) {
  std::string event = event_head(name.c_str(), category, "X", ts_us);
  event += ",\"dur\":";
  append_number(event, dur_us);
  append_tail(event, args, tid);
  write_event(event);
}

void MemoryTrace::instant(const std::string& name, const char* category, double ts_us,
                          Args args) {
  std::string event = event_head(name.c_str(), category, "i", ts_us);
  event += ",\"s\":\"t\"";
  append_tail(event, args);
  write_event(event);
}

void MemoryTrace::counter(const char* name, double ts_us, Args series) {
  std::string event = event_head(name, nullptr, "C", ts_us);
  append_tail(event, series);
  write_event(event);
}

void MemoryTrace::write_event(const std::string& event) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ == nullptr) throw std::logic_error("MemoryTrace: event after close() of " + path_);
  // One event per line keeps a long trace readable with ordinary text tools.
  std::fputs(events_ == 0 ? "\n" : ",\n", file_);
  std::fwrite(event.data(), 1, event.size(), file_);
  ++events_;
}

void MemoryTrace::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ == nullptr) return;
  std::FILE* file = file_;
  file_ = nullptr;  // a failure below must not make a second close() write again
  std::fputs("\n],\"displayTimeUnit\":\"ms\"}\n", file);
  const bool write_failed = std::ferror(file) != 0;
  const bool close_failed = std::fclose(file) != 0;
  if (write_failed || close_failed) {
    throw std::runtime_error("MemoryTrace: writing " + tmp_path_ + " failed; " + path_ +
                             " was not written");
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    throw std::runtime_error("MemoryTrace: cannot rename " + tmp_path_ + " to " + path_ + ": " +
                             std::strerror(errno));
  }
}

int64_t MemoryTrace::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

const std::string& MemoryTrace::path() const { return path_; }

}  // namespace ht
