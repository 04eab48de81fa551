// A checkpoint as slices (training/slice_files.h): ranges of a tensor's memory order that
// different ranks wrote, read back across their files by any split; and a sliced checkpoint,
// written by a group of one, verified, damaged, and loaded whole into a model and its optimizer.
#include "training/checkpoint.h"
#include "training/optimizer.h"
#include "training/optimizer_shard.h"
#include "base/user_error.h"
#include "models/mlp.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <fstream>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

// A channels-last weight and a vector, cut at 3 ranks' uneven boundaries, read back at 2's.
TEST(SliceFiles, RangesWrittenByThreeRanksReadBackAtAnyOther) {
  TempDir dir;
  const at::Tensor weight = at::randn({4, 3, 2, 2}).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor bias = at::arange(10, at::kFloat);
  const at::Tensor flat = memory_order(weight);
  const std::vector<std::pair<int64_t, int64_t>> cuts{{0, 17}, {17, 16}, {33, 15}};  // 48 elements
  for (int rank = 0; rank < 3; ++rank) {
    SliceFileWriter out(dir.path(""), rank, "sgd");
    const auto [at, length] = cuts[static_cast<size_t>(rank)];
    out.add("param", "conv.weight", weight, at, flat.narrow(0, at, length));
    out.add("state0", "conv.weight", weight, at, flat.narrow(0, at, length) * 2);
    if (rank == 1) out.add("param", "conv.bias", bias, 0, bias);
    const std::array<uint64_t, 4> sums = out.finish();
    EXPECT_EQ(sums[0], static_cast<uint64_t>(4 * length * 2 + (rank == 1 ? 40 : 0)));
  }
  ASSERT_TRUE(SliceIndex::present(dir.path("")));
  const SliceIndex index(dir.path(""));
  EXPECT_EQ(index.ranks(), 3);
  EXPECT_EQ(index.optimizer(), "sgd");
  EXPECT_EQ(index.names("param"), (std::vector<std::string>{"conv.bias", "conv.weight"}));
  EXPECT_TRUE(at::equal(index.read("param", "conv.weight", 0, 24), flat.narrow(0, 0, 24))) << "across two files";
  EXPECT_TRUE(at::equal(index.read("state0", "conv.weight", 24, 24), flat.narrow(0, 24, 24) * 2));
  const at::Tensor whole = index.whole("param", "conv.weight");
  EXPECT_TRUE(whole.is_contiguous(at::MemoryFormat::ChannelsLast)) << "the recorded strides";
  EXPECT_TRUE(at::equal(whole, weight));
  EXPECT_TRUE(at::equal(index.whole("param", "conv.bias"), bias));
  EXPECT_THAT(user_error_of([&] { index.read("state1", "conv.weight", 0, 1); }), HasSubstr("has no state1 conv.weight"));
  // A rank's files gone: its range is missing, said as such.
  std::filesystem::remove(dir.path("rank_00002.index"));
  const SliceIndex two(dir.path(""));
  EXPECT_THAT(user_error_of([&] { two.whole("param", "conv.weight"); }),
              HasSubstr("no rank's slice holds elements 33 and after of param conv.weight"));
  std::ofstream(dir.path("rank_00001.index"), std::ios::app) << "slice param broken\n";
  EXPECT_THAT(user_error_of([&] { SliceIndex{dir.path("")}; }), HasSubstr("rank_00001.index, line 5: not a slice record"));
}

// Tensor-parallel parts: a [6, 8] weight's columns split 2 ways (each part's 24 elements written as
// two data-parallel pieces by two files), and a [12, 2] weight whose rank parts are three row
// ranges each (query, key, value heads), read back as 4-way parts, as a whole, and as ranges of
// the whole's memory order; a missing part is said as such, and a part out of bounds is damage.
TEST(SliceFiles, TensorParallelPartsReadBackAtAnyOtherSplit) {
  TempDir dir;
  const at::Tensor wo = at::arange(48, at::kFloat).view({6, 8});
  const at::Tensor wqkv = at::arange(24, at::kFloat).view({12, 2}) * -1;
  auto columns = [](int64_t start, int64_t length) { return SlicePart{1, {{start, length}}}; };
  auto heads = [](int64_t rank, int64_t t) {  // 4 query rows, then 4 key rows, then 4 value rows, t ways
    const int64_t n = 4 / t;
    return SlicePart{0, {{rank * n, n}, {4 + rank * n, n}, {8 + rank * n, n}}};
  };
  auto part_of = [](const at::Tensor& whole, const SlicePart& part) {
    std::vector<at::Tensor> pieces;
    for (const auto& [start, length] : part.ranges) pieces.push_back(whole.narrow(part.dim, start, length));
    return at::cat(pieces, part.dim).contiguous().view({-1});
  };
  int file = 0;
  for (int64_t rank = 0; rank < 2; ++rank) {
    const at::Tensor mine = part_of(wo, columns(rank * 4, 4));
    for (int64_t piece = 0; piece < 2; ++piece) {  // two replicas' pieces of the part
      SliceFileWriter out(dir.path(""), file++, "none");
      out.add_part("param", "wo", {6, 8}, columns(rank * 4, 4), piece * 12, mine.narrow(0, piece * 12, 12));
      if (piece == 0) out.add_part("param", "wqkv", {12, 2}, heads(rank, 2), 0, part_of(wqkv, heads(rank, 2)));
      out.finish();
    }
  }
  const SliceIndex index(dir.path(""));
  for (int64_t rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(at::equal(index.read_part("param", "wo", columns(rank * 2, 2), 0, 12), part_of(wo, columns(rank * 2, 2))));
    EXPECT_TRUE(at::equal(index.read_part("param", "wqkv", heads(rank, 4), 2, 4), part_of(wqkv, heads(rank, 4)).narrow(0, 2, 4)));
  }
  EXPECT_TRUE(at::equal(index.whole("param", "wo"), wo));
  EXPECT_TRUE(at::equal(index.whole("param", "wqkv"), wqkv));
  EXPECT_TRUE(at::equal(index.read("param", "wo", 5, 30), wo.reshape({-1}).narrow(0, 5, 30))) << "the whole's memory order";
  std::filesystem::remove(dir.path("rank_00003.index"));  // rank 1's second piece of its columns
  const SliceIndex three(dir.path(""));
  EXPECT_TRUE(at::equal(three.read_part("param", "wo", columns(0, 4), 0, 24), part_of(wo, columns(0, 4))));
  EXPECT_THAT(user_error_of([&] { three.read_part("param", "wo", columns(4, 2), 0, 12); }),
              HasSubstr("hold its elements up to 12 of 24"));
  std::ofstream(dir.path("rank_00000.index"), std::ios::app) << "slice param x 6 0 2 0 1 4 1 part 0 1 3 2\n";
  EXPECT_THAT(user_error_of([&] { SliceIndex{dir.path("")}; }), HasSubstr("not a slice record"));
}

struct SgdMlp {
  std::shared_ptr<Mlp> model = std::make_shared<Mlp>(MlpOptions{8, {4}, 3, 0.0});
  torch::optim::SGD sgd{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
  SgdMlp() {
    for (auto& p : model->parameters()) p.mutable_grad() = at::ones_like(p);
    sgd.step();
  }
};

// What a sharded run's ranks do, by a group of one: every parameter and its momentum as two
// slices each; verified, loaded whole, and damage found.
TEST(SliceFiles, ASlicedCheckpointLoadsWholeAndDamageIsFound) {
  TempDir dir;
  SgdMlp a;
  LocalCommunicator group;
  const TrainerState state{5, {1, 2}, 9};
  const std::string folder =
      CheckpointStore(dir.path("ckpt"), 2).save_sliced(group, state, "sgd", [&](SliceFileWriter& out) {
        for (const auto& p : a.model->named_parameters()) {
          const at::Tensor flat = memory_order(p.value()), momentum = memory_order(optimizer_state(a.sgd, p.value())[0]);
          const int64_t half = flat.numel() / 2;
          out.add("param", p.key(), p.value(), 0, flat.narrow(0, 0, half));
          out.add("param", p.key(), p.value(), half, flat.narrow(0, half, flat.numel() - half));
          out.add("state0", p.key(), p.value(), 0, momentum);
        }
      });
  EXPECT_EQ(CheckpointStore::verify(folder), "");
  EXPECT_FALSE(std::filesystem::exists(folder + "/model.pt"));
  SgdMlp b;
  for (auto& p : b.model->parameters()) p.detach().add_(1.0);
  EXPECT_EQ(CheckpointStore::load(folder, *b.model, b.sgd).step, 5);
  for (SgdMlp* f : {&a, &b}) {
    for (auto& p : f->model->parameters()) p.mutable_grad() = at::ones_like(p);
    f->sgd.step();  // the momentum came back too: the next step agrees
  }
  const auto pa = a.model->parameters(), pb = b.model->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].equal(pb[i])) << i;
  EXPECT_EQ(CheckpointStore::model_tensors(folder).size(), pa.size());
  // An AdamW run does not take SGD's state.
  torch::optim::AdamW adamw(b.model->parameters());
  EXPECT_THAT(user_error_of([&] { CheckpointStore::load(folder, *b.model, adamw); }),
              HasSubstr("its optimizer state is sgd's, the configured optimizer adamw"));
  std::filesystem::resize_file(folder + "/rank_00000.slices", 10);
  EXPECT_THAT(CheckpointStore::verify(folder), HasSubstr("rank_00000.slices has 10 bytes"));
}


// A rank whose disk refuses its part: the error names the rank and the previous checkpoint, and
// nothing of the new one is left.
TEST(SliceFiles, ARankThatCannotWriteLeavesNothingAndThePreviousCheckpoint) {
  TempDir dir;
  SgdMlp a;
  LocalCommunicator group;
  const CheckpointStore store(dir.path("ckpt"), 2);
  const std::string first = store.save_sliced(group, TrainerState{1, {0, 1}, 0}, "sgd", [](SliceFileWriter&) {});
  const std::string error = user_error_of([&] {
    store.save_sliced(group, TrainerState{2, {0, 2}, 0}, "sgd",
                      [](SliceFileWriter&) { throw std::runtime_error("the disk refused rank_00000.slices (full, or a quota)"); });
  });
  EXPECT_THAT(error, HasSubstr("rank 0 could not write its part of the checkpoint of step 2 (the disk refused"));
  EXPECT_THAT(error, HasSubstr("the previous checkpoint, " + first + ", is as it was"));
  EXPECT_EQ(store.list(), std::vector<std::string>{first});
  EXPECT_FALSE(std::filesystem::exists(dir.path("ckpt/.step_00000002.tmp")));
}


// On a GPU a rank's pieces are CUDA tensors: the writer copies each to the host as it goes, and
// the reader's ranges come back on the host for the caller to place.
TEST(SliceFiles, CudaPiecesAreWrittenThroughTheHost) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU here";
  TempDir dir;
  const at::Tensor weight = at::randn({6, 5}, at::TensorOptions().device(at::kCUDA, 0));
  {
    SliceFileWriter out(dir.path(""), 0, "adamw");
    out.add("param", "w", weight, 0, memory_order(weight).narrow(0, 0, 12));
    out.add("param", "w", weight, 12, memory_order(weight).narrow(0, 12, 18));
    out.finish();
  }
  EXPECT_TRUE(at::equal(SliceIndex(dir.path("")).whole("param", "w"), weight.cpu()));
}

}  // namespace
}  // namespace ht::test
