#pragma once
// What a rank whose collective never completed says beside the ranks that did not answer: set by
// the trainer (the last complete checkpoint, and whether one can be written now), read by a
// communicator's watchdog thread when it ends the job (parallel/mpi_communicator.cpp).

#include <mutex>
#include <string>

namespace ht {

inline std::mutex& stall_note_mutex() {
  static std::mutex m;
  return m;
}
inline std::string& stall_note_text() {
  static std::string text;
  return text;
}
inline void set_stall_note(std::string note) {
  const std::lock_guard<std::mutex> lock(stall_note_mutex());
  stall_note_text() = std::move(note);
}
inline std::string stall_note() {
  const std::lock_guard<std::mutex> lock(stall_note_mutex());
  return stall_note_text();
}

}  // namespace ht
