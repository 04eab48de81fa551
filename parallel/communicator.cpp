#include "parallel/communicator.h"

#include <ATen/ATen.h>

#include <numeric>

namespace ht {

namespace {

// Every message of a group, waited in posting order.
class GroupTransfer final : public Transfer {
 public:
  explicit GroupTransfer(std::vector<std::unique_ptr<Transfer>> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& p : parts_) p->wait();
  }
  bool done() override {
    for (auto& p : parts_) {
      if (!p->done()) return false;
    }
    return true;
  }

 private:
  std::vector<std::unique_ptr<Transfer>> parts_;
};

}  // namespace

std::unique_ptr<Transfer> Communicator::post_group(std::vector<PeerMessage> messages) {
  std::vector<std::unique_ptr<Transfer>> parts;
  for (PeerMessage& m : messages) {
    parts.push_back(m.send ? isend(m.tensor, m.peer, m.tag, m.what) : irecv(m.tensor, m.peer, m.tag, m.what));
  }
  return std::make_unique<GroupTransfer>(std::move(parts));
}

int64_t check_shard_arguments(const Communicator& group, const at::Tensor& full, const at::Tensor& shard,
                              const std::vector<int64_t>& counts, const char* collective, const char* what) {
  auto fail = [&](const std::string& why) {
    throw CommunicationError("rank " + std::to_string(group.rank()) + ", " + group.context() + ": " + collective +
                             " of " + what + ": " + why);
  };
  if (counts.size() != static_cast<size_t>(group.size())) {
    fail(std::to_string(counts.size()) + " counts for a group of " + std::to_string(group.size()));
  }
  int64_t total = 0, offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] < 0) fail("a negative count for rank " + std::to_string(r));
    if (static_cast<int>(r) == group.rank()) offset = total;
    total += counts[r];
  }
  if (!full.is_contiguous() || !shard.is_contiguous()) fail("needs contiguous tensors");
  if (full.scalar_type() != shard.scalar_type() || full.device() != shard.device()) {
    fail("the whole and the shard differ in dtype or device");
  }
  if (full.numel() != total) {
    fail("the whole has " + std::to_string(full.numel()) + " elements, the counts sum to " + std::to_string(total));
  }
  if (shard.numel() != counts[static_cast<size_t>(group.rank())]) {
    fail("this rank's shard has " + std::to_string(shard.numel()) + " elements, its count is " +
         std::to_string(counts[static_cast<size_t>(group.rank())]));
  }
  return offset;
}

void LocalCommunicator::reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard,
                                           const std::vector<int64_t>& counts, const char* what) {
  check_shard_arguments(*this, full, shard, counts, "the reduce-scatter", what);
  if (!shard.is_same(full)) shard.copy_(full.view_as(shard));
}

void LocalCommunicator::all_gather(const at::Tensor& shard, at::Tensor& full, const std::vector<int64_t>& counts,
                                   const char* what) {
  check_shard_arguments(*this, full, shard, counts, "the all-gather", what);
  if (shard.data_ptr() != full.data_ptr()) full.copy_(shard.view_as(full));
}

void MirrorCommunicator::reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard,
                                            const std::vector<int64_t>& counts, const char* what) {
  const int64_t offset = check_shard_arguments(*this, full, shard, counts, "the reduce-scatter", what);
  shard.copy_(full.narrow(0, offset, shard.numel()).view_as(shard));
}

void MirrorCommunicator::all_gather(const at::Tensor& shard, at::Tensor& full, const std::vector<int64_t>& counts,
                                    const char* what) {
  check_shard_arguments(*this, full, shard, counts, "the all-gather", what);
  int64_t offset = 0;
  for (int64_t n : counts) {
    TORCH_CHECK(n <= shard.numel(), "a mirrored all-gather needs equal counts");
    full.narrow(0, offset, n).copy_(shard.view(-1).narrow(0, 0, n));
    offset += n;
  }
}

std::unique_ptr<Transfer> MirrorCommunicator::post_group(std::vector<PeerMessage> messages) {
  std::vector<const PeerMessage*> sends;
  size_t next = 0;
  for (const PeerMessage& m : messages) {
    if (m.send) {
      sends.push_back(&m);
      continue;
    }
    TORCH_CHECK(next < sends.size(), "a mirrored group's receive (", m.what, ") has no send before it");
    const PeerMessage& s = *sends[next++];
    TORCH_CHECK(s.tensor.numel() == m.tensor.numel() && s.tensor.scalar_type() == m.tensor.scalar_type(),
                "a mirrored group's receive (", m.what, ") is not shaped as its send");
    at::Tensor into = m.tensor;
    into.copy_(s.tensor.view_as(into));
  }
  return std::make_unique<CompletedTransfer>();
}

}  // namespace ht
