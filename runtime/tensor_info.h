#pragma once
// The interpreter's record of one tensor (TensorInfo) and of the op call that produced it
// (ComputePath): a flat record in the manner of MegEngine's interpreter. These two structs are
// what the memory manager reads to decide what to evict, swap or recompute.

#include "runtime/kernel_cost.h"

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ht {

class CopyJob;
class Interpreter;
class Op;
struct ComputePath;
class DeviceKernelTime;

// Where a tensor's data is on the device. A dropped tensor may also have a copy in host memory
// (TensorInfo::host, host swap): then it comes back by a copy instead of a recomputation.
enum class Residency : uint8_t {
  kResident,  // `value` holds the data
  kEvicted,   // data dropped (evicted, or no longer referenced); regenerable from `producer`
};

// A root tensor's bytes in host memory (memory.policy = "swap" or "hybrid"; memory/host_swap.h).
// Values are immutable, so a copy, once made, stays valid while the record lives.
struct HostCopy {
  at::Tensor host;                // the storage's bytes, outside the arena (bf16 elements under memory.compress = "bf16")
  int64_t device_bytes = 0;       // the storage's bytes on the device
  std::shared_ptr<CopyJob> out;   // device -> host: the copy is valid once it is done
  std::shared_ptr<CopyJob> in;    // host -> device in flight (a prefetch); null otherwise
  at::Tensor incoming;            // the device bytes `in` fills
  // The value's layout in its storage, to rebuild it from the bytes.
  c10::SmallVector<int64_t, 5> strides;
  int64_t storage_offset = 0;
  bool prefetched = false;  // `in` was started ahead of use (not by the read that needed it)
};

// Backward's gradient for a record, waiting for its producer's entry, moved to host memory when
// memory ran short and nothing else could go (host swap; MemoryManager::park_a_gradient). Its
// shape is the record's; it comes back, bit for bit, when the entry takes it.
struct ParkedGradient {
  HostCopy copy;  // `in` unused: the gradient is brought back by the read that needs it
  at::ScalarType dtype = at::ScalarType::Undefined;
};

struct TensorInfo {
  TensorInfo(Interpreter* owner, uint64_t id) : owner(owner), id(id) {}
  ~TensorInfo();
  TensorInfo(const TensorInfo&) = delete;
  TensorInfo& operator=(const TensorInfo&) = delete;

  Interpreter* const owner;
  const uint64_t id;

  // What it is: valid whether or not the data is resident.
  c10::SmallVector<int64_t, 5> sizes;
  at::ScalarType dtype = at::ScalarType::Undefined;
  at::Device device = at::kCPU;
  int64_t nbytes = 0;  // bytes of storage this tensor owns; 0 for a view

  // Data.
  Residency residency = Residency::kEvicted;
  at::Tensor value;                // defined iff resident
  TensorInfo* base = nullptr;      // a view: the root tensor whose storage it shares
  std::vector<TensorInfo*> views;  // a root: live records of its views
  int resident_views = 0;          // a root: views whose data keeps its storage alive

  // Lineage. A leaf (parameter, input) has no producer and is never dropped.
  std::shared_ptr<ComputePath> producer;
  int output_index = 0;
  std::vector<ComputePath*> users;  // op calls that read this tensor

  // Who wants the data.
  int handle_refs = 0;  // user handles and tape entries: the value will be read
  int pin_count = 0;    // a kernel about to run reads it: must stay resident
  bool is_leaf = false;
  bool requires_grad = false;
  bool is_weight = false;  // a leaf made by Interpreter::param(): zero-bubble schedules defer its gradient
  // A weight's 16-bit compute copy (alloc/weight_copies.h): the weight whose gradient this leaf's
  // is. Backward sums the copy's gradients over its readers, then adds the sum into the weight's.
  at::Tensor grad_to;

  // Bookkeeping for memory policies.
  uint64_t last_access = 0;  // interpreter tick of the last read or write
  uint32_t recompute_count = 0;

  // Reverse mode: the gradient accumulated so far during backward(), or, under host swap, parked
  // on host (then `grad` is undefined). Read it through MemoryManager::take_gradient.
  at::Tensor grad;
  std::unique_ptr<ParkedGradient> parked_grad;

  // Host swap: its copy in host memory, made or being made; null: none.
  std::unique_ptr<HostCopy> host;

  bool resident() const { return residency == Residency::kResident; }
  bool is_view() const { return base != nullptr; }
  // Time the producing kernel took, and its modelled cost (runtime/kernel_cost.h); 0 for leaves.
  double compute_ms() const;
  double modeled_ms() const;
  // May the memory manager drop this tensor's data now? (Not while its copy to host is running:
  // the copy reads it.)
  bool evictable() const;
  // A copy to host was started and has not finished.
  bool copying_to_host() const;
  // Its bytes are in host memory: a drop costs a copy back, not a recomputation.
  bool on_host() const;
  // Backward has a gradient for it (on the device or parked on host).
  bool has_gradient() const { return grad.defined() || parked_grad != nullptr; }
};

// One op call: the op (with its arguments), its inputs and its outputs.
struct ComputePath {
  ComputePath(std::shared_ptr<const Op> op, std::vector<std::shared_ptr<TensorInfo>> inputs);
  ~ComputePath();
  ComputePath(const ComputePath&) = delete;
  ComputePath& operator=(const ComputePath&) = delete;

  std::shared_ptr<const Op> op;
  // Inputs stay alive (as records, not necessarily as data) while any output may need to be
  // regenerated: this is "fake deletion".
  std::vector<std::shared_ptr<TensorInfo>> inputs;
  std::vector<TensorInfo*> outputs;  // null once an output's record is gone
  // Measured when it first ran: the host's clock on the CPU; on a GPU its CUDA events
  // (runtime/kernel_timer.h), read when first asked. Read it through kernel_ms().
  mutable double compute_ms = 0;
  mutable std::shared_ptr<DeviceKernelTime> pending_ms;  // the events not read yet; null otherwise
  double modeled_ms = 0;  // runtime/kernel_cost.h: the same on every run
  KernelWork work;        // what modeled_ms prices: flops, bytes, the element type

  // compute_ms, reading the events first if they have not been read (waits for the kernel).
  double kernel_ms() const;
};

}  // namespace ht
