// ParameterShards (parallel/parameter_shards.h) in a group of one, where a gather is a copy of the
// shard: what stays resident, when buckets are freed, what the memory manager may drop and what
// it may not (a bucket a kernel's open reads hold).
#include "parallel/collective_worker.h"
#include "parallel/parameter_shards.h"
#include "runtime/memory_hooks.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace ht {
namespace {

bool resident(const at::Tensor& t) { return t.storage().data() != nullptr; }

struct Shards {
  std::vector<at::Tensor> params{at::randn({4, 3}), at::randn({5}), at::randn({2, 2})};
  std::vector<at::Tensor> original;
  MemoryHooks memory;  // nothing to evict: allocations succeed or throw
  std::unique_ptr<ParameterShards> shards;
  Shards() {
    for (const at::Tensor& p : params) original.push_back(p.clone());
    // Buckets in reduction order: the last parameter alone, then the first two together.
    shards = std::make_unique<ParameterShards>(std::make_shared<LocalCommunicator>(), params,
                                               std::vector<std::vector<size_t>>{{2}, {1, 0}}, at::Device(at::kCPU));
    shards->set_block_uses({{params[0], params[1]}, {params[2]}});
  }
};

TEST(ParameterShards, ShardsHoldTheValuesAndAGatherRestoresABucket) {
  Shards s;
  for (const at::Tensor& p : s.params) EXPECT_FALSE(resident(p)) << "freed once sharded";
  ASSERT_EQ(s.shards->shards().size(), 2u);
  EXPECT_EQ(s.shards->shard_bytes(), 4 * (4 + 5 + 12)) << "one rank: its share is everything";
  s.shards->before_read(s.params[1], s.memory, 1);
  EXPECT_TRUE(resident(s.params[0]) && resident(s.params[1])) << "the whole bucket";
  EXPECT_FALSE(resident(s.params[2]));
  EXPECT_TRUE(at::equal(s.params[0], s.original[0]) && at::equal(s.params[1], s.original[1]));
  const ParameterGatherStats stats = s.shards->take_stats();
  EXPECT_EQ(stats.gathers, 1);
  EXPECT_EQ(stats.bytes, 0) << "nothing came from another rank";
}

TEST(ParameterShards, ForwardFreesWhatTheNextBlockDoesNotReadUnlessManaged) {
  Shards s;
  s.shards->block_begins(0);
  s.shards->before_read(s.params[0], s.memory, 1);
  s.shards->block_begins(1);  // block 1 reads the other bucket only
  EXPECT_FALSE(resident(s.params[0]));
  s.shards->set_managed(true);
  s.shards->before_read(s.params[0], s.memory, 2);
  s.shards->block_begins(1);
  EXPECT_TRUE(resident(s.params[0])) << "managed: the memory manager decides";
  s.shards->bucket_done(1);
  EXPECT_FALSE(resident(s.params[0])) << "backward is done with it";
}

TEST(ParameterShards, OpenReadsHoldABucketAgainstDropping) {
  Shards s;
  s.shards->begin_reads();
  s.shards->before_read(s.params[2], s.memory, 7);
  EXPECT_TRUE(s.shards->droppable().empty()) << "a kernel reads it";
  s.shards->end_reads();
  const std::vector<DroppableParameters> droppable = s.shards->droppable();
  ASSERT_EQ(droppable.size(), 1u);
  EXPECT_EQ(droppable[0].id, 0u);
  EXPECT_EQ(droppable[0].bytes, 16);
  EXPECT_EQ(droppable[0].last_access, 7u);
  EXPECT_DOUBLE_EQ(droppable[0].cost_ms, modeled_gather_ms(16));
  s.shards->drop(droppable[0].id);
  EXPECT_FALSE(resident(s.params[2]));
  EXPECT_EQ(s.shards->take_stats().drops, 1);
  s.shards->before_read(s.params[2], s.memory, 8);
  EXPECT_TRUE(at::equal(s.params[2], s.original[2])) << "gathered again, the same values";
}

TEST(ParameterShards, ACheckpointGathersAllAndTakesItsShareBack) {
  Shards s;
  s.shards->gather_all(s.memory);
  for (const at::Tensor& p : s.params) EXPECT_TRUE(resident(p));
  {
    at::NoGradGuard no_grad;
    s.params[1].fill_(3.0f);  // as a loaded checkpoint writes into the parameters
  }
  s.shards->take_from_whole();
  s.shards->release_all();
  s.shards->before_read(s.params[1], s.memory, 1);
  EXPECT_TRUE(at::equal(s.params[1], at::full({5}, 3.0f)));
}

// Prefetching: gathers queued on a worker thread (a group of one's gather is a copy there).
TEST(ParameterShards, ForwardPrefetchesTheNextBlockAsABlockBegins) {
  Shards s;
  auto worker = std::make_shared<CollectiveWorker>(std::make_shared<LocalCommunicator>());
  s.shards->set_prefetch(worker, 1);
  ASSERT_TRUE(s.shards->prefetches());
  s.shards->block_begins(0);
  for (const at::Tensor& p : s.params) EXPECT_TRUE(resident(p)) << "block 0's bucket and block 1's, queued";
  s.shards->before_read(s.params[2], s.memory, 1);  // waits for its gather only
  EXPECT_TRUE(at::equal(s.params[2], s.original[2]));
  s.shards->before_read(s.params[0], s.memory, 2);
  EXPECT_TRUE(at::equal(s.params[0], s.original[0]) && at::equal(s.params[1], s.original[1]));
  s.shards->block_begins(1);
  EXPECT_FALSE(resident(s.params[0])) << "block 1 and none after it reads the first bucket";
  EXPECT_TRUE(resident(s.params[2]));
  s.shards->release_all();
  const ParameterGatherStats stats = s.shards->take_stats();
  EXPECT_EQ(stats.gathers, 2);
  EXPECT_GE(stats.hidden(), 0.0) << "a share of the gathers' time, whatever the machine's load";
  EXPECT_LE(stats.hidden(), 1.0);
}

// Backward is told the weights its entries saved (the tape's saved_weights): as it enters block
// 1's entries, block 0's saved ones are gathered ahead; a block whose weights backward does not read
// (under autocast: their cast copies serve it) gets no gather.
TEST(ParameterShards, BackwardPrefetchesWhatTheTapeSavedOfTheBlockBefore) {
  Shards s;
  s.shards->set_prefetch(std::make_shared<CollectiveWorker>(std::make_shared<LocalCommunicator>()), 1);
  s.shards->backward_will_read({s.params[2], s.params[0]});
  s.shards->backward_enters(1);
  s.shards->before_read(s.params[2], s.memory, 1);
  EXPECT_TRUE(resident(s.params[0]) && resident(s.params[1])) << "block 0's bucket, queued ahead";
  s.shards->before_read(s.params[1], s.memory, 2);
  EXPECT_TRUE(at::equal(s.params[1], s.original[1]));
  s.shards->release_all();
  s.shards->backward_will_read({s.params[2]});
  s.shards->backward_enters(1);
  s.shards->before_read(s.params[2], s.memory, 3);
  EXPECT_FALSE(resident(s.params[0])) << "backward saved none of block 0's weights";
  s.shards->release_all();
}

// Forward ends with the last block's buckets gathered; a backward that will not read them frees
// them at once (GPT-2's 154 MB tied embedding under bf16), unless the memory manager decides.
TEST(ParameterShards, ABackwardFreesWhatForwardLeftGatheredAndItWillNotRead) {
  Shards s;
  s.shards->block_begins(1);
  s.shards->before_read(s.params[2], s.memory, 1);
  s.shards->block_begins(-1);
  EXPECT_TRUE(resident(s.params[2])) << "what backward reads first stays";
  s.shards->backward_will_read({s.params[0]});
  EXPECT_FALSE(resident(s.params[2]));
  s.shards->release_all();
  s.shards->set_managed(true);
  s.shards->before_read(s.params[2], s.memory, 2);
  s.shards->backward_will_read({});
  EXPECT_TRUE(resident(s.params[2])) << "managed: the memory manager decides";
  s.shards->release_all();
}

// 16-bit copies (keep_copies): each bucket's shard rounded once per step and gathered in 16 bits;
// the copies are views of the bucket's 16-bit storage, freed and gathered as the fp32 bucket was.
TEST(ParameterShards, CopiesAreTheShardsRoundedAndGatheredWithoutTheFp32Bucket) {
  Shards s;
  s.shards->keep_copies(at::kBFloat16);
  EXPECT_FALSE(s.shards->copy_of(s.params[0], at::kHalf).defined()) << "another type: cast at the read";
  const at::Tensor copy = s.shards->copy_of(s.params[0], at::kBFloat16);
  ASSERT_TRUE(copy.defined());
  EXPECT_TRUE(copy.is_same(s.shards->copy_of(s.params[0], at::kBFloat16))) << "one view per weight";
  EXPECT_EQ(copy.sizes(), s.params[0].sizes());
  EXPECT_FALSE(resident(copy));
  s.shards->before_read(copy, s.memory, 1);
  EXPECT_TRUE(resident(copy));
  EXPECT_TRUE(at::equal(copy, s.original[0].to(at::kBFloat16))) << "one rank's copy of the whole weight, bit for bit";
  EXPECT_TRUE(at::equal(s.shards->copy_of(s.params[1], at::kBFloat16), s.original[1].to(at::kBFloat16)));
  EXPECT_FALSE(resident(s.params[0]) || resident(s.params[1])) << "the fp32 bucket is not gathered";
  EXPECT_EQ(s.shards->bytes(), 2 * (4 + 5 + 12)) << "the 16-bit shards";
  ParameterGatherStats stats = s.shards->take_stats();
  EXPECT_EQ(stats.gathers, 1);
  const std::vector<DroppableParameters> droppable = s.shards->droppable();
  ASSERT_EQ(droppable.size(), 1u);
  EXPECT_EQ(droppable[0].bytes, 2 * (5 + 12)) << "half the fp32 bucket's bytes";
  s.shards->bucket_done(1);
  EXPECT_FALSE(resident(copy)) << "backward is done with the bucket";
  // The optimizer steps the shard; the next gather after weights_changed() sends it rounded again.
  {
    at::NoGradGuard no_grad;
    s.shards->shards()[1].fill_(1.0f + 1.0f / 512);  // rounds to 1 in bf16 (nearest even)
  }
  s.shards->before_read(copy, s.memory, 2);
  EXPECT_TRUE(at::equal(copy, s.original[0].to(at::kBFloat16))) << "not made again before the weights changed";
  s.shards->bucket_done(1);
  s.shards->weights_changed();
  s.shards->before_read(copy, s.memory, 3);
  EXPECT_TRUE(at::equal(copy, at::ones({4, 3}, at::kBFloat16)));
  s.shards->weights_changed();
  EXPECT_EQ(s.shards->made_last_step(), 1) << "one bucket's shard made once";
}

// Under copies a weight read in fp32 (a norm's gain) is gathered alone, never rounded, from a
// storage of its own; its at::Tensor stays the one the model and the optimizer know.
TEST(ParameterShards, AWeightReadInFp32UnderCopiesIsGatheredAlone) {
  Shards s;
  s.shards->keep_copies(at::kBFloat16);
  const at::Tensor gain = s.params[1];
  s.shards->before_read(gain, s.memory, 1);
  EXPECT_TRUE(gain.is_same(s.params[1]));
  EXPECT_TRUE(resident(gain));
  EXPECT_TRUE(at::equal(gain, s.original[1])) << "fp32, as gathered from the shards";
  EXPECT_FALSE(resident(s.params[0])) << "the rest of its bucket stays sharded";
  ASSERT_EQ(s.shards->droppable().size(), 1u);
  EXPECT_EQ(s.shards->droppable()[0].bytes, 4 * 5);
  s.shards->block_begins(1);  // block 1 reads the other bucket only
  EXPECT_FALSE(resident(gain)) << "freed with its bucket";
  // A checkpoint read writes into it where it lives now, and the shard takes it back.
  s.shards->gather_all(s.memory);
  {
    at::NoGradGuard no_grad;
    gain.fill_(3.0f);
  }
  s.shards->take_from_whole();
  s.shards->release_all();
  s.shards->before_read(gain, s.memory, 2);
  EXPECT_TRUE(at::equal(gain, at::full({5}, 3.0f)));
  const at::Tensor copy = s.shards->copy_of(gain, at::kBFloat16);
  s.shards->before_read(copy, s.memory, 3);
  EXPECT_TRUE(at::equal(copy, at::full({5}, 3.0f, at::kBFloat16))) << "the loaded weights' copies are made again";
  s.shards->release_all();
}

TEST(CollectiveWorker, RunsJobsInTheirOrderAndWaitsForATicket) {
  CollectiveWorker worker(std::make_shared<LocalCommunicator>());
  std::vector<int> order;
  const uint64_t first = worker.submit([&](Communicator&) { order.push_back(1); });
  const uint64_t second = worker.submit([&](Communicator&) { order.push_back(2); });
  EXPECT_LT(first, second);
  worker.wait_for(second);
  EXPECT_EQ(order, (std::vector<int>{1, 2})) << "a ticket's wait covers the jobs before it";
  worker.submit([](Communicator&) { throw CommunicationError("rank 1 died in the all-gather of the parameters"); });
  const uint64_t after = worker.submit([&](Communicator&) { order.push_back(3); });
  EXPECT_THROW(worker.wait_for(after), CommunicationError);
  worker.run([&](Communicator&) { order.push_back(4); });
  EXPECT_EQ(order, (std::vector<int>{1, 2, 4})) << "what was queued after an error does not run";
}

}  // namespace
}  // namespace ht
