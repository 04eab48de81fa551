#include "training/state_offload.h"

#include "training/optimizer.h"
#include "alloc/cpu_device_allocator.h"
#include "alloc/host_link.h"

#include <ATen/ATen.h>

#include <unordered_map>

namespace ht {

template <typename Allocate>
std::vector<at::Tensor> StateOffload::move(const std::vector<at::Tensor>& tensors, bool to_host, Allocate&& allocate) {
  const CopyDirection direction = to_host ? CopyDirection::kToHost : CopyDirection::kToDevice;
  std::unordered_map<const void*, at::Tensor> moved;  // old storage -> its bytes in the new place
  std::vector<std::shared_ptr<CopyJob>> jobs;
  for (const at::Tensor& t : tensors) {
    const void* key = t.storage().unsafeGetStorageImpl();
    if (moved.count(key) != 0) continue;
    at::Tensor bytes = allocate(static_cast<int64_t>(t.storage().nbytes()));
    jobs.push_back(link_->copy(direction, t, bytes));
    (to_host ? stats_.bytes_out : stats_.bytes_in) += jobs.back()->bytes;
    moved.emplace(key, std::move(bytes));
  }
  // To host: done, since the host reads the state there (a checkpoint); to the device: ordered
  // before the optimizer's kernels.
  for (const std::shared_ptr<CopyJob>& job : jobs) stats_.wait_ms += to_host ? job->finish() : job->wait();
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    const at::Tensor& bytes = moved.at(t.storage().unsafeGetStorageImpl());
    at::Tensor view = at::empty({0}, t.options().device(bytes.device()));
    view.set_(bytes.storage(), t.storage_offset(), t.sizes(), t.strides());
    out.push_back(view);
  }
  return out;
}

void StateOffload::to_host(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params) {
  if (on_host_) return;
  on_host_ = move_optimizer_state(optimizer, params, [&](const std::vector<at::Tensor>& state) {
    return move(state, /*to_host=*/true, [&](int64_t bytes) {
      HostAllocationScope host;  // outside the arena
      return link_->host_empty(bytes, at::kByte);
    });
  });
}

void StateOffload::to_device(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params,
                             const at::Device& device) {
  if (!on_host_) return;
  move_optimizer_state(optimizer, params, [&](const std::vector<at::Tensor>& state) {
    return move(state, /*to_host=*/false, [&](int64_t bytes) {
      return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    });
  });
  on_host_ = false;
}

}  // namespace ht
