#pragma once
// Device memory for meta tensors (shapes and dtypes without values). While a MetaArenaScope lives,
// every meta tensor's storage is a block of its arena: placed at the end a device tensor's would
// take (PlacementScope), observed (AllocationObserver), and given room (OutOfMemoryHandler) by the
// same code as a CPU rank's budget (allocate_in_arena). The arena's pages are reserved and never
// touched, so the capacity costs nothing. A step run on meta tensors inside it is, in bytes and
// blocks, the step the engine would run on data: how a step of a model of any size is traced
// without building it (launcher/planning/meta_trace.h). Outside a scope meta tensors have no
// storage, as in libtorch.

#include "alloc/cpu_arena.h"

#include <memory>

namespace ht {

class MetaArenaScope {
 public:
  // One at a time per process. Throws std::logic_error if another is alive.
  explicit MetaArenaScope(std::shared_ptr<CpuArena> arena);
  ~MetaArenaScope();
  MetaArenaScope(const MetaArenaScope&) = delete;
  MetaArenaScope& operator=(const MetaArenaScope&) = delete;

  CpuArena& arena() const { return *arena_; }

 private:
  std::shared_ptr<CpuArena> arena_;
};

// The live scope's arena, or null.
CpuArena* active_meta_arena();

// An arena for meta tensors over `capacity` bytes of address space reserved without access
// (PROT_NONE): no page is ever committed, so even a 32 TiB range counts against no memory limit
// (strict overcommit included). Throws std::runtime_error if the address space is not there
// (a ulimit -v).
std::shared_ptr<CpuArena> make_meta_arena(int64_t capacity);

}  // namespace ht
