#include "parallel/tensor_group.h"

#include <vector>

namespace ht {

void TensorGroup::count(const at::Tensor& t, const char* what) {
  stats_.elements[what] += t.numel();
  stats_.bytes += static_cast<int64_t>(t.nbytes());
  if (std::string(what) == "recomputation") stats_.recomputed_bytes += static_cast<int64_t>(t.nbytes());
  ++stats_.calls;
}

void TensorGroup::allreduce_sum(at::Tensor& t, const char* what) {
  group_->allreduce_sum(t, what);
  count(t, what);
}

void TensorGroup::all_gather(const at::Tensor& shard, at::Tensor& full, const char* what) {
  group_->all_gather(shard, full, std::vector<int64_t>(static_cast<size_t>(size()), shard.numel()), what);
  count(full, what);
}

void TensorGroup::reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard, const char* what) {
  group_->reduce_scatter_sum(full, shard, std::vector<int64_t>(static_cast<size_t>(size()), shard.numel()), what);
  count(full, what);
}

namespace {

class TransferPass final : public RingPass {
 public:
  explicit TransferPass(std::unique_ptr<Transfer> transfer) : transfer_(std::move(transfer)) {}
  void wait() override {
    if (transfer_ == nullptr) return;
    transfer_->wait();
    transfer_.reset();
  }

 private:
  std::unique_ptr<Transfer> transfer_;
};

// The ring's messages match in the order they are posted: one tag for every pass (the group's
// communicator carries nothing else point to point).
constexpr int kRingTag = 68;

}  // namespace

std::unique_ptr<RingPass> TensorGroup::pass_along_ring(const at::Tensor& out, at::Tensor& in, const char* what) {
  const int n = size(), next = (rank() + 1) % n, previous = (rank() + n - 1) % n;
  std::vector<PeerMessage> messages;
  messages.push_back({true, out, next, kRingTag, what});
  messages.push_back({false, in, previous, kRingTag, what});
  auto pass = std::make_unique<TransferPass>(group_->post_group(std::move(messages)));
  count(out, what);
  return pass;
}

}  // namespace ht
