// Data: the sampler's order (deterministic per seed and epoch, resumable, sharded like the
// single-rank run) and the three datasets.
#include "alloc/cpu_device_allocator.h"
#include "launcher/config/config_loader.h"
#include "launcher/data/dataset.h"
#include "launcher/data/fashion_mnist.h"
#include "training/sampler.h"
#include "launcher/data/text_corpus.h"
#include "tests/support/temp_dir.h"

#include <gmock/gmock.h>
#include <zlib.h>

namespace ht::test {
namespace {

using ::testing::HasSubstr;

TEST(Sampler, EachEpochIsAPermutationAndEpochsDiffer) {
  Sampler s(100, 10, 7, true);
  EXPECT_EQ(s.batches_per_epoch(), 10);
  std::vector<at::Tensor> epoch0, epoch1;
  for (int i = 0; i < 10; ++i) epoch0.push_back(s.next());
  for (int i = 0; i < 10; ++i) epoch1.push_back(s.next());
  const at::Tensor a = at::cat(epoch0), b = at::cat(epoch1);
  EXPECT_TRUE(std::get<0>(a.sort()).equal(at::arange(100, at::kLong)));
  EXPECT_FALSE(a.equal(b));
  EXPECT_EQ(s.position().epoch, 1);
}

TEST(Sampler, SameSeedSameOrderAndSeekResumesExactly) {
  Sampler a(50, 8, 3, true), b(50, 8, 3, true);
  std::vector<at::Tensor> from_a;
  for (int i = 0; i < 9; ++i) from_a.push_back(a.next());  // crosses an epoch (6 per epoch)
  for (int i = 0; i < 4; ++i) b.next();
  Sampler resumed(50, 8, 3, true);
  resumed.seek(b.position());
  for (int i = 4; i < 9; ++i) EXPECT_TRUE(resumed.next().equal(from_a[i])) << "batch " << i;
}

TEST(Sampler, RanksSplitTheSameGlobalBatches) {
  Sampler single(64, 16, 5, true), r0(64, 16, 5, true, 0, 2), r1(64, 16, 5, true, 1, 2);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(at::cat({r0.next(), r1.next()}).equal(single.next()));
}

TEST(Sampler, NoShuffleIsInOrderAndTooSmallDatasetIsAUserError) {
  Sampler s(10, 5, 1, false);
  EXPECT_TRUE(s.next().equal(at::arange(5, at::kLong)));
  EXPECT_THROW(Sampler(4, 5, 1, true), UserError);
}

TEST(Datasets, SyntheticImagesAreDeterministicTexturesOfEveryClass) {
  TempDir dir;
  const std::string file = dir.write("s.toml", R"([model]
name = "mlp"
[data]
dataset = "synthetic"
synthetic_samples = 64
synthetic_eval_samples = 16
synthetic_shape = [2, 4, 4]
synthetic_classes = 3
)");
  const Config c = load_config(file, {}).config;
  DataSplits a = make_datasets(c), b = make_datasets(c);
  EXPECT_EQ(a.train->size(), 64);
  EXPECT_EQ(a.eval->size(), 16);
  EXPECT_EQ(a.info.sample_shape, (std::vector<int64_t>{2, 4, 4}));
  const Batch x = a.train->slice(0, 64), y = b.train->slice(0, 64);
  EXPECT_TRUE(x.input.equal(y.input));
  EXPECT_TRUE(x.target.equal(y.target));
  EXPECT_GT(std::get<0>(at::_unique(x.target)).size(0), 1) << "more than one class occurs";
}

TEST(Datasets, SyntheticTokensFollowTheChain) {
  TempDir dir;
  const std::string file = dir.write("t.toml", R"([model]
name = "gpt"
block_size = 16
[data]
dataset = "synthetic"
synthetic_samples = 32
synthetic_eval_samples = 8
synthetic_classes = 11
)");
  DataSplits d = make_datasets(load_config(file, {}).config);
  const Batch b = d.train->slice(0, 32);
  EXPECT_EQ(b.input.sizes(), at::IntArrayRef({32, 16}));
  EXPECT_TRUE(b.input.narrow(1, 1, 15).equal(b.target.narrow(1, 0, 15))) << "target is the input shifted";
  EXPECT_LT(b.input.max().item<int64_t>(), 11);
  EXPECT_EQ(d.info.task, Task::kLanguageModel);
}

// GPT-2's vocabulary: a dense transition table would take 10 GB (and did, four ranks of it killed
// a 4-rank run); the chain keeps a few successors a token instead.
TEST(Datasets, SyntheticTokensAtARealVocabularyStaySmall) {
  TempDir dir;
  const std::string file = dir.write("t.toml", R"([model]
name = "gpt"
block_size = 32
[data]
dataset = "synthetic"
synthetic_samples = 16
synthetic_eval_samples = 4
synthetic_classes = 50257
)");
  CpuAllocationCounter& counter = CpuAllocationCounter::install();
  counter.reset_peak();
  DataSplits d;
  {
    DeviceMemoryScope counted;
    d = make_datasets(load_config(file, {}).config);
  }
  EXPECT_LT(counter.device_peak_bytes(), int64_t{64} << 20) << "no vocab x vocab table";
  const Batch b = d.train->slice(0, 16);
  EXPECT_TRUE(b.input.narrow(1, 1, 31).equal(b.target.narrow(1, 0, 31)));
  EXPECT_LT(b.input.max().item<int64_t>(), 50257);
  EXPECT_GT(std::get<0>(at::_unique(b.input)).size(0), 100) << "the chain moves through the vocabulary";
}

TEST(Datasets, TextCorpusWindowsAndVocabulary) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "abcab";
  const std::string file = dir.write("text.txt", text);
  const TextCorpus c = load_text_corpus(file, 10, 0.2);
  EXPECT_EQ(c.vocab_size, 3);
  EXPECT_EQ(c.train_inputs.size(1), 10);
  EXPECT_EQ(c.train_inputs.size(0), (800 - 1) / 10);
  EXPECT_EQ(c.eval_inputs.size(0), (200 - 1) / 10);
  EXPECT_TRUE(c.train_inputs[0].narrow(0, 1, 9).equal(c.train_targets[0].narrow(0, 0, 9)));
  EXPECT_THROW(load_text_corpus(dir.write("short.txt", "abc"), 10, 0.1), UserError);
}

TEST(Datasets, FashionMnistFromDebiansPackage) {
  if (!std::filesystem::exists(kDefaultFashionMnistDir)) {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed (" << kDefaultFashionMnistDir << ")";
  }
  const ImageSet test = load_fashion_mnist(kDefaultFashionMnistDir, "test");
  EXPECT_EQ(test.images.sizes(), at::IntArrayRef({10000, 1, 28, 28}));
  EXPECT_EQ(test.labels.bincount().sizes(), at::IntArrayRef({10}));
  EXPECT_NEAR(test.images.mean().item<double>(), 0.0, 0.05) << "normalized by the training set's statistics";
  EXPECT_THAT([&] {
    try {
      load_fashion_mnist(kDefaultFashionMnistDir, "validation");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  }(), HasSubstr("use 'train' or 'test'"));
}

TEST(Datasets, TruncatedIdxFileIsReported) {
  TempDir dir;
  // A valid header promising 10 images of 28x28 and only 5 bytes of pixels.
  const unsigned char header[] = {0, 0, 8, 3, 0, 0, 0, 10, 0, 0, 0, 28, 0, 0, 0, 28, 1, 2, 3, 4, 5};
  gzFile f = gzopen(dir.path("train-images-idx3-ubyte.gz").c_str(), "wb");
  gzwrite(f, header, sizeof(header));
  gzclose(f);
  try {
    load_fashion_mnist(dir.path(), "train");
    FAIL() << "a truncated file must be reported";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("train-images-idx3-ubyte.gz: truncated: expected 7840 bytes of data"));
  }
}

}  // namespace
}  // namespace ht::test
