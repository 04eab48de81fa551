#pragma once
// What happens when device memory (the arena of a budget) cannot serve an allocation: the
// allocator asks the OutOfMemoryHandler (the memory manager whose kernel runs) to make room and
// retries; when nothing more can be freed it throws OutOfBudget, which the interpreter lets
// through to the program, which explains it to the user.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ht {

class OutOfMemoryHandler {
 public:
  virtual ~OutOfMemoryHandler() = default;
  // Free memory until a block of `bytes` fits. Returns false if it cannot (nothing left to
  // evict, or called from a thread that may not touch the interpreter).
  virtual bool make_room(size_t bytes) = 0;
};

class OutOfBudget : public std::runtime_error {
 public:
  OutOfBudget(const std::string& message, int64_t requested, int64_t in_use, int64_t capacity,
              int64_t largest_free)
      : std::runtime_error(message), requested(requested), in_use(in_use), capacity(capacity),
        largest_free(largest_free) {}
  const int64_t requested;     // bytes asked for
  const int64_t in_use;        // arena bytes in use when it failed
  const int64_t capacity;      // the budget
  const int64_t largest_free;  // largest free block then
};

}  // namespace ht
